"""Ops that index with tensors: embedding, index_select, gather, and index.Tensor with
one index tensor. A loaded index becomes part of a load's index expression through
`ops.indirect`; negative indices wrap as in PyTorch."""

from __future__ import annotations

from typing import Any, Sequence

from compiler.lowering.context import LoweringContext
from compiler.lowering.registry import register
from compiler.lowering.values import Lazy, TensorValue
from compiler.lowering.views import broadcast_to, normalize_dim


@register("aten.embedding.default")
def embedding(ctx: LoweringContext, weight: TensorValue, indices: TensorValue, padding_idx: int = -1,
              scale_grad_by_freq: bool = False, sparse: bool = False) -> Lazy:
    rows = weight.size[0]

    def load(ops, index):
        row = ops.indirect(indices.load(ops, index[:-1]), rows)
        return weight.load(ops, [row, index[-1]])

    return Lazy(ctx.out_size, ctx.out_dtype, load)


@register("aten.index_select.default")
def index_select(ctx: LoweringContext, x: TensorValue, dim: int, index_tensor: TensorValue) -> Lazy:
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
    dim = normalize_dim(dim, x.rank)
    size = x.size[dim]

    def load(ops, index):
        inner = list(index)
        inner[dim] = ops.indirect(index_tensor.load(ops, index), size)
        return x.load(ops, inner)

    return Lazy(ctx.out_size, ctx.out_dtype, load)


@register("aten.index.Tensor")
def index_tensor(ctx: LoweringContext, x: TensorValue, indices: Sequence[TensorValue | None]) -> Any:
    """x[..., idx, ...] with index tensors (broadcast together) on consecutive leading-or-inner dims."""
    tensors = [(d, t) for d, t in enumerate(indices) if t is not None]
    dims = [d for d, _ in tensors]
    if any(t.dtype == "bool" for _, t in tensors) or dims != list(range(dims[0], dims[0] + len(dims))):
        raise NotImplementedError("boolean masks and non-adjacent index tensors")
    index_shape = list(ctx.out_size[dims[0]:dims[0] + len(ctx.out_size) - (x.rank - len(dims))])
    broadcast = [broadcast_to(t, index_shape) for _, t in tensors]
    first = dims[0]
    k = len(index_shape)

    def load(ops, index):
        where_index = index[first:first + k]
        inner = list(index[:first])
        for d, t in zip(dims, broadcast):
            inner.append(ops.indirect(t.load(ops, where_index), x.size[d]))
        inner.extend(index[first + k:])
        return x.load(ops, inner)

    return Lazy(ctx.out_size, ctx.out_dtype, load)
