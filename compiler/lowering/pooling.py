"""Pooling windows as pointwise work: each output element reads its window of the input with
masked loads (positions in the padding or past the edge read as -inf for a max, 0 for an
average), so the pool fuses with what produces its input and what consumes its output instead
of running as an ATen call.

Its backward is pointwise over the input too: each element gathers the gradients of the few
windows that chose it (no scatter, no atomics).

max_pool2d_with_indices follows ATen's rule for ties and NaN: the first maximum of the window in
row-major order wins, a NaN wins over any number (the last NaN of the window), and a window with
nothing above -inf reports its first position inside the input.

avg_pool2d divides as ATen does: by `divisor_override` if given, else by the window's size
counting padding (`count_include_pad`, the default) but not a ceil_mode window's part past the
padding, else by the window's positions inside the input. PoolFormer's token mixer is an average
pool; as ATen calls, its pools and their backwards took 1.40 of its 6.11 ms of GPU time per
training step (H100, 2026-11-27).
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


def _window(kernel_size: Any, stride: Any, padding: Any, dilation: Any, rank: int) -> tuple[tuple[int, int], ...]:
    """(kernel, stride, padding, dilation) as (h, w) pairs; NotImplementedError for what stays ATen's."""
    kh, kw = _pair(kernel_size)
    if kh * kw > MAX_WINDOW or rank not in (3, 4):
        raise NotImplementedError(f"a {kh}x{kw} window over a rank-{rank} input: run it as an ATen call")
    return (kh, kw), _pair(stride, (kh, kw)), _pair(padding), _pair(dilation)


@register("aten.max_pool2d_with_indices.default")
def max_pool2d_with_indices(ctx: LoweringContext, x: TensorValue, kernel_size: Sequence[int],
                            stride: Sequence[int] | None = None, padding: Any = 0, dilation: Any = 1,
                            ceil_mode: bool = False) -> tuple[Lazy, Lazy]:
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = _window(kernel_size, stride, padding, dilation, x.rank)
    height, width = x.size[-2], x.size[-1]
    dtype = compute_dtype(x.dtype)
    out_size = tuple(ctx.out_meta[0].shape)

    rows_inside = [_always_inside(i * dh, sh, ph, out_size[-2], height) for i in range(kh)]
    columns_inside = [_always_inside(j * dw, sw, pw, out_size[-1], width) for j in range(kw)]

    def window(ops, index):
        """(max, flat index of the max in the input's H x W plane) of the window at `index`."""
        oh, ow = index[-2], index[-1]
        best = ops.constant(float("-inf"), dtype)
        first_h = _clamped_start(ops, oh * sh - ph, ph)
        first_w = _clamped_start(ops, ow * sw - pw, pw)
        where = ops.add(ops.mul(first_h, ops.constant(width, "int64")), first_w)
        for i in range(kh):
            for j in range(kw):
                h, w = oh * sh - ph + i * dh, ow * sw - pw + j * dw
                position = list(index[:-2]) + [h, w]
                value = _window_load(ops, x, position, (rows_inside[i], columns_inside[j]), (height, width), dtype,
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
    """Each input element sums the gradients of the windows whose maximum it was, over the output
    positions whose window covers it, if their saved index names this element."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = _window(kernel_size, stride, padding, dilation, x.rank)
    rows, columns = _covering(kh, sh, ph, dh, grad.size[-2]), _covering(kw, sw, pw, dw, grad.size[-1])
    width = x.size[-1]
    acc = compute_dtype(ctx.out_dtype)

    def load(ops, index):
        me = ops.index_expr(index[-2] * width + index[-1], "int64")
        total = ops.constant(0.0, acc)
        for valid_h, oh in rows(ops, index[-2]):
            for valid_w, ow in columns(ops, index[-1]):
                at = list(index[:-2]) + [oh, ow]

                def contribution(at=at):
                    hit = ops.eq(ops.to_dtype(indices.load(ops, at), "int64"), me)
                    return ops.where(hit, ops.to_dtype(grad.load(ops, at), acc), ops.constant(0.0, acc))

                total = ops.add(total, ops.masked(ops.logical_and(valid_h, valid_w), contribution, 0.0))
        return total

    return Lazy(x.size, ctx.out_dtype, load)


def _covering(kernel: int, stride: int, pad: int, dilation: int, extent: int) -> Any:
    """`candidates(ops, position)`: (valid, output position) pairs along one dim, one for each output
    position whose window may cover `position`. Undilated, the last such position is
    (position + pad) // stride and the others precede it: ceil(kernel / stride) candidates (4 for
    ResNet's 3x3 stride-2 pool, not 9). Dilated, one per window offset that divides evenly."""
    def undilated(ops, position):
        last = FloorDiv(position + pad, stride)
        for back in range(-(-kernel // stride)):
            out = last - back
            covers = ops.lt(ops.index_expr(position + pad - out * stride, "int64"), ops.constant(kernel, "int64"))
            yield ops.logical_and(_in_range(ops, ops.index_expr(out, "int64"), extent), covers), out

    def dilated(ops, position):
        for offset in range(0, kernel * dilation, dilation):
            numerator = ops.index_expr(position + pad - offset, "int64")
            divides = ops.eq(ops.remainder(numerator, ops.constant(stride, "int64")), ops.constant(0, "int64"))
            yield ops.logical_and(_in_range(ops, numerator, extent * stride), divides), FloorDiv(position + pad - offset, stride)

    return undilated if dilation == 1 else dilated


@register("aten.avg_pool2d.default")
def avg_pool2d(ctx: LoweringContext, x: TensorValue, kernel_size: Sequence[int], stride: Sequence[int] | None = None,
               padding: Any = 0, ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: int | None = None) -> Lazy:
    (kh, kw), (sh, sw), (ph, pw), _ = _window(kernel_size, stride, padding, 1, x.rank)
    height, width = x.size[-2], x.size[-1]
    acc = compute_dtype(x.dtype)
    out_h, out_w = ctx.out_size[-2], ctx.out_size[-1]
    divisor = _divisor(((kh, sh, ph, height, out_h), (kw, sw, pw, width, out_w)), count_include_pad, divisor_override,
                       acc)

    rows_inside = [_always_inside(i, sh, ph, out_h, height) for i in range(kh)]
    columns_inside = [_always_inside(j, sw, pw, out_w, width) for j in range(kw)]

    def load(ops, index):
        oh, ow = index[-2], index[-1]
        total = ops.constant(0.0, acc)
        for i in range(kh):
            for j in range(kw):
                position = list(index[:-2]) + [oh * sh - ph + i, ow * sw - pw + j]
                value = _window_load(ops, x, position, (rows_inside[i], columns_inside[j]), (height, width), acc, 0.0)
                total = ops.add(total, value)
        return ops.truediv(total, divisor(ops, oh, ow))

    return Lazy(ctx.out_size, x.dtype, load)


@register("aten.avg_pool2d_backward.default")
def avg_pool2d_backward(ctx: LoweringContext, grad: TensorValue, x: TensorValue, kernel_size: Sequence[int],
                        stride: Sequence[int] | None, padding: Any, ceil_mode: bool, count_include_pad: bool,
                        divisor_override: int | None) -> Lazy:
    """Each input element sums grad / divisor over the windows that cover it."""
    (kh, kw), (sh, sw), (ph, pw), _ = _window(kernel_size, stride, padding, 1, x.rank)
    rows, columns = _covering(kh, sh, ph, 1, grad.size[-2]), _covering(kw, sw, pw, 1, grad.size[-1])
    acc = compute_dtype(ctx.out_dtype)
    divisor = _divisor(((kh, sh, ph, x.size[-2], grad.size[-2]), (kw, sw, pw, x.size[-1], grad.size[-1])),
                       count_include_pad, divisor_override, acc)

    def load(ops, index):
        total = ops.constant(0.0, acc)
        for valid_h, oh in rows(ops, index[-2]):
            for valid_w, ow in columns(ops, index[-1]):
                at = list(index[:-2]) + [oh, ow]

                def contribution(at=at, oh=oh, ow=ow):
                    return ops.truediv(ops.to_dtype(grad.load(ops, at), acc), divisor(ops, oh, ow))

                total = ops.add(total, ops.masked(ops.logical_and(valid_h, valid_w), contribution, 0.0))
        return total

    return Lazy(x.size, ctx.out_dtype, load)


CONSTANT_DIVISORS = True  # off: every window's divisor computed from its clamped bounds (A/B runs, bench/switch_ab.py)


def _divisor(dims: tuple[tuple[int, int, int, int, int], ...], count_include_pad: bool, divisor_override: int | None,
             dtype: str) -> Any:
    """`divisor(ops, oh, ow)`: what ATen divides the window at (oh, ow) by. `dims`: (kernel, stride,
    pad, input extent, output extent) along H and W. A dim along which no window is clipped counts
    its whole kernel, a constant: ResNeSt's 3x3 pools of stride 2 then divide by 9, not by a length
    computed for every window."""
    def divisor(ops, oh, ow):
        if divisor_override:
            return ops.constant(float(divisor_override), dtype)
        size, whole = None, 1
        for (kernel, stride, pad, extent, out_extent), out in zip(dims, (oh, ow)):
            if CONSTANT_DIVISORS and _never_clipped(kernel, stride, pad, extent, out_extent, count_include_pad):
                whole *= kernel
                continue
            start = ops.index_expr(out * stride - pad, "int64")
            end = ops.minimum(ops.add(start, ops.constant(kernel, "int64")), ops.constant(extent + pad, "int64"))
            if not count_include_pad:
                start = ops.maximum(start, ops.constant(0, "int64"))
                end = ops.minimum(end, ops.constant(extent, "int64"))
            length = ops.sub(end, start)
            size = length if size is None else ops.mul(size, length)
        if size is None:
            return ops.constant(float(whole), dtype)
        if whole != 1:
            size = ops.mul(size, ops.constant(whole, "int64"))
        return ops.to_dtype(size, dtype)

    return divisor


def _never_clipped(kernel: int, stride: int, pad: int, extent: int, out_extent: int, count_include_pad: bool) -> bool:
    """Whether every window along a dim counts `kernel` elements: none reaches past the padded input
    (nor, without count_include_pad, into the padding)."""
    last_start = (out_extent - 1) * stride - pad
    if count_include_pad:
        return last_start + kernel <= extent + pad
    return pad == 0 and last_start + kernel <= extent


# A window offset that lies inside the input for every output position loads without a bounds check:
# HGNetV2's 2x2 stride-1 pool over a padded 113 x 113 map checked 0 <= h < 113 at every one of its
# four positions, in a kernel that also writes the cat around it (H200, 2026-11-29).
STATIC_WINDOW_BOUNDS = True  # off: every position of every window is checked (A/B runs, bench/switch_ab.py)


def _always_inside(offset: int, stride: int, pad: int, out_extent: int, extent: int) -> bool:
    """Whether the window position `offset` past a window's start lies in [0, extent) for every
    output position along a dim (the first window starts at -pad, the last at (out_extent - 1) * stride - pad)."""
    first, last = offset - pad, (out_extent - 1) * stride - pad + offset
    return STATIC_WINDOW_BOUNDS and out_extent > 0 and first >= 0 and last < extent


def _window_load(ops, x: TensorValue, position: list, inside: tuple[bool, bool], extents: tuple[int, int],
                 dtype: str, outside: float) -> Any:
    """x at `position` (..., h, w) as `dtype`, or `outside` where h or w lies outside the input;
    `inside`: whether each of h and w is known to lie inside, which needs no check."""
    checks = [_in_range(ops, ops.index_expr(coordinate, "int64"), extent)
              for coordinate, extent, known in zip(position[-2:], extents, inside) if not known]
    if not checks:
        return ops.to_dtype(x.load(ops, position), dtype)
    valid = checks[0] if len(checks) == 1 else ops.logical_and(*checks)
    return ops.masked(valid, lambda: ops.to_dtype(x.load(ops, position), dtype), outside)


def _clamped_start(ops, start: Any, pad: int) -> Any:
    """A window's first position along a dim, clamped at 0 where padding can put it before the input."""
    value = ops.index_expr(start, "int64")
    return ops.maximum(value, ops.constant(0, "int64")) if pad > 0 or not STATIC_WINDOW_BOUNDS else value


def _in_range(ops, value: Any, extent: int) -> Any:
    """Whether an int64 value lies in [0, extent)."""
    return ops.logical_and(ops.ge(value, ops.constant(0, "int64")), ops.lt(value, ops.constant(extent, "int64")))
