"""Pooling windows as pointwise work: each output element reads its window of the input with
masked loads (positions in the padding or past the edge read as -inf), so the pool fuses with
what produces its input and what consumes its output instead of running as an ATen call.

Its backward is pointwise over the input too: each element gathers the gradients of the few
windows that chose it (no scatter, no atomics).

max_pool2d_with_indices follows ATen's rule for ties and NaN: the first maximum of the window in
row-major order wins, a NaN wins over any number (the last NaN of the window), and a window with
nothing above -inf reports its first position inside the input.
"""

from __future__ import annotations

from typing import Any, Sequence

from compiler.indexing import FloorDiv
from compiler.lowering.context import LoweringContext
from compiler.lowering.registry import register
from compiler.lowering.values import Lazy, TensorValue, compute_dtype

MAX_WINDOW = 64  # positions per window unrolled into the kernel; larger windows stay ATen calls


def _pair(value: Any, default: Sequence[int] | None = None) -> tuple[int, int]:
    if value is None or (isinstance(value, (list, tuple)) and len(value) == 0):
        value = default
    if isinstance(value, int):
        return value, value
    return (value[0], value[0]) if len(value) == 1 else (value[0], value[1])


@register("aten.max_pool2d_with_indices.default")
def max_pool2d_with_indices(ctx: LoweringContext, x: TensorValue, kernel_size: Sequence[int],
                            stride: Sequence[int] | None = None, padding: Any = 0, dilation: Any = 1,
                            ceil_mode: bool = False) -> tuple[Lazy, Lazy]:
    kh, kw = _pair(kernel_size)
    sh, sw = _pair(stride, (kh, kw))
    ph, pw = _pair(padding)
    dh, dw = _pair(dilation)
    if kh * kw > MAX_WINDOW or x.rank not in (3, 4):
        raise NotImplementedError(f"a {kh}x{kw} window over a rank-{x.rank} input: run it as an ATen call")
    height, width = x.size[-2], x.size[-1]
    dtype = compute_dtype(x.dtype)
    out_size = tuple(ctx.out_meta[0].shape)

    def window(ops, index):
        """(max, flat index of the max in the input's H x W plane) of the window at `index`."""
        oh, ow = index[-2], index[-1]
        best = ops.constant(float("-inf"), dtype)
        first_h = ops.maximum(ops.index_expr(oh * sh - ph, "int64"), ops.constant(0, "int64"))
        first_w = ops.maximum(ops.index_expr(ow * sw - pw, "int64"), ops.constant(0, "int64"))
        where = ops.add(ops.mul(first_h, ops.constant(width, "int64")), first_w)
        for i in range(kh):
            for j in range(kw):
                h, w = oh * sh - ph + i * dh, ow * sw - pw + j * dw
                hv, wv = ops.index_expr(h, "int64"), ops.index_expr(w, "int64")
                inside = ops.logical_and(
                    ops.logical_and(ops.ge(hv, ops.constant(0, "int64")), ops.lt(hv, ops.constant(height, "int64"))),
                    ops.logical_and(ops.ge(wv, ops.constant(0, "int64")), ops.lt(wv, ops.constant(width, "int64"))))
                position = list(index[:-2]) + [h, w]
                value = ops.masked(inside, lambda position=position: ops.to_dtype(x.load(ops, position), dtype),
                                   float("-inf"))
                take = ops.logical_or(ops.gt(value, best), ops.isnan(value))
                best = ops.where(take, value, best)
                where = ops.where(take, ops.index_expr(h * width + w, "int64"), where)
        return best, where

    values = Lazy(out_size, x.dtype, lambda ops, index: window(ops, index)[0])
    indices = Lazy(out_size, "int64", lambda ops, index: window(ops, index)[1])
    return values, indices


@register("aten.max_pool2d_with_indices_backward.default")
def max_pool2d_with_indices_backward(ctx: LoweringContext, grad: TensorValue, x: TensorValue,
                                     kernel_size: Sequence[int], stride: Sequence[int] | None, padding: Any,
                                     dilation: Any, ceil_mode: bool, indices: TensorValue) -> Lazy:
    """Each input element sums the gradients of the windows whose maximum it was: for each window
    offset (i, j), the output position that would place it there (when the offset divides evenly
    by the stride and lands inside the output) contributes if its saved index names this element."""
    kh, kw = _pair(kernel_size)
    sh, sw = _pair(stride, (kh, kw))
    ph, pw = _pair(padding)
    dh, dw = _pair(dilation)
    if kh * kw > MAX_WINDOW or x.rank not in (3, 4):
        raise NotImplementedError(f"a {kh}x{kw} window over a rank-{x.rank} input: run it as an ATen call")
    out_h, out_w = grad.size[-2], grad.size[-1]
    width = x.size[-1]
    acc = compute_dtype(ctx.out_dtype)

    def candidate(ops, position: Any, pad: int, offset: int, step: int, extent: int) -> tuple[Any, Any]:
        """(whether an output position along one dim puts `position` at this window offset, that position)."""
        numerator = position + pad - offset
        value = ops.index_expr(numerator, "int64")
        valid = ops.logical_and(
            ops.logical_and(ops.ge(value, ops.constant(0, "int64")), ops.lt(value, ops.constant(extent * step, "int64"))),
            ops.eq(ops.remainder(value, ops.constant(step, "int64")), ops.constant(0, "int64")))
        return valid, FloorDiv(numerator, step)

    def load(ops, index):
        ih, iw = index[-2], index[-1]
        me = ops.index_expr(ih * width + iw, "int64")
        total = ops.constant(0.0, acc)
        for i in range(kh):
            valid_h, oh = candidate(ops, ih, ph, i * dh, sh, out_h)
            for j in range(kw):
                valid_w, ow = candidate(ops, iw, pw, j * dw, sw, out_w)
                at = list(index[:-2]) + [oh, ow]

                def contribution(at=at):
                    hit = ops.eq(ops.to_dtype(indices.load(ops, at), "int64"), me)
                    return ops.where(hit, ops.to_dtype(grad.load(ops, at), acc), ops.constant(0.0, acc))

                total = ops.add(total, ops.masked(ops.logical_and(valid_h, valid_w), contribution, 0.0))
        return total

    return Lazy(x.size, ctx.out_dtype, load)
