"""Reductions over any dims, with keepdim: sum, mean, prod, amax, amin, max/min.dim,
argmax, argmin, any, all, var, var_mean, std. Accumulation runs in the compute dtype
(float32 for bf16/fp16 inputs); variance uses a one-pass welford reduction. A sum, product,
max or min over at most UNROLLED_REDUCTION elements is a pointwise expression of its loads."""

from __future__ import annotations

import itertools
import math
from typing import Any, Sequence

import sympy

from compiler.dependencies import traced_loads
from compiler.indexing import index_symbol
from compiler.lowering.context import LoweringContext
from compiler.lowering.registry import register
from compiler.lowering.values import Lazy, TensorValue, compute_dtype
from compiler.lowering.views import normalize_dim, reshape


def reduction_dims(x: TensorValue, dims: Sequence[int] | int | None) -> list[int]:
    if dims is None or dims == []:
        return list(range(x.rank))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({normalize_dim(d, x.rank) for d in dims})


# A reduction over this few elements whose neighbouring rows lie apart in everything it reads becomes
# a pointwise expression of its loads: a kernel then walks the result's points in whatever order its
# loads coalesce (compiler/pointwise_order.py), and the expression fuses into its consumers as any
# pointwise value does. ResNeSt's sum over 2 radix groups of a channels-last tensor ran as a
# reduction over rows of 2 whose neighbouring rows lay 256 elements apart: 198 us, unrolled 32 (Inductor
# 32; H100, 2026-11-27). Where one load is contiguous from row to row (a sum over the batch of a
# row-major tensor: T5's bias gradient, GPT-2's bias gradient), the reduction kernel already walks well,
# and unrolled those ran 1.2-1.7x slower: they stay reductions, as do rows of a few contiguous elements.
UNROLLED_REDUCTION = 8
UNROLL_SMALL_REDUCTIONS = True  # off: every reduction is a reduction kernel (A/B runs, bench/switch_ab.py)
UNROLL_CAT_PIECES = True  # off: a small reduction a cat reads unrolls only where its rows lie apart
# A reduction over two elements is one add: unrolled wherever its rows lie. Qwen2-MoE's and
# DeepSeek-V3's sums over their top-2 experts ([4096 x 1024] rows 1024 apart) ran 15.0 -> 10.8 and
# 17.1 -> 15.9 us unrolled, ResNeSt's sums over 2 radix groups 19.2 -> 17.4 and 37.8 -> 36.5 (Inductor
# 11.1, 15.6, 18.2, 48.5; H200, 2026-11-29, bench/switch_ab.py). Unrolling every reduction of up to
# 8 elements, as Inductor does, lost on sums over 4 and 8 whose rows are contiguous: T5's bias-grad
# sum over 8 heads 44.5 -> 74.8, Hiera's over 4 windows 25.3 -> 36.4, Funnel's 7.9 -> 11.0.
UNROLL_PAIRS = True  # off: a sum over two elements is unrolled only where its rows lie apart
UNROLL_EVERY_SMALL = False  # on: every reduction of at most UNROLLED_REDUCTION elements (the A/B above)
# A reduction over one element (a sum over a dim of size 1) is always the pointwise value it reads:
# as a reduction kernel it could not be 2D-tiled, and Mamba-2's backward of a sum over its size-1
# dim read and wrote [4, 32, 4, 256, 256] float32 tensors 32 heads apart in a 1D kernel: 573.7 us,
# 202.9 as a tiled pointwise kernel (Inductor 196.6; H200, 2026-11-28, bench/switch_ab.py).
ONE_ELEMENT_POINTWISE = True
_UNROLLED_COMBINE = {"sum": "add", "prod": "mul", "max": "maximum", "min": "minimum"}


def reduce_dims(ctx: LoweringContext, x: TensorValue, dims: Sequence[int] | int | None, reduction_type: str,
                accumulate_dtype: str, keepdim: bool = False, value_dtype: str | None = None,
                out_dtypes: Sequence[str] | None = None) -> list[TensorValue]:
    """Reduces `x` over `dims`; returns the outputs viewed with keepdim's shape if asked.

    `value_dtype` is the dtype values are cast to before reducing (default: the accumulator's).
    """
    if x.rank == 0:  # PyTorch reads a 0-d tensor as one element along dim 0 (or -1); keepdim keeps 0-d
        reduction_dims(reshape(x, [1]), dims)  # an out-of-range dim is refused as for a 1-d tensor
        x, dims, keepdim = reshape(x, [1]), [0], False
    dims = reduction_dims(x, dims)
    kept = [d for d in range(x.rank) if d not in dims]
    ranges = [x.size[d] for d in kept]
    reduction_ranges = [x.size[d] for d in dims]
    cast_to = compute_dtype(value_dtype or accumulate_dtype)

    def body(ops, index, rindex):
        full = [None] * x.rank
        for d, i in zip(kept, index):
            full[d] = i
        for d, r in zip(dims, rindex):
            full[d] = r
        return ops.to_dtype(x.load(ops, full), cast_to)

    count = math.prod(reduction_ranges)
    single = count == 1 and ONE_ELEMENT_POINTWISE
    if UNROLL_SMALL_REDUCTIONS and reduction_type in _UNROLLED_COMBINE and 0 < count <= UNROLLED_REDUCTION \
            and not out_dtypes and (single or UNROLL_EVERY_SMALL or (UNROLL_PAIRS and count == 2) or _read_by_cat(ctx)
                                   or _rows_lie_apart(body, ranges, reduction_ranges)):
        outputs = [_unrolled(body, ranges, reduction_ranges, _UNROLLED_COMBINE[reduction_type], accumulate_dtype)]
    else:
        outputs = ctx.reduce(ranges, reduction_ranges, reduction_type, body, out_dtypes or [accumulate_dtype])
    if keepdim:
        keep_size = [1 if d in dims else s for d, s in enumerate(x.size)]
        return [reshape(o, keep_size) for o in outputs]
    return list(outputs)


def _read_by_cat(ctx: LoweringContext) -> bool:
    """Whether a cat reads the reduction's result as a piece: unrolled, the reduction joins the cat's
    node (DiffLlama's key and value gradients, each summed over its group of query heads, then cat),
    where a reduction kernel would write a buffer that the cat's kernel reads again."""
    return UNROLL_CAT_PIECES and ctx.origin in ctx.cat_pieces


def _rows_lie_apart(body, ranges: Sequence[int], reduction_ranges: Sequence[int]) -> bool:
    """Whether every load of a reduction's body steps a known distance other than one element both
    from a row to the next (along its innermost kept dim) and from one reduced element to the next
    (along its innermost reduced dim): a reduction kernel's tile then runs along neither. Broadcast
    loads step none."""
    inner = next((d for d in reversed(range(len(ranges))) if ranges[d] > 1), None)
    reduced = next((d for d in reversed(range(len(reduction_ranges))) if reduction_ranges[d] > 1), None)
    if inner is None or reduced is None:
        return False
    index = [index_symbol("i", d) for d in range(len(ranges))]
    rindex = [index_symbol("r", d) for d in range(len(reduction_ranges))]
    loads = traced_loads(lambda recorder: body(recorder, index, rindex), tuple(ranges))
    if loads is None:  # no loads, or a gather, whose step is not known
        return False
    steps = [sympy.simplify(dep.index.subs(symbol, symbol + 1) - dep.index)
             for dep in loads for symbol in (index[inner], rindex[reduced])]
    return all(step.is_Integer and abs(int(step)) != 1 for step in steps)


def _unrolled(body, ranges: Sequence[int], reduction_ranges: Sequence[int], combine: str, dtype: str) -> Lazy:
    """The reduction as a pointwise value: `combine` folded over every reduced element, in order."""
    def load(ops, index):
        values = (body(ops, index, list(rindex)) for rindex in itertools.product(*map(range, reduction_ranges)))
        result = next(values)
        for value in values:
            result = getattr(ops, combine)(result, value)
        return result
    return Lazy(tuple(ranges), dtype, load)


def _scaled(value: TensorValue, scale_fn, dtype: str) -> Lazy:
    return Lazy(value.size, dtype, lambda ops, index: scale_fn(ops, value.load(ops, index)))


@register("aten.sum.dim_IntList", "aten.sum.default")
def sum_(ctx: LoweringContext, x: TensorValue, dims: Any = None, keepdim: bool = False, *, dtype: Any = None) -> TensorValue:
    acc = compute_dtype(ctx.out_dtype)
    return reduce_dims(ctx, x, dims, "any" if acc == "bool" else "sum", acc, keepdim)[0]


@register("prims.sum.default")
def prims_sum(ctx: LoweringContext, x: TensorValue, dims: Any, *, output_dtype: Any = None) -> TensorValue:
    """prims.sum (what cumsum's decomposition reduces with): dims may be empty (a no-op sum)."""
    if not dims:
        return Lazy(x.size, ctx.out_dtype, x.load)
    return sum_(ctx, x, dims)


@register("aten.mean.dim", "aten.mean.default")
def mean(ctx: LoweringContext, x: TensorValue, dims: Any = None, keepdim: bool = False, *, dtype: Any = None) -> TensorValue:
    acc = compute_dtype(ctx.out_dtype)
    total = reduce_dims(ctx, x, dims, "sum", acc, keepdim)[0]
    count = 1
    for d in reduction_dims(x, dims) if x.rank else []:
        count *= x.size[d]
    return _scaled(total, lambda ops, v: ops.truediv(v, ops.constant(count, acc)), ctx.out_dtype)


@register("aten.prod.dim_int", "aten.prod.default")
def prod(ctx: LoweringContext, x: TensorValue, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> TensorValue:
    return reduce_dims(ctx, x, dim, "prod", compute_dtype(ctx.out_dtype), keepdim)[0]


@register("aten.amax.default", "aten.max.default")
def amax(ctx: LoweringContext, x: TensorValue, dims: Any = None, keepdim: bool = False) -> TensorValue:
    return reduce_dims(ctx, x, dims, "max", compute_dtype(ctx.out_dtype), keepdim)[0]


@register("aten.amin.default", "aten.min.default")
def amin(ctx: LoweringContext, x: TensorValue, dims: Any = None, keepdim: bool = False) -> TensorValue:
    return reduce_dims(ctx, x, dims, "min", compute_dtype(ctx.out_dtype), keepdim)[0]


@register("aten.argmax.default")
def argmax(ctx: LoweringContext, x: TensorValue, dim: int | None = None, keepdim: bool = False) -> TensorValue:
    return _arg_reduction(ctx, x, dim, keepdim, "argmax")


@register("aten.argmin.default")
def argmin(ctx: LoweringContext, x: TensorValue, dim: int | None = None, keepdim: bool = False) -> TensorValue:
    return _arg_reduction(ctx, x, dim, keepdim, "argmin")


def _arg_reduction(ctx: LoweringContext, x: TensorValue, dim: int | None, keepdim: bool, kind: str) -> TensorValue:
    if dim is None:  # over the flattened tensor
        x = reshape(x, [-1] if x.rank else [1])
        dim, keepdim_shape = 0, [1] * len(ctx.out_size)
        out = reduce_dims(ctx, x, [0], kind, "int64", value_dtype=compute_dtype(x.dtype))[0]
        return reshape(out, keepdim_shape) if keepdim else out
    return reduce_dims(ctx, x, [dim], kind, "int64", keepdim, value_dtype=compute_dtype(x.dtype))[0]


@register("aten.max.dim")
def max_dim(ctx: LoweringContext, x: TensorValue, dim: int, keepdim: bool = False) -> tuple:
    values = reduce_dims(ctx, x, [dim], "max", compute_dtype(x.dtype), keepdim)[0]
    return values, _arg_reduction(ctx, x, dim, keepdim, "argmax")


@register("aten.min.dim")
def min_dim(ctx: LoweringContext, x: TensorValue, dim: int, keepdim: bool = False) -> tuple:
    values = reduce_dims(ctx, x, [dim], "min", compute_dtype(x.dtype), keepdim)[0]
    return values, _arg_reduction(ctx, x, dim, keepdim, "argmin")


@register("aten.any.dim", "aten.any.dims", "aten.any.default")
def any_(ctx: LoweringContext, x: TensorValue, dims: Any = None, keepdim: bool = False) -> TensorValue:
    return reduce_dims(ctx, x, dims, "any", "bool", keepdim)[0]


@register("aten.all.dim", "aten.all.dims", "aten.all.default")
def all_(ctx: LoweringContext, x: TensorValue, dims: Any = None, keepdim: bool = False) -> TensorValue:
    negated = Lazy(x.size, "bool", lambda ops, index: ops.logical_not(ops.to_dtype(x.load(ops, index), "bool")))
    found = reduce_dims(ctx, negated, dims, "any", "bool", keepdim)[0]
    return Lazy(found.size, "bool", lambda ops, index: ops.logical_not(found.load(ops, index)))


def variance(ctx: LoweringContext, x: TensorValue, dims: Any, correction: float, keepdim: bool) -> tuple[TensorValue, TensorValue]:
    """(var, mean) by a one-pass welford reduction, in the compute dtype."""
    acc = compute_dtype(x.dtype) if x.dtype != "float64" else "float64"
    mean_value, m2 = reduce_dims(ctx, x, dims, "welford", acc, keepdim, out_dtypes=[acc, acc])
    count = 1
    for d in reduction_dims(x, dims) if x.rank else []:
        count *= x.size[d]
    denominator = max(0.0, count - correction)
    var = Lazy(m2.size, acc, lambda ops, index: ops.truediv(m2.load(ops, index), ops.constant(denominator, acc)))
    return var, mean_value


def _correction(correction: Any, unbiased: Any = None) -> float:
    if correction is not None:
        return float(correction)
    return 0.0 if unbiased is False else 1.0


@register("aten.var.correction", "aten.var.dim")
def var(ctx: LoweringContext, x: TensorValue, dims: Any = None, unbiased: Any = None, keepdim: bool = False, *,
        correction: Any = None) -> TensorValue:
    if isinstance(unbiased, (int, float)) and not isinstance(unbiased, bool):  # var.correction passes it positionally
        correction, unbiased = unbiased, None
    return _cast(variance(ctx, x, dims, _correction(correction, unbiased), keepdim)[0], ctx.out_dtype)


@register("aten.var_mean.correction", "aten.var_mean.dim")
def var_mean(ctx: LoweringContext, x: TensorValue, dims: Any = None, unbiased: Any = None, keepdim: bool = False, *,
             correction: Any = None) -> tuple:
    if isinstance(unbiased, (int, float)) and not isinstance(unbiased, bool):
        correction, unbiased = unbiased, None
    v, m = variance(ctx, x, dims, _correction(correction, unbiased), keepdim)
    return _cast(v, ctx.out_dtype), _cast(m, ctx.out_dtype)


@register("aten.std.correction", "aten.std.dim")
def std(ctx: LoweringContext, x: TensorValue, dims: Any = None, unbiased: Any = None, keepdim: bool = False, *,
        correction: Any = None) -> TensorValue:
    if isinstance(unbiased, (int, float)) and not isinstance(unbiased, bool):
        correction, unbiased = unbiased, None
    v = variance(ctx, x, dims, _correction(correction, unbiased), keepdim)[0]
    return Lazy(v.size, ctx.out_dtype, lambda ops, index: ops.sqrt(v.load(ops, index)))


def _cast(value: TensorValue, dtype: str) -> TensorValue:
    if value.dtype == dtype:
        return value
    return Lazy(value.size, dtype, value.load)
