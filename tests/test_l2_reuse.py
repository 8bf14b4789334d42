"""Kernels that reread a large buffer start where L2 still holds it (compiler/l2_reuse.py): the
direction each kernel numbers its programs in, the eviction policy of loads a later kernel reads
again, and results unchanged by either (run under Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import compiler.l2_reuse as l2_reuse
from compiler.codegen import generate
from compiler.fx_import import from_fx
from compiler.lowering import lower
from compiler.options import CompileOptions
from compiler.scheduler import schedule
from tests.test_scheduler import compile_and_check

REVERSED = "(tl.num_programs(0) - 1 - tl.program_id(0))"


def batch_norm_forward(x, w, b, mean, var):
    return F.batch_norm(x, mean, var, w, b, training=True)


def bn_inputs(shape):
    channels = shape[1]
    return [torch.randn(shape), torch.randn(channels), torch.randn(channels), torch.randn(channels),
            torch.rand(channels) + 0.5]


def kernels_reading(fn, inputs, buffer="arg0"):
    """(source, arguments) of the GPU kernels of fn that read `buffer`, in launch order."""
    graph = from_fx(make_fx(fn)(*inputs), inputs)
    kernels = generate(schedule(lower(graph), CompileOptions()), "cuda:sm_90").kernels
    return [(k.source, k.arguments) for k in kernels if buffer in k.arguments]


def test_the_normalize_pass_of_a_batch_norm_starts_where_its_statistics_pass_ended():
    # 32 x 64 x 112 x 112 float32: 103 MB, read by the statistics pass and again by the normalize pass
    readers = kernels_reading(batch_norm_forward, bn_inputs((32, 64, 112, 112)))
    assert len(readers) == 2
    (statistics, _), (normalize, _) = readers
    # the first reader walks the input front to back, the second starts at its tail
    assert REVERSED not in statistics and REVERSED in normalize
    # the statistics pass must not stream out of L2 what the normalize pass reads next
    input_loads = [line for line in statistics.splitlines() if "tl.load(ptr_arg0" in line]
    assert input_loads and not any("evict_first" in line for line in input_loads)


def batch_norm_backward(grad, x, w, b, mean, var):
    x = x.detach().requires_grad_(True)
    w = w.detach().requires_grad_(True)
    return torch.autograd.grad(batch_norm_forward(x, w, b, mean, var), (x, w), grad)


def test_only_kernels_that_reread_more_than_l2_keeps_anyway_are_reversed():
    # ResNet's 32 x 64 x 56 x 56 bf16 BatchNorm: its forward rereads 12.8 MB (the input), which
    # stays in L2 whichever way; its backward rereads 25.7 MB (the gradient and the input)
    shape = (32, 64, 56, 56)
    inputs = [t.to(torch.bfloat16) for t in bn_inputs(shape)]
    forward = kernels_reading(batch_norm_forward, inputs)
    assert len(forward) == 2 and not any(REVERSED in source for source, _ in forward)
    backward = kernels_reading(batch_norm_backward, [torch.randn(shape, dtype=torch.bfloat16)] + inputs)
    assert [REVERSED in source for source, _ in backward] == [False, True]


def test_the_switch_turns_it_off(monkeypatch):
    monkeypatch.setattr(l2_reuse, "REVERSE_REREADS", False)
    readers = kernels_reading(batch_norm_forward, bn_inputs((32, 64, 112, 112)))
    assert not any(REVERSED in source for source, _ in readers)
    statistics = readers[0][0]
    assert any("evict_first" in line for line in statistics.splitlines() if "tl.load(ptr_arg0" in line)


def layer_norm_backward(grad, x, w, b):
    x = x.detach().requires_grad_(True)
    w = w.detach().requires_grad_(True)
    out = F.layer_norm(x, (x.shape[-1],), w, b)
    return torch.autograd.grad(out, (x, w), grad)


@pytest.mark.parametrize("case", ["batch_norm", "batch_norm_channels_last", "layer_norm_backward"])
def test_kernels_numbered_back_to_front_compute_what_eager_does(case, monkeypatch):
    monkeypatch.setattr(l2_reuse, "REREAD_MIN_BYTES", 0)  # every buffer counts as large
    if case == "layer_norm_backward":
        fn = layer_norm_backward
        inputs = [torch.randn(37, 53), torch.randn(53, 37).t(), torch.randn(53), torch.randn(53)]
    else:
        fn, inputs = batch_norm_forward, bn_inputs((8, 3, 64, 65))  # split: three kernels
        if case == "batch_norm_channels_last":
            inputs[0] = inputs[0].contiguous(memory_format=torch.channels_last)
    artifact = compile_and_check(fn, *inputs)
    assert any(REVERSED in artifact.kernel_source(k) for k in artifact.manifest["kernels"])
