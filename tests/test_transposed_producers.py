"""Transposed producers (compiler/inline_gathers.py: transposed_producers): an activation's gradient
of a channels-last tensor, laid out NCHW by the meta kernels, feeding a BatchNorm backward. With a
GPU judge the scheduler also tries it recomputed by its readers from the channels-last input,
inlined before reductions are split, and keeps that schedule only when it is faster. A fake timer
stands in for the GPU here; both schedules run under Triton's interpreter against eager."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from client.runtime import load
from compiler.artifact import build_artifact
from compiler.benchmark_fusion import FusionBenchmarker
from compiler.codegen import generate
from compiler.fx_import import from_fx, run_eager
from compiler.graph import ITEMSIZES
from compiler.inline_gathers import transposed_producers
from compiler.lowering import lower
from compiler.options import CompileOptions
from compiler.scheduler import KernelGroup, schedule
from tests.compare import assert_within_eager_error

aten = torch.ops.aten
N, C, H, W = 8, 64, 8, 8  # the plain schedule splits one sum (over channels-last x) and not the other


def silu_batch_norm_backward(g, x, w, mean, invstd):
    """EfficientNet's squeeze-and-excitation tail, backward: a pooled gradient spread over the pixels,
    SiLU's gradient, then BatchNorm's."""
    spread = aten.div.Scalar(aten.expand.default(g, [N, C, H, W]), H * W)
    grad = aten.silu_backward.default(spread, x)
    return aten.native_batch_norm_backward.default(grad, x, w, None, None, mean, invstd, True, 1e-5, [True, True, True])


def _graph_and_inputs():
    torch.manual_seed(0)
    inputs = [torch.randn(N, C, 1, 1, dtype=torch.bfloat16),
              torch.randn(N, C, H, W, dtype=torch.bfloat16).to(memory_format=torch.channels_last),
              torch.randn(C), torch.randn(C), torch.rand(C) + 0.5]
    return from_fx(make_fx(silu_batch_norm_backward)(*inputs), inputs), inputs


def _scheduled(bytes_count: bool):
    """Schedules the graph with a fake GPU: a kernel takes as long as the bytes of the buffers it
    takes (`bytes_count`), or every kernel takes the same time."""
    graph, _ = _graph_and_inputs()
    program = lower(graph)
    silu = next(n.stores[0].buffer.name for n in program.nodes if n.origins == ["silu_backward"])

    def timer(kernel, sizes):
        return sum(sizes[b][0] * ITEMSIZES[sizes[b][1]] for b in kernel.arguments) / 1e6 if bytes_count else 1.0

    return schedule(program, CompileOptions(), FusionBenchmarker("cuda:sm_90", CompileOptions(), timer)), silu


def test_the_silu_gradient_is_a_transposed_producer_and_only_with_a_judge_is_anything_tried():
    graph, _ = _graph_and_inputs()
    assert [n.origins for n in transposed_producers(lower(graph))] == [["silu_backward"]]
    plain = schedule(lower(graph), CompileOptions())  # no GPU: the schedule of before, nothing timed
    assert not plain.fusion_log["benchmarked"]


def test_inlined_it_is_kept_when_faster_and_its_reductions_read_only_channels_last():
    scheduled, silu = _scheduled(bytes_count=True)
    decision = next(d for d in scheduled.fusion_log["benchmarked"] if d["why_benchmarked"].startswith("transposed"))
    assert decision["fused"] is True and decision["fused_ms"] < sum(decision["unfused_ms"])
    groups = [s for s in scheduled.steps if isinstance(s, KernelGroup)]
    assert silu not in {st.buffer.name for g in groups for n in g.nodes for st in n.stores}
    # both sums split alike into one kernel, their final pass, and the apply as a 2D-tiled pointwise kernel
    assert [(g.is_reduction, g.tiled) for g in groups] == [(True, False), (True, False), (False, True)]


def test_stored_it_is_kept_when_inlining_is_not_faster():
    """A tie keeps the schedule of before."""
    scheduled, silu = _scheduled(bytes_count=False)
    decision = next(d for d in scheduled.fusion_log["benchmarked"] if d["why_benchmarked"].startswith("transposed"))
    assert decision["fused"] is False
    groups = [s for s in scheduled.steps if isinstance(s, KernelGroup)]
    assert silu in {st.buffer.name for g in groups for n in g.nodes for st in n.stores}


def test_both_schedules_match_eager():
    """Within Inductor's rule: recomputed, SiLU's gradient stays in float32 where eager rounds it to
    bf16 before BatchNorm's sums."""
    graph, inputs = _graph_and_inputs()
    eager = run_eager(graph, inputs)
    reference = run_eager(graph, [t.double() if t.dtype.is_floating_point else t for t in inputs])
    for bytes_count in (True, False):
        scheduled, _ = _scheduled(bytes_count)
        artifact = build_artifact(graph, "cpu", CompileOptions(), generate(scheduled, "cpu"))
        for i, (got, want, ref) in enumerate(zip(load(artifact)(*inputs), eager, reference)):
            assert_within_eager_error(got, want, ref, f"bytes_count={bytes_count} output {i}")
