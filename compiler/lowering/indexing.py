"""Ops that index with tensors: embedding and its backward, index_select, gather,
index.Tensor, and scatter/scatter_add with a short index along the scattered dim. A loaded
index becomes part of a load's index expression through `ops.indirect`; negative indices
wrap as in PyTorch. Scatters whose index is long along the dim (index_put with accumulate)
stay ATen calls: they need atomics or a sort."""

from __future__ import annotations

import math
from typing import Any, Sequence

import sympy

from compiler.lowering.context import LoweringContext
from compiler.lowering.registry import register
from compiler.lowering.values import Lazy, TensorValue, compute_dtype
from compiler.lowering.views import broadcast_to, normalize_dim, reshape

# scatter unrolls one compare per index entry along the dim into every output element
MAX_UNROLLED_SCATTER = 16


@register("aten.embedding.default")
def embedding(ctx: LoweringContext, weight: TensorValue, indices: TensorValue, padding_idx: int = -1,
              scale_grad_by_freq: bool = False, sparse: bool = False) -> Lazy:
    rows = weight.size[0]

    def load(ops, index):
        row = ops.indirect(indices.load(ops, index[:-1]), rows)
        return weight.load(ops, [row, index[-1]])

    return Lazy(ctx.out_size, ctx.out_dtype, load)


# ATen's embedding backward sorts the indices when there are more than this many (cub radix sort and
# segment sums: about 25 launches); with fewer it runs one kernel, which the scatter below cannot beat.
ATEN_SORTS_ABOVE = 3072
# The scatter's atomic adds collide on a row this many times per row on average at most; past that
# (T5's 32-row relative-position tables take 8192 adds per row) the sort is faster.
MAX_ADDS_PER_ROW = 64


@register("aten.embedding_dense_backward.default")
def embedding_dense_backward(ctx: LoweringContext, grad: TensorValue, indices: TensorValue, num_weights: int,
                             padding_idx: int, scale_grad_by_freq: bool) -> Any:
    """The weight's gradient: each row of `grad` added into the row its index names, in float32 (or
    float64), with the rows of padding_idx left out. Where ATen would sort the indices and their rows
    collide little, one ATen index_add_ of atomic adds into a zeroed float32 table; else ATen's op."""
    count = math.prod(indices.size)
    if scale_grad_by_freq or count <= ATEN_SORTS_ABOVE or count > MAX_ADDS_PER_ROW * num_weights:
        return ctx.extern("aten.embedding_dense_backward.default",
                          [grad, indices, num_weights, padding_idx, scale_grad_by_freq], {}, ctx.out_meta)[0]
    width = grad.size[-1]
    acc = compute_dtype(grad.dtype)
    rows, flat_indices = reshape(grad, (count, width)), reshape(indices, (count,))

    def source(ops, index):
        row = ops.to_dtype(rows.load(ops, index), acc)
        if padding_idx < 0:
            return row
        padded = ops.eq(ops.to_dtype(flat_indices.load(ops, index[:1]), "int64"), ops.constant(padding_idx, "int64"))
        return ops.where(padded, ops.constant(0.0, acc), row)

    table = ctx.realize(Lazy((num_weights, width), acc, lambda ops, index: ops.constant(0.0, acc)))
    added = Lazy((count, width), acc, source)
    # the table is read after the call, not the alias the call returns: one buffer, one lifetime
    ctx.extern("aten.index_add_.default", [table, 0, flat_indices, added], {}, [None], mutated=[table])
    return table if acc == ctx.out_dtype else Lazy(table.size, ctx.out_dtype, table.load)


@register("aten.index_select.default")
def index_select(ctx: LoweringContext, x: TensorValue, dim: int, index_tensor: TensorValue) -> Lazy:
    if x.rank == 0:  # a 0-d tensor is one element along dim 0: every index must be 0, the result is x
        return Lazy(ctx.out_size, ctx.out_dtype, lambda ops, index: x.load(ops, []))
    dim = normalize_dim(dim, x.rank)
    size = x.size[dim]

    def load(ops, index):
        position = ops.indirect(index_tensor.load(ops, [index[dim]] if index_tensor.rank else []), size)
        inner = list(index)
        inner[dim] = position
        return x.load(ops, inner)

    return Lazy(ctx.out_size, ctx.out_dtype, load)


@register("aten.gather.default")
def gather(ctx: LoweringContext, x: TensorValue, dim: int, index_tensor: TensorValue, sparse_grad: bool = False) -> Lazy:
    if x.rank == 0:  # a 0-d input is its only element whatever the (valid) index
        return Lazy(ctx.out_size, ctx.out_dtype, lambda ops, index: x.load(ops, []))
    dim = normalize_dim(dim, x.rank)
    size = x.size[dim]

    def load(ops, index):
        inner = list(index)
        inner[dim] = ops.indirect(index_tensor.load(ops, index), size)
        return x.load(ops, inner)

    return Lazy(ctx.out_size, ctx.out_dtype, load)


@register("aten.index.Tensor")
def index_tensor(ctx: LoweringContext, x: TensorValue, indices: Sequence[TensorValue | None]) -> Any:
    """x[..., idx, ...] with index tensors broadcast together. As in PyTorch, the broadcast index
    dims replace the indexed dims when those are adjacent, and come first otherwise."""
    tensors = [(d, t) for d, t in enumerate(indices) if t is not None]
    dims = [d for d, _ in tensors]
    if any(t.dtype in ("bool", "uint8") for _, t in tensors):
        raise NotImplementedError("boolean masks give data-dependent shapes")
    adjacent = dims == list(range(dims[0], dims[0] + len(dims)))
    first = dims[0] if adjacent else 0
    k = len(ctx.out_size) - (x.rank - len(dims))  # rank of the broadcast index shape
    broadcast = [broadcast_to(t, ctx.out_size[first:first + k]) for _, t in tensors]
    rest = [d for d in range(x.rank) if d not in dims]

    def load(ops, index):
        inner: list[Any] = [None] * x.rank
        for d, t in zip(dims, broadcast):
            inner[d] = ops.indirect(t.load(ops, index[first:first + k]), x.size[d])
        for d, i in zip(rest, list(index[:first]) + list(index[first + k:])):
            inner[d] = i
        return x.load(ops, inner)

    return Lazy(ctx.out_size, ctx.out_dtype, load)


@register("aten.scatter.src", "aten.scatter.value")
def scatter(ctx: LoweringContext, x: TensorValue, dim: int, index: TensorValue, src: Any) -> Lazy:
    """out = x, then out[..., index[..., j, ...], ...] = src[..., j, ...] (the last j wins)."""
    return _scatter(ctx, x, dim, index, src, accumulate=False)


@register("aten.scatter_add.default")
def scatter_add(ctx: LoweringContext, x: TensorValue, dim: int, index: TensorValue, src: TensorValue) -> Lazy:
    return _scatter(ctx, x, dim, index, src, accumulate=True)


def _scatter(ctx: LoweringContext, x: TensorValue, dim: int, index: TensorValue, src: Any, accumulate: bool) -> Lazy:
    """Each output element compares its position along `dim` with the (few) index entries that
    could write it: the index entries j = 0..K-1 at the same position in the other dims."""
    dim = normalize_dim(dim, x.rank)
    if x.rank == 0 or index.rank != x.rank or index.size[dim] > MAX_UNROLLED_SCATTER:
        raise NotImplementedError("scatter with a long index along the dim: run it as an ATen call")
    dtype = compute_dtype(ctx.out_dtype)
    partial = [d for d in range(x.rank) if d != dim and index.size[d] < x.size[d]]

    def load(ops, out_index):
        result = ops.to_dtype(x.load(ops, out_index), dtype)
        position = ops.index_expr(out_index[dim], "int64")
        covered = None  # whether the index tensor has entries at this position in the other dims
        for d in partial:
            inside = ops.lt(ops.index_expr(out_index[d], "int64"), ops.constant(index.size[d], "int64"))
            covered = inside if covered is None else ops.logical_and(covered, inside)
        for j in range(index.size[dim]):
            at = list(out_index)
            at[dim] = sympy.Integer(j)
            if covered is None:
                target = index.load(ops, at)
            else:
                target = ops.masked(covered, lambda at=at: index.load(ops, at), -1)
            hit = ops.eq(ops.to_dtype(target, "int64"), position)
            if isinstance(src, TensorValue):
                value = ops.masked(hit, lambda at=at: ops.to_dtype(src.load(ops, at), dtype), 0)
            else:
                value = ops.constant(src, dtype)
            if accumulate:
                result = ops.add(result, ops.where(hit, value, ops.constant(0, dtype)))
            else:
                result = ops.where(hit, value, result)
        return result

    return Lazy(ctx.out_size, ctx.out_dtype, load)
