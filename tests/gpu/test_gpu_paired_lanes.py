"""On a GPU: pointwise kernels walked two outputs at a time (compiler/paired_lanes.py), whose
strided reads load aligned runs of 4 as vectors, run from their cubins under every candidate
config autotuning tries and match eager: ResNet's stride-2 max pool with eager's int64 indices,
on a contiguous input and on a view that starts one element into its storage, and a halving
average pool.

Skipped without CUDA (CPU CI); run on the device machine:
    python -m pytest -q tests/gpu
"""

from __future__ import annotations

import pytest
import torch

from tests.compare import assert_within_eager_error
from tests.gpu.forced_candidates import every_candidate

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def max_pool(x):
    return torch.ops.aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1])


def halving_pool(x):
    return torch.ops.aten.avg_pool2d(x, [2, 2], [2, 2])


def _inputs(case: str) -> list[torch.Tensor]:
    torch.manual_seed(0)
    if case == "offset view":
        return [torch.randn(4, 8, 30, 58, device="cuda", dtype=torch.bfloat16)[..., 1:57]]
    return [torch.randn(4, 8, 30, 56, device="cuda", dtype=torch.bfloat16)]


@pytest.mark.parametrize("fn, case", [(max_pool, "contiguous"), (max_pool, "offset view"),
                                      (halving_pool, "contiguous")],
                         ids=lambda value: getattr(value, "__name__", str(value)))
def test_every_paired_candidate_matches_eager(fn, case):
    inputs = _inputs(case)
    eager = fn(*inputs)
    eager = eager if isinstance(eager, tuple) else (eager,)
    reference = fn(inputs[0].double())
    reference = reference if isinstance(reference, tuple) else (reference,)
    for config, got in every_candidate(fn, inputs, "lanes"):
        if fn is max_pool:  # the maximum and its position exactly
            assert all(torch.equal(g, e) for g, e in zip(got, eager)), f"{case} under {config}"
        else:
            assert_within_eager_error(got[0].float(), eager[0].float(), reference[0], f"{case} under {config}")
