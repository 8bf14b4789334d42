"""Mixed-order reductions (compiler.mixed_order): a LayerNorm backward's row sums (the input
gradient) and column sums (the weight and bias gradients) in one kernel, whose programs walk their
rows in steps and sum the columns across the steps; a second kernel adds the programs' partials.
Checked against eager on the CPU interpreter, with the thresholds lowered to test sizes (on a GPU
a kernel needs 2^20 elements and 256 programs), and at BERT's size on the GPU target's schedule."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from compiler import mixed_order
from compiler.autotune import candidate_configs
from compiler.benchmark_fusion import _trial_variants
from compiler.bounds import WorkLimits
from compiler.codegen import generate
from compiler.codegen.plan import launch_grid
from compiler.fx_import import from_fx
from compiler.lowering import lower
from compiler.options import CompileOptions
from compiler.scheduler import KernelGroup, schedule
from tests.lowering_cases import check


def compile_and_check(fn, *inputs):
    """Compiled on the CPU interpreter; float outputs within twice eager's error against float64."""
    return check(fn, *inputs, reference64=True).artifact


@pytest.fixture
def small_thresholds(monkeypatch):
    monkeypatch.setattr(mixed_order, "MIX_MIN_PROGRAMS", 4)
    monkeypatch.setattr(mixed_order, "MIX_MIN_ELEMENTS", 1)


def layer_norm_backward(dy, x, mean, rstd, w, b):
    """Gradients of a LayerNorm over the last dim (input, weight, bias), as a training step's
    backward sees it: the forward's mean and rstd saved."""
    return torch.ops.aten.native_layer_norm_backward(dy, x, [x.shape[-1]], mean, rstd, w, b, [True, True, True])


def residual_layer_norm_backward(dy, residual, x, mean, rstd, w, b):
    """BERT's: the incoming gradient is the sum of two branches."""
    return layer_norm_backward(dy + residual, x, mean, rstd, w, b)


def _saved(x, w, b):
    """x, the forward's mean and rstd, w, b."""
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [x.shape[-1]], w, b, 1e-5)
    return x, mean, rstd, w, b


def rms_norm_backward(dy, x, w):
    """LLaMA's RMSNorm written out: the weight gradient sums dy * x * rstd over rows, the input
    gradient needs the row sum of dy * w * x."""
    rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
    dw = (dy * x * rstd).sum(0)
    g = dy * w
    dx = rstd * g - x * rstd.pow(3) * (g * x).mean(-1, keepdim=True)
    return dx, dw


def _groups(fn, *inputs, target: str = "cpu") -> list[KernelGroup]:
    graph = from_fx(make_fx(fn)(*inputs), list(inputs))
    planned = schedule(lower(graph, WorkLimits()), CompileOptions(autotune=False, benchmark_fusion=False), None)
    return [s for s in planned.steps if isinstance(s, KernelGroup)], planned


def _mixed(artifact) -> list[dict]:
    return [k for k in artifact.manifest["kernels"] if k["config"].get("mix_rows")]


@pytest.mark.parametrize("rows, length, chunk", [(64, 40, 16), (96, 300, 16), (128, 7, 32)])
def test_layer_norm_backward_is_a_mixed_kernel_and_a_final_sum(small_thresholds, rows, length, chunk):
    """Row lengths below and above a block's width (RBLOCK 64, 512, 8), row counts of a power of
    two and not (96 = 6 programs of 16); 300 takes 2 steps of 8 rows per program."""
    x, dy = torch.randn(rows, length), torch.randn(rows, length)
    w, b = torch.randn(length), torch.randn(length)
    artifact = compile_and_check(layer_norm_backward, dy, *_saved(x, w, b))
    assert len(artifact.manifest["kernels"]) == 2
    (mixed,) = _mixed(artifact)
    assert mixed["config"]["mix_rows"] == chunk
    assert chunk % mixed["config"]["XBLOCK"] == 0


def test_bf16_residual_layer_norm_backward_over_three_dims(small_thresholds):
    """[batch, tokens, hidden] in bf16: the column sums reduce two dims; the residual add stays in
    registers, read by both the row and the column sums."""
    shape = (4, 24, 48)
    dy, residual, x = (torch.randn(shape).to(torch.bfloat16) for _ in range(3))
    w, b = torch.randn(48).to(torch.bfloat16), torch.randn(48).to(torch.bfloat16)
    artifact = compile_and_check(residual_layer_norm_backward, dy, residual, *_saved(x, w, b))
    assert len(_mixed(artifact)) == 1 and len(artifact.manifest["kernels"]) == 2


def test_non_contiguous_inputs_stay_correct(small_thresholds):
    """Rows sliced out of wider ones (strides 50 and 61), as a split's pieces are."""
    dy = torch.randn(64, 50)[:, 5:45]
    x = torch.randn(64, 61)[:, :40]
    w, b = torch.randn(40), torch.randn(40)
    artifact = compile_and_check(layer_norm_backward, dy, *_saved(x, w, b))
    assert len(_mixed(artifact)) == 1


def test_rms_norm_backward_mixes(small_thresholds):
    dy, x, w = torch.randn(64, 36), torch.randn(64, 36), torch.randn(36)
    artifact = compile_and_check(rms_norm_backward, dy, x, w)
    assert len(_mixed(artifact)) == 1


def test_odd_row_counts_keep_separate_kernels(small_thresholds):
    """63 rows: no power of two of 8 rows or more divides them, so no program count fits."""
    x, dy = torch.randn(63, 40), torch.randn(63, 40)
    w, b = torch.randn(40), torch.randn(40)
    artifact = compile_and_check(layer_norm_backward, dy, *_saved(x, w, b))
    assert not _mixed(artifact)


def test_sums_of_unrelated_inputs_do_not_mix(small_thresholds):
    """A row sum of one tensor and a column sum of another share no input: nothing to save."""
    def sums(a, c):
        return a.sum(1), c.sum(0)

    a, c = torch.randn(64, 40), torch.randn(64, 40)
    groups, _ = _groups(sums, a, c)
    assert not any(g.mix_rows for g in groups)
    assert not _mixed(compile_and_check(sums, a, c))


def test_a_column_sum_of_a_row_result_does_not_mix(small_thresholds):
    """The column sum reads the row sums' result, which is whole only after each row's step, but
    its partial pass would have to run beside the row reduction on the same tile: not a mix."""
    def normalized_column_sum(a):
        return (a / a.sum(1, keepdim=True)).sum(0)

    a = torch.rand(64, 40) + 0.5
    compile_and_check(normalized_column_sum, a)


def test_bert_sized_layer_norm_backward_schedules_one_mixed_kernel_for_the_gpu():
    """At BERT's 4096 x 768 with the real thresholds: 512 programs of 8 rows, the weight and bias
    gradients' partials in the row kernel, their final sums in one more kernel."""
    dy, x = torch.randn(4096, 768), torch.randn(4096, 768)
    w, b = torch.randn(768), torch.randn(768)
    groups, planned = _groups(layer_norm_backward, dy, *_saved(x, w, b))
    assert len(groups) == 2
    mixed = next(g for g in groups if g.mix_rows)
    assert (mixed.numel, mixed.rnumel, mixed.mix_rows, len(mixed.column_nodes)) == (4096, 768, 8, 2)
    kernel = next(k for k in generate(planned, "cuda:sm_90").kernels if k.name == mixed.name)
    assert kernel.config["mix_rows"] == 8 and kernel.config["persistent"]
    assert "for xstep in tl.range(0, 8, XBLOCK, num_stages=3):" in kernel.source  # loads two steps ahead
    # the weight and bias gradients' inputs are loaded once, for both reductions
    assert kernel.source.count("tl.load(ptr_") == 5  # dy, x, w, mean, rstd
    assert launch_grid(kernel.numel, kernel.rnumel, kernel.config) == [512, 1, 1]
    # autotuning and the fusion judge vary the rows per step and the warps, never the rows per program
    candidates = candidate_configs(kernel) + [kernel.config | v for v in _trial_variants(kernel)]
    assert len(candidates) > 4
    assert all(c["mix_rows"] == 8 and 8 % c["XBLOCK"] == 0 and c["persistent"] for c in candidates)


def test_small_layer_norms_stay_two_kernels_for_the_gpu():
    """64 x 40: a mixed kernel would have a handful of programs, far too few for a GPU."""
    dy, x = torch.randn(64, 40), torch.randn(64, 40)
    groups, _ = _groups(layer_norm_backward, dy, *_saved(x, torch.randn(40), torch.randn(40)))
    assert not any(g.mix_rows for g in groups)


def layer_norm_backward_and_next_bias(dy, x, mean, rstd, w, b):
    """Swin-v2's: the input gradient is also summed over the rows, for the bias of the layer before
    (a second column pass over the same rows, which reads what the row pass writes)."""
    dx, dw, db = layer_norm_backward(dy, x, mean, rstd, w, b)
    return dx, dw, db, dx.sum(0)


@pytest.mark.parametrize("rows, length", [(64, 40), (96, 33)])
def test_two_column_passes_over_the_same_rows_join_one_mixed_kernel(small_thresholds, rows, length):
    x, dy = torch.randn(rows, length), torch.randn(rows, length)
    w, b = torch.randn(length), torch.randn(length)
    artifact = compile_and_check(layer_norm_backward_and_next_bias, dy, *_saved(x, w, b))
    (mixed,) = _mixed(artifact)
    assert len(artifact.manifest["kernels"]) == 2  # the mixed kernel, one final pass for its three sums
