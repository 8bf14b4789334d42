"""Pipelined loops (launch config "loop_stages", codegen.group.loop_header): a looped or mixed-order
reduction whose loads Triton's pipeliner issues steps ahead. Every kernel here is written with
its loop pipelined and run under the interpreter against eager (float64 rule; seeded data), and built
for sm_90. Kernels only written, never run, trace uninitialized tensors."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import compiler
from compiler import codegen, mixed_order
from compiler.autotune import candidate_configs, needs_own_source
from compiler.codegen import generate, heuristics
from compiler.explain import describe
from compiler.fx_import import from_fx
from compiler.lowering import lower
from compiler.options import CompileOptions
from compiler.scheduler import schedule
from tests.lowering_cases import check, rand

HEURISTIC = {"autotune": False, "benchmark_fusion": False}


@pytest.fixture(params=[2, 3])
def pipelined(monkeypatch, request):
    """Every kernel's heuristic config asks for its loop's loads `request.param` steps ahead."""
    heuristic = codegen.launch_config
    monkeypatch.setattr(codegen, "launch_config",
                        lambda shape, target: heuristic(shape, target) | {"loop_stages": request.param})
    monkeypatch.setattr(mixed_order, "MIX_MIN_PROGRAMS", 4)
    monkeypatch.setattr(mixed_order, "MIX_MIN_ELEMENTS", 1)
    return request.param


def _pipelined_kernels(artifact) -> list[dict]:
    kernels = [k for k in artifact.manifest["kernels"] if "tl.range(" in artifact.kernel_source(k)]
    assert all(k["config"]["loop_stages"] > 1 for k in kernels)
    return kernels


def layer_norm_backward(dy, x, w, b):
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [x.shape[-1]], w, b, 1e-5)
    return torch.ops.aten.native_layer_norm_backward(dy, x, [x.shape[-1]], mean, rstd, w, b, [True, True, True])


def test_a_mixed_order_layer_norm_backward_runs_pipelined(pipelined):
    """96 rows of 40: 6 programs of 16 rows, several steps each; bf16 rows read and written."""
    dy, x = rand((96, 40), torch.bfloat16, seed=1), rand((96, 40), torch.bfloat16, seed=2)
    w, b = rand((40,), torch.bfloat16, seed=3), rand((40,), torch.bfloat16, seed=4)
    artifact = check(layer_norm_backward, dy, x, w, b, reference64=True).artifact
    mixed = [k for k in _pipelined_kernels(artifact) if k["config"].get("mix_rows")]
    assert mixed and f"num_stages={pipelined}" in artifact.kernel_source(mixed[0])


@pytest.mark.parametrize("columns", [3000, 2999])
def test_a_looped_softmax_runs_pipelined_over_aligned_and_misaligned_rows(pipelined, columns):
    """Rows longer than the CPU's persistent limit loop; sliced out of rows of 3001, they start
    misaligned and walk row windows (a masked first step, unmasked middle steps, a masked last)."""
    x = rand((5, 3001), seed=1)[:, 1:columns + 1]
    artifact = check(lambda a: torch.softmax(a, -1), x, reference64=True).artifact
    assert _pipelined_kernels(artifact)


def test_a_looped_column_sum_and_a_batch_norm_run_pipelined(pipelined, monkeypatch):
    """The CPU target loops only rows past its persistent limit: lowered here, so that the column
    sum's pieces and the BatchNorm's statistics (2668 elements per channel) loop."""
    monkeypatch.setattr(heuristics, "CPU_PERSISTENT_LIMIT", 16)
    x = rand((3000, 7), seed=1)
    assert _pipelined_kernels(check(lambda a: a.sum(0), x, reference64=True).artifact)
    images, weight, bias = rand((4, 3, 23, 29), seed=1), rand((3,), seed=2), rand((3,), seed=3)
    batch_norm = lambda a, w, b: torch.nn.functional.batch_norm(a, None, None, w, b, training=True)
    assert _pipelined_kernels(check(batch_norm, images, weight, bias, reference64=True).artifact)


def test_pipelined_kernels_build_for_sm_90(pipelined):
    """The pipeliner lowers the loops to cubins, loads through shared memory."""
    dy, x = torch.randn(4096, 768).to(torch.bfloat16), torch.randn(4096, 768).to(torch.bfloat16)
    w, b = torch.randn(768).to(torch.bfloat16), torch.randn(768).to(torch.bfloat16)
    graph = from_fx(make_fx(layer_norm_backward)(dy, x, w, b), [dy, x, w, b])
    artifact = compiler.compile(graph, "cuda:sm_90", HEURISTIC)
    kernels = _pipelined_kernels(artifact)
    assert any(k["config"].get("mix_rows") for k in kernels)
    assert all(artifact.files[k["cubin"]] for k in kernels)
    assert f"loads {pipelined - 1} step" in describe(artifact)


def _kernels(fn, *inputs):
    graph = from_fx(make_fx(fn)(*inputs), list(inputs))
    return generate(schedule(lower(graph), CompileOptions()), "cuda:sm_90").kernels


def test_a_mixed_kernel_tries_each_step_shape_with_its_loads_ahead_and_not():
    """Rows of 768 start two steps ahead (heuristics.MIXED_MID_ROWS_STAGES); autotuning tries the
    heuristic's step with a plain loop and one or two steps ahead, steps of up to two rows plain and
    one step ahead, longer steps plain, each written anew."""
    dy, x = torch.randn(4096, 768), torch.randn(4096, 768)
    w, b = torch.randn(768), torch.randn(768)
    mixed = next(k for k in _kernels(layer_norm_backward, dy, x, w, b) if k.config.get("mix_rows"))
    assert mixed.pipelinable and mixed.config["loop_stages"] == 3 and "num_stages=3" in mixed.source
    candidates = candidate_configs(mixed, can_regenerate=True)
    shapes = {(c["XBLOCK"], c["num_warps"]) for c in candidates}
    assert any(x > 2 for x, _ in shapes)
    for shape in shapes:
        tried = {c.get("loop_stages", 1) for c in candidates if (c["XBLOCK"], c["num_warps"]) == shape}
        own = shape == (mixed.config["XBLOCK"], mixed.config["num_warps"])
        assert tried == ({1, 2, 3} if own else {1, 2} if shape[0] <= 2 else {1}), shape
    plain = [c for c in candidates if "loop_stages" not in c]
    assert plain and all(needs_own_source(c, mixed.config) for c in plain)
    assert all(c.get("loop_stages", 3) == 3 for c in candidate_configs(mixed))  # without a new source, as written


@pytest.mark.parametrize("rows, length, ahead", [
    (4096, 768, 3),    # BERT's: 512 programs of 8 rows
    (8192, 768, 3),    # GPT-2's: 512 programs of 16 rows
    (25088, 384, 3),   # Swin's: 784 programs of 32 rows, 16 steps
    (6304, 768, 1),    # ViT's: 788 programs of 8 rows, 4 steps: a second wave
])
def test_a_mixed_kernel_starts_pipelined_where_its_grid_fits_one_wave_or_it_walks_many_steps(rows, length, ahead):
    dy, x = torch.randn(rows, length), torch.randn(rows, length)
    w, b = torch.randn(length), torch.randn(length)
    mixed = next(k for k in _kernels(layer_norm_backward, dy, x, w, b) if k.config.get("mix_rows"))
    assert mixed.config.get("loop_stages", 1) == ahead


def test_looped_rows_may_pipeline_but_are_not_tried_so():
    """Looped row and column reductions gained under 1 % from it (autotune.MIXED_LOOP_STAGES)."""
    kernels = _kernels(lambda a: torch.softmax(a, -1), torch.empty(4096, 50257))
    looped = next(k for k in kernels if k.rnumel > 1 and not k.config["persistent"])
    assert looped.pipelinable
    assert not any(c.get("loop_stages") for c in candidate_configs(looped, can_regenerate=True))
    persistent = _kernels(lambda a: torch.softmax(a, -1), torch.randn(64, 500))[0]
    assert persistent.config["persistent"] and not persistent.pipelinable


def test_a_loop_that_stores_what_it_loads_is_never_pipelined():
    """An in-place update of its own input (x -= its row sums, looped): a load issued steps ahead
    could meet a step's store, so the kernel keeps a plain loop."""
    def subtract_row_sums(x):
        sums = x.sum(-1, keepdim=True)
        x.sub_(sums)
        return sums

    kernels = _kernels(subtract_row_sums, torch.empty(4096, 50257))
    stores_input = [k for k in kernels if k.rnumel > 1 and not k.config["persistent"] and "arg0" in k.arguments and
                    "tl.store(ptr_arg0" in k.source]
    assert stores_input
    for kernel in stores_input:
        assert not kernel.pipelinable
        assert not any(c.get("loop_stages") for c in candidate_configs(kernel, can_regenerate=True))
