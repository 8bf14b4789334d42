"""A convolution's bias as fusable work, not as part of the ATen call (Inductor does the same).

On a GPU, ATen runs a convolution with a bias as the cuDNN convolution plus a separate
elementwise add, and its backward's bias gradient as a separate ATen reduction over the batch
and spatial dims: two extra launches per convolution that read and write the whole output. In
ConvNeXt-V2's training step (H100, 2026-11-27) they were 77 launches and 1.15 of fusewire's
4.70 ms of GPU time, where Inductor's step has neither.

Here the convolution runs without its bias and the bias is a broadcast add, which fuses into
what reads the convolution's output. The backward asks ATen for the input and weight gradients
only; the bias gradient is a sum over grad_output, lowered like any reduction, which fuses with
the other reductions and pointwise work on the same gradient. Both are what eager computes on a
GPU (an add of the bias after the convolution, a sum for its gradient), so results round as
eager's do.
"""

from __future__ import annotations

from typing import Any, Callable

from compiler.ir import Layout
from compiler.lowering.values import StorageView, TensorValue

CONVOLUTION = "aten.convolution.default"
CONVOLUTION_BACKWARD = "aten.convolution_backward.default"
TARGETS = frozenset({CONVOLUTION, CONVOLUTION_BACKWARD})

# lower(target, args) -> the lowered value of one ATen call
Lower = Callable[[str, list], Any]
# realize(value, layout) -> the value computed into a buffer of that layout
Realize = Callable[[TensorValue, Layout], StorageView]


def peel_bias(target: str, args: list, kwargs: dict, lower: Lower, realize: Realize) -> Any | None:
    """The convolution (or its backward) with the bias handled outside the ATen call; None when
    there is no bias to peel (the call stays as it is)."""
    if kwargs:
        return None
    if target == CONVOLUTION:
        return _forward(args, lower, realize)
    return _backward(args, lower)


def _forward(args: list, lower: Lower, realize: Realize) -> StorageView | None:
    if len(args) != 9 or not isinstance(args[2], TensorValue):
        return None
    weight, bias = args[1], args[2]
    output = lower(CONVOLUTION, [args[0], weight, None, *args[3:]])
    spatial_dims = len(weight.size) - 2
    shaped = lower("aten.view.default", [bias, [bias.size[0]] + [1] * spatial_dims])
    # in the layout the device gives the convolution (channels-last where cuDNN makes it so), as eager's
    # in-place add keeps it; the meta kernel's plan for the call with a bias says contiguous
    return realize(lower("aten.add.Tensor", [output, shaped]), output.layout)


def _backward(args: list, lower: Lower) -> Any | None:
    if len(args) != 11 or not isinstance(args[0], TensorValue) or not isinstance(args[10], (list, tuple)):
        return None
    grad_output, output_mask = args[0], list(args[10])
    if len(output_mask) != 3 or not output_mask[2]:
        return None
    reduced = [0] + list(range(2, len(grad_output.size)))  # ATen's convolutions take batched inputs only
    grad_bias = lower("aten.sum.dim_IntList", [grad_output, reduced, False])
    if not output_mask[0] and not output_mask[1]:
        return None, None, grad_bias
    grad_input, grad_weight, _ = lower(CONVOLUTION_BACKWARD, [*args[:10], [output_mask[0], output_mask[1], False]])
    return grad_input, grad_weight, grad_bias
