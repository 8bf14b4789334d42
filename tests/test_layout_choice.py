"""A realized intermediate nobody outside sees is laid out as its loads walk, not as eager lays it
out (compiler/lowering/layout_choice.py), while every graph output keeps the strides of the meta
kernels' eager (those of the switch turned off: for a few ops, such as a BatchNorm backward, a
CPU's eager kernel picks another layout than the meta kernel plans)."""

from __future__ import annotations

import pytest
import torch

from torch.fx.experimental.proxy_tensor import make_fx

from compiler.fx_import import from_fx
from compiler.lowering import layout_choice, lower
from tests.lowering_cases import check, rand

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on masked-off lanes


def channels_last(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return rand(shape, seed=seed).contiguous(memory_format=torch.channels_last)


def computed_buffers(artifact, size: list[int]) -> list[list[int]]:
    """The strides of the artifact's kernel-written buffers of this size that are no graph output."""
    outputs = {o["buffer"] for o in artifact.plan["outputs"]}
    return [b["stride"] for name, b in artifact.plan["buffers"].items()
            if b["size"] == size and name not in outputs and not name.startswith("arg")]


def lowered_strides(fn, inputs, size: list[int]) -> list[list[int]]:
    """The strides of every kernel-computed buffer of this size lowering makes, before fusion
    removes the ones only kernels read."""
    program = lower(from_fx(make_fx(fn)(*inputs), inputs))
    return [list(b.layout.stride) for b in program.buffers.values()
            if b.kind == "computed" and list(b.layout.size) == size]


def check_both_ways(monkeypatch, fn, *inputs, **kwargs):
    """`check` with the switch on, and the outputs' strides against those the switch off gives."""
    result = check(fn, *inputs, **kwargs)
    with monkeypatch.context() as patch:
        patch.setattr(layout_choice, "LAYOUT_FOLLOWS_LOADS", False)
        off = check(fn, *inputs, **kwargs)
    for i, (got, want) in enumerate(zip(result.outputs, off.outputs)):
        assert all(size == 1 or a == b for size, a, b in zip(got.shape, got.stride(), want.stride())), \
            f"output {i}: strides {got.stride()}, with eager's layouts inside {want.stride()}"
    return result, off


def slice_gradient_batch_norm_backward(grad, other, x, weight, mean, invstd):
    """ReXNet: a gradient assembled from two channel slices (slice_backward writes them NCHW) feeds a
    BatchNorm backward of a channels-last input."""
    g = grad[:, :7] + other
    head = torch.ops.aten.slice_backward(g[:, :5], list(other.shape), 1, 0, 5, 1)
    tail = torch.ops.aten.slice_backward(g[:, 5:], list(other.shape), 1, 5, 7, 1)
    summed = head + tail
    out = torch.ops.aten.native_batch_norm_backward(summed, x, weight, None, None, mean, invstd, True, 1e-5,
                                                   [True, True, True])
    return g[:, :5], *out


def batch_norm_backward_inputs():
    """Sizes at which the gradient is a buffer between kernels (at smaller ones one kernel does it all)."""
    return (channels_last((4, 9, 33, 37), seed=1), channels_last((4, 7, 33, 37), seed=2),
            channels_last((4, 7, 33, 37), seed=3), rand((7,), seed=4),
            rand((7,), seed=5), rand((7,), seed=6, low=0.5, high=2.0))


def test_a_gradient_assembled_from_channel_slices_lies_channels_last_inside_and_outputs_keep_eager_strides(
        monkeypatch):
    result, off = check_both_ways(monkeypatch, slice_gradient_batch_norm_backward, *batch_norm_backward_inputs())
    assert result.outputs[1].is_contiguous()  # the meta kernel's input gradient is NCHW: the output stays so
    assert computed_buffers(result.artifact, [4, 7, 33, 37]) == [[8547, 1, 259, 7]]
    assert computed_buffers(off.artifact, [4, 7, 33, 37]) == [[8547, 1221, 37, 1]]


def test_results_after_a_chosen_layout_see_eager_strides_through_views_and_aten_calls(monkeypatch):
    """The channels-last intermediate feeds a reshape (the view of another layout is an index
    remap), a matmul (an ATen call reading it as it lies) and a pointwise graph output: each output
    has eager's strides and values."""
    def fn(grad, other, w):
        padded = torch.ops.aten.slice_backward(grad[:, :4] * 2, list(other.shape), 1, 0, 4, 1)
        mixed = padded + other  # eager: NCHW; its loads: channels-last
        doubled = mixed * 3  # read by the view and the matmul below
        flat = doubled.view(doubled.shape[0], -1)
        return flat, flat @ w, doubled.sum((2, 3)), mixed.relu()

    inputs = (channels_last((2, 6, 3, 5), seed=7), channels_last((2, 5, 3, 5), seed=8), rand((75, 4), seed=9))
    result, _ = check_both_ways(monkeypatch, fn, *inputs, expect_no_extern=False)
    # `padded` and `mixed` lie channels-last; `doubled` (read by a view) and relu's output as eager lays them
    assert lowered_strides(fn, inputs, [2, 5, 3, 5]) == [[75, 1, 25, 5], [75, 1, 25, 5], [75, 15, 5, 1], [75, 15, 5, 1]]


def test_loads_that_disagree_leave_eager_layout():
    def fn(a, b):
        t = torch.ops.aten.slice_backward(a, [4, 6, 5], 1, 0, 6, 1) + b  # a row-major, b transposed
        return (t * t).sum(1)

    a = rand((4, 6, 5), seed=10)
    b = rand((4, 5, 6), seed=11).transpose(1, 2)
    check(fn, a, b)
    assert lowered_strides(fn, (a, b), [4, 6, 5]) == [[30, 5, 1]] * 3


def test_a_graph_output_keeps_eager_layout_even_where_its_loads_walk_otherwise(monkeypatch):
    def fn(grad, other):
        return torch.ops.aten.slice_backward(grad, list(other.shape), 1, 0, 4, 1) + other

    result, _ = check_both_ways(monkeypatch, fn, channels_last((2, 4, 3, 5), seed=12),
                                channels_last((2, 6, 3, 5), seed=13))
    assert result.outputs[0].is_contiguous()
