"""Composite training ops written out as reductions plus pointwise math: softmax,
log_softmax and native_layer_norm. Their backward ops go through PyTorch's
decompositions (see compiler/lowering/__init__.py), which produce the same building
blocks."""

from __future__ import annotations

from typing import Any, Sequence

from compiler.lowering.context import LoweringContext
from compiler.lowering.reductions import reduce_dims, variance
from compiler.lowering.registry import register
from compiler.lowering.values import FLOATS, Lazy, TensorValue, compute_dtype
from compiler.lowering.views import broadcast_to, normalize_dim


def _as(value: TensorValue, dtype: str) -> Any:
    return lambda ops, index: ops.to_dtype(value.load(ops, index), dtype)


def _softmax_parts(ctx: LoweringContext, x: TensorValue, dim: int, acc: str) -> tuple[Any, TensorValue, TensorValue]:
    """(load x as acc, row max broadcast to x, sum of exp(x - max) broadcast to x)."""
    dim = normalize_dim(dim, x.rank)
    load_x = _as(x, acc)
    cast = Lazy(x.size, acc, load_x)
    row_max = broadcast_to(reduce_dims(ctx, cast, [dim], "max", acc, keepdim=True)[0], x.size)
    shifted = Lazy(x.size, acc, lambda ops, index: ops.exp(ops.sub(load_x(ops, index), row_max.load(ops, index))))
    row_sum = broadcast_to(reduce_dims(ctx, shifted, [dim], "sum", acc, keepdim=True)[0], x.size)
    return load_x, row_max, row_sum


@register("aten._softmax.default", "aten.softmax.int")
def softmax(ctx: LoweringContext, x: TensorValue, dim: int, half_to_float: Any = False) -> Lazy:
    acc = compute_dtype(ctx.out_dtype if ctx.out_dtype != "float64" else "float64")
    load_x, row_max, row_sum = _softmax_parts(ctx, x, dim, acc)
    return Lazy(x.size, ctx.out_dtype, lambda ops, index: ops.truediv(
        ops.exp(ops.sub(load_x(ops, index), row_max.load(ops, index))), row_sum.load(ops, index)))


@register("aten._log_softmax.default", "aten.log_softmax.int")
def log_softmax(ctx: LoweringContext, x: TensorValue, dim: int, half_to_float: Any = False) -> Lazy:
    acc = compute_dtype(ctx.out_dtype)
    load_x, row_max, row_sum = _softmax_parts(ctx, x, dim, acc)
    return Lazy(x.size, ctx.out_dtype, lambda ops, index: ops.sub(
        ops.sub(load_x(ops, index), row_max.load(ops, index)), ops.log(row_sum.load(ops, index))))


@register("aten.native_layer_norm.default")
def native_layer_norm(ctx: LoweringContext, x: TensorValue, normalized_shape: Sequence[int],
                      weight: TensorValue | None, bias: TensorValue | None, eps: float) -> tuple:
    acc = compute_dtype(x.dtype)
    dims = list(range(x.rank - len(normalized_shape), x.rank))
    var, mean = variance(ctx, Lazy(x.size, acc, _as(x, acc)), dims, 0.0, keepdim=True)
    rstd = Lazy(var.size, acc, lambda ops, index: ops.rsqrt(ops.add(var.load(ops, index), ops.constant(eps, acc))))
    mean_b, rstd_b = broadcast_to(mean, x.size), broadcast_to(rstd, x.size)
    w = broadcast_to(weight, x.size) if weight is not None else None
    b = broadcast_to(bias, x.size) if bias is not None else None
    load_x = _as(x, acc)

    def normalized(ops, index):
        value = ops.mul(ops.sub(load_x(ops, index), mean_b.load(ops, index)), rstd_b.load(ops, index))
        if w is not None:
            value = ops.mul(value, ops.to_dtype(w.load(ops, index), acc))
        if b is not None:
            value = ops.add(value, ops.to_dtype(b.load(ops, index), acc))
        return value

    stats_dtype = str(ctx.out_meta[1].dtype).removeprefix("torch.")
    out = Lazy(x.size, ctx.out_dtype, normalized)
    return out, Lazy(mean.size, stats_dtype, mean.load), Lazy(rstd.size, stats_dtype, rstd.load)


OUTER_PRODUCTS = frozenset({"aten.mm.default", "aten.bmm.default"})


def outer_product(ctx: LoweringContext, target: str, args: Sequence[Any]) -> Lazy | None:
    """`mm`/`bmm` whose contraction has length 1 (rotary embeddings' `inv_freq @ positions` in
    LLaMA-style models): one multiply per element, fused into its readers instead of a cuBLAS
    call and its launch. Stored, each element is the single product rounded once, as the GEMM
    computes it; read in the same kernel, it stays float32 like any fused intermediate.
    None for any other product (it stays an ATen call)."""
    if target not in OUTER_PRODUCTS or len(args) != 2 or not all(isinstance(a, TensorValue) for a in args):
        return None
    a, b = args
    if a.size[-1] != 1 or ctx.out_dtype not in FLOATS:
        return None
    acc = compute_dtype(ctx.out_dtype)
    left, right = broadcast_to(a, ctx.out_size), broadcast_to(b, ctx.out_size)
    return Lazy(ctx.out_size, ctx.out_dtype, lambda ops, index: ops.mul(
        ops.to_dtype(left.load(ops, index), acc), ops.to_dtype(right.load(ops, index), acc)))
