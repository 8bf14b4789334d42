"""A fast subset of the OpInfo sweep (bench/opinfo_sweep.py: PyTorch's own op test database, float32
and bfloat16, forward and backward) in CI: the ops a training step meets, and every op the full sweep
once found wrong or crashing. No sample may be wrong or crash; the ops Inductor lowers to kernels
(reductions, also over 0-d tensors, gathers, norms, losses...) must compile with no ATen call."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from opinfo_sweep import all_ops, cases, run_case  # noqa: E402

SAMPLES = 2
FUSED = [  # every sample: correct, and one kernel group or more with no extern call
    "sum", "mean", "amax", "amin", "argmax", "argmin", "any", "all", "logsumexp", "count_nonzero", "var_mean",
    "std", "gather", "scatter_add", "take_along_dim", "nn.functional.layer_norm", "nn.functional.batch_norm",
    "nn.functional.group_norm", "nn.functional.rms_norm", "native_batch_norm", "native_layer_norm",
    "nn.functional.cross_entropy", "nn.functional.nll_loss", "nn.functional.mse_loss",
    "nn.functional.binary_cross_entropy_with_logits", "softmax", "log_softmax", "cumsum", "where", "clamp",
    "masked_fill", "cat", "stack", "nn.functional.gelu", "nn.functional.silu", "dist", "resize_",
    "nn.functional.avg_pool2d",
]
CORRECT = [  # every sample correct, ATen calls allowed: each was once wrong or crashed in the sweep
    "nn.functional.linear_cross_entropy", "quantile", "nanquantile", "fft.rfft", "fft.ifft", "fft.ihfft2", "linalg.inv",
    "diagonal", "stft", "_native_batch_norm_legit", "_batch_norm_with_update", "nn.functional.embedding_bag",
    "index_select", "index_add", "scatter", "prod", "nn.functional.embedding", "pow",
    "nn.functional.feature_alpha_dropout.with_train", "bernoulli", "linalg.cond", "linalg.vector_norm",
    "nn.functional.conv2d", "nn.functional.conv_transpose2d",  # their biases are kernels (lowering/convolution_bias.py)
]
OPS = all_ops()


def outcomes(name: str) -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [run_case(OPS[name], *case) for case in cases(OPS[name], SAMPLES)]


@pytest.mark.parametrize("name", FUSED)
def test_op_compiles_to_kernels_and_is_correct(name):
    results = [r for r in outcomes(name) if r.outcome != "skipped"]
    assert results
    bad = [f"{r.dtype} {r.direction} #{r.sample}: {r.outcome} {r.detail}" for r in results if r.outcome != "fused"]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("name", CORRECT)
def test_op_is_correct(name):
    results = [r for r in outcomes(name) if r.outcome != "skipped"]
    assert results
    bad = [f"{r.dtype} {r.direction} #{r.sample}: {r.outcome} {r.detail}" for r in results
           if r.outcome not in ("fused", "extern")]
    assert not bad, "\n".join(bad)


def test_the_sweep_names_an_unknown_op_instead_of_dropping_the_rest():
    import subprocess

    sweep = Path(__file__).resolve().parents[2] / "bench" / "opinfo_sweep.py"
    result = subprocess.run([sys.executable, str(sweep), "--ops", "abs,nn.functional.fold"], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 2 and "nn.functional.fold" in result.stderr
