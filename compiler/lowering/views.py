"""Views as index remaps: permute, expand, reshape, slice, select, squeeze, unsqueeze,
as_strided. None of them copies. On a StorageView the result is a new layout over the
same buffer when one exists; otherwise a Lazy that remaps the index."""

from __future__ import annotations

import math
from typing import Sequence

import sympy

from compiler.indexing import flatten, unflatten
from compiler.ir import Layout
from compiler.lowering.values import Lazy, StorageView, TensorValue


class ViewError(ValueError):
    pass


def normalize_dim(dim: int, rank: int) -> int:
    rank = max(rank, 1)
    if not -rank <= dim < rank:
        raise ViewError(f"dim {dim} out of range for rank {rank}")
    return dim % rank


def _with_layout(value: StorageView, size: Sequence[int], stride: Sequence[int], offset: int) -> StorageView:
    return StorageView(value.buffer, Layout(tuple(size), tuple(stride), offset, value.dtype))


def permute(value: TensorValue, dims: Sequence[int]) -> TensorValue:
    dims = [normalize_dim(d, value.rank) for d in dims]
    size = tuple(value.size[d] for d in dims)
    if isinstance(value, StorageView):
        return _with_layout(value, size, [value.layout.stride[d] for d in dims], value.layout.offset)

    def load(ops, index):
        inner = [sympy.Integer(0)] * len(dims)
        for out_dim, in_dim in enumerate(dims):
            inner[in_dim] = index[out_dim]
        return value.load(ops, inner)

    return Lazy(size, value.dtype, load)


def expand(value: TensorValue, size: Sequence[int]) -> TensorValue:
    size = list(size)
    lead = len(size) - value.rank
    if lead < 0:
        raise ViewError(f"cannot expand shape {list(value.size)} to {size}")
    size = [value.size[i - lead] if s == -1 else s for i, s in enumerate(size)]
    for i, s in enumerate(value.size):
        if s != size[i + lead] and s != 1:
            raise ViewError(f"cannot expand shape {list(value.size)} to {size}")
    if tuple(size) == value.size:
        return value
    if isinstance(value, StorageView):
        stride = [0] * lead + [st if s == size[i + lead] else 0 for i, (s, st) in enumerate(zip(value.size, value.layout.stride))]
        return _with_layout(value, size, stride, value.layout.offset)

    def load(ops, index):
        return value.load(ops, [sympy.Integer(0) if s == 1 else index[i + lead] for i, s in enumerate(value.size)])

    return Lazy(tuple(size), value.dtype, load)


def broadcast_to(value: TensorValue, size: Sequence[int]) -> TensorValue:
    return expand(value, size)


def infer_size(size: Sequence[int], numel: int) -> list[int]:
    size = list(size)
    if -1 in size:
        known = math.prod(s for s in size if s != -1)
        size[size.index(-1)] = numel // known if known else 0
    if math.prod(size) != numel:
        raise ViewError(f"shape {size} is invalid for {numel} elements")
    return size


def view_strides(old_size: Sequence[int], old_stride: Sequence[int], new_size: Sequence[int]) -> list[int] | None:
    """Strides that express a reshape without copying, or None when the data must move.

    Walks the old dims from the innermost, grouping runs that are contiguous with each
    other ("chunks"); each chunk must be covered exactly by whole new dims.
    """
    if math.prod(old_size) == 0 or not old_size:
        return list(Layout.contiguous(new_size, "float32").stride)
    new_stride = [0] * len(new_size)
    view_d = len(new_size) - 1
    chunk_base_stride = old_stride[-1]
    tensor_numel = view_numel = 1
    for tensor_d in reversed(range(len(old_size))):
        tensor_numel *= old_size[tensor_d]
        chunk_ends = tensor_d == 0 or (
            old_size[tensor_d - 1] != 1 and old_stride[tensor_d - 1] != tensor_numel * chunk_base_stride)
        if not chunk_ends:
            continue
        while view_d >= 0 and (view_numel < tensor_numel or new_size[view_d] == 1):
            new_stride[view_d] = view_numel * chunk_base_stride
            view_numel *= new_size[view_d]
            view_d -= 1
        if view_numel != tensor_numel:
            return None
        if tensor_d > 0:
            chunk_base_stride = old_stride[tensor_d - 1]
            tensor_numel = view_numel = 1
    return new_stride if view_d == -1 else None


def reshape(value: TensorValue, size: Sequence[int]) -> TensorValue:
    size = infer_size(size, math.prod(value.size))
    if list(size) == list(value.size):
        return value
    if isinstance(value, StorageView):
        strides = view_strides(value.size, value.layout.stride, size)
        if strides is not None:
            return _with_layout(value, size, strides, value.layout.offset)
    old_size = value.size

    def load(ops, index):
        return value.load(ops, unflatten(flatten(index, size), old_size))

    return Lazy(tuple(size), value.dtype, load)


def slice_dim(value: TensorValue, dim: int, start: int | None, end: int | None, step: int = 1) -> TensorValue:
    dim = normalize_dim(dim, value.rank)
    length = value.size[dim]
    start, end, step = slice(start, end, step).indices(length) if step > 0 else (0, 0, 1)
    new_len = max(0, (end - start + step - 1) // step)
    size = list(value.size)
    size[dim] = new_len
    if isinstance(value, StorageView):
        stride = list(value.layout.stride)
        offset = value.layout.offset + start * stride[dim]
        stride[dim] *= step
        return _with_layout(value, size, stride, offset)

    def load(ops, index):
        index = list(index)
        index[dim] = start + index[dim] * step
        return value.load(ops, index)

    return Lazy(tuple(size), value.dtype, load)


def select(value: TensorValue, dim: int, position: int) -> TensorValue:
    dim = normalize_dim(dim, value.rank)
    if not -value.size[dim] <= position < value.size[dim]:
        raise ViewError(f"index {position} out of range for dim {dim} of size {value.size[dim]}")
    position %= value.size[dim]
    size = value.size[:dim] + value.size[dim + 1:]
    if isinstance(value, StorageView):
        stride = value.layout.stride[:dim] + value.layout.stride[dim + 1:]
        return _with_layout(value, size, stride, value.layout.offset + position * value.layout.stride[dim])

    def load(ops, index):
        return value.load(ops, list(index[:dim]) + [sympy.Integer(position)] + list(index[dim:]))

    return Lazy(size, value.dtype, load)


def unsqueeze(value: TensorValue, dim: int) -> TensorValue:
    dim = normalize_dim(dim, value.rank + 1)
    return reshape(value, list(value.size[:dim]) + [1] + list(value.size[dim:]))


def squeeze(value: TensorValue, dims: Sequence[int] | None = None) -> TensorValue:
    if dims is None:
        dims = [i for i, s in enumerate(value.size) if s == 1]
    dims = {normalize_dim(d, value.rank) for d in dims}
    size = [s for i, s in enumerate(value.size) if not (i in dims and s == 1)]
    return reshape(value, size)


def as_strided(value: StorageView, size: Sequence[int], stride: Sequence[int], offset: int | None) -> StorageView:
    base_offset = value.layout.offset if offset is None else offset
    return _with_layout(value, size, stride, base_offset)
