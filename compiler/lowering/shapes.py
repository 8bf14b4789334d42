"""Shape ops: the ATen view ops (index remaps, no copies), the ops that assemble
tensors from pieces (cat, stack, constant_pad_nd, split, repeat), and the scatters of
a view back into its base (slice_scatter, select_scatter) that functionalized
in-place writes become."""

from __future__ import annotations

import math
from typing import Any, Sequence

from compiler.indexing import FloorDiv, ModularIndexing
from compiler.lowering.concatenation import Concatenation, stored_by_piece
from compiler.lowering.context import LoweringContext
from compiler.lowering.masked_pieces import load_pieces
from compiler.lowering.registry import register
from compiler.lowering.values import Lazy, StorageView, TensorValue, compute_dtype, known_value
from compiler.ops import load_selected
from compiler.lowering import views


@register("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")
def view(ctx: LoweringContext, x: TensorValue, size: Sequence[int]) -> TensorValue:
    return views.reshape(x, size)


@register("aten.permute.default")
def permute(ctx: LoweringContext, x: TensorValue, dims: Sequence[int]) -> TensorValue:
    return views.permute(x, dims)


@register("aten.transpose.int")
def transpose(ctx: LoweringContext, x: TensorValue, dim0: int, dim1: int) -> TensorValue:
    if x.rank < 2 and dim0 in (0, -1) and dim1 in (0, -1):
        return x
    order = list(range(x.rank))
    a, b = views.normalize_dim(dim0, x.rank), views.normalize_dim(dim1, x.rank)
    order[a], order[b] = order[b], order[a]
    return views.permute(x, order)


@register("aten.t.default", "aten.numpy_T.default")
def t(ctx: LoweringContext, x: TensorValue) -> TensorValue:
    return x if x.rank < 2 else views.permute(x, list(reversed(range(x.rank))))


@register("aten.expand.default")
def expand(ctx: LoweringContext, x: TensorValue, size: Sequence[int], *, implicit: bool = False) -> TensorValue:
    return views.expand(x, size)


@register("aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default")
def squeeze(ctx: LoweringContext, x: TensorValue, dims: Any = None) -> TensorValue:
    return views.squeeze(x, [dims] if isinstance(dims, int) else dims)


@register("aten.unsqueeze.default")
def unsqueeze(ctx: LoweringContext, x: TensorValue, dim: int) -> TensorValue:
    return views.unsqueeze(x, dim)


@register("aten.slice.Tensor")
def slice_(ctx: LoweringContext, x: TensorValue, dim: int = 0, start: int | None = None, end: int | None = None,
           step: int = 1) -> TensorValue:
    return views.slice_dim(x, dim, start, end, step)


@register("aten.select.int")
def select(ctx: LoweringContext, x: TensorValue, dim: int, index: int) -> TensorValue:
    return views.select(x, dim, index)


@register("aten.flip.default", "prims.rev.default")
def flip(ctx: LoweringContext, x: TensorValue, dims: Sequence[int]) -> TensorValue:
    flipped = {views.normalize_dim(d, x.rank) for d in dims}
    return Lazy(x.size, x.dtype, lambda ops, index: x.load(
        ops, [x.size[d] - 1 - i if d in flipped else i for d, i in enumerate(index)]))


@register("aten.as_strided.default")
def as_strided(ctx: LoweringContext, x: TensorValue, size: Sequence[int], stride: Sequence[int],
               storage_offset: int | None = None) -> TensorValue:
    base = ctx.realize(x)
    view = views.as_strided(base, size, stride, storage_offset)
    reach, held = view.layout.storage_numel(), base.buffer.layout.storage_numel()
    if reach > held:  # eager may read a larger storage behind a graph input; the wire format does not carry it
        raise ctx.fail(f"as_strided {list(size)} with stride {list(stride)} from offset {view.layout.offset} reaches "
                       f"element {reach - 1} of a tensor whose storage holds {held}")
    return view


@register("aten.split.Tensor")
def split(ctx: LoweringContext, x: TensorValue, split_size: int, dim: int = 0) -> tuple:
    dim = views.normalize_dim(dim, x.rank)
    sizes = [min(split_size, x.size[dim] - s) for s in range(0, x.size[dim], max(split_size, 1))] or [0]
    return split_with_sizes(ctx, x, sizes, dim)


@register("aten.split_with_sizes.default")
def split_with_sizes(ctx: LoweringContext, x: TensorValue, sizes: Sequence[int], dim: int = 0) -> tuple:
    start, pieces = 0, []
    for size in sizes:
        pieces.append(views.slice_dim(x, dim, start, start + size))
        start += size
    return tuple(pieces)


@register("aten.cat.default")
def cat(ctx: LoweringContext, tensors: Sequence[TensorValue], dim: int = 0) -> Lazy:
    tensors = [t for t in tensors if not (t.rank == 1 and t.size[0] == 0)]  # torch ignores legacy empty inputs
    dtype = ctx.out_dtype
    if not tensors:  # only legacy empty inputs: an empty result
        return Lazy(ctx.out_size, dtype, lambda ops, index: ops.constant(0, compute_dtype(dtype)))
    dim = views.normalize_dim(dim, tensors[0].rank)
    # an empty piece adds nothing (a KV cache's empty past); all empty: an empty result, any piece will do
    pieces = [t for t in tensors if t.size[dim] > 0] or tensors[:1]
    if len(pieces) == 1:  # one piece is a copy: no masks, so readers of the piece in the same kernel reuse its value
        (only,) = pieces
        return Lazy(ctx.out_size, dtype, lambda ops, index: ops.to_dtype(only.load(ops, index), compute_dtype(dtype)))
    offsets, running = [], 0
    for t in pieces:
        offsets.append(running)
        running += t.size[dim]

    selectable = _like_stored_pieces(pieces)

    def load(ops, index):
        if selectable is not None:
            selected = _load_selected_piece(ops, selectable, index, dim)
            if selected is not None:
                return ops.to_dtype(selected, compute_dtype(dtype))
        result = None
        for t, offset in zip(pieces, offsets):
            inside = _within(ops, index[dim], offset, offset + t.size[dim], running)
            piece = ops.masked(inside, lambda t=t, offset=offset: ops.to_dtype(
                _load_cat_piece(ops, t, index, dim, offset, running), compute_dtype(dtype)), 0)
            result = piece if result is None else ops.where(inside, piece, result)
        return result

    return Concatenation(ctx.out_size, dtype, load, tuple(pieces), tuple(offsets), dim, stored_by_piece(ctx, pieces))


# A piece whose length divides the cat dim's whole length is indexed so that its index stays in
# [0, size) at every point, inside the piece or not: (x + c) mod size with c = -offset mod size, which
# is x - offset wherever the piece's mask holds. Index simplification knows no masks: with a plain
# `x - offset`, the cat of two reshaped stacks in EdgeNeXt's position embedding read its producers
# through divisions it could not join (10.9 us, wrapped 7.3; rotary embeddings' cat of halves
# 1.04-1.23x faster too). Where the length divides the whole, the modulo folds into the dim's own
# (x % 96 % 48 is x % 48); elsewhere it stays in every element, and a modulo by 27 and 11 in ReXNet's
# channel cat cost 30 % (H100, 2026-11-27): those pieces keep `x - offset`.
WRAPPED_PIECE_INDEX = True  # off: x - offset everywhere (A/B runs, bench/switch_ab.py)


def _load_cat_piece(ops: Any, t: TensorValue, index: Sequence[Any], dim: int, offset: int, whole: int) -> Any:
    """Piece `t` of a cat at `index` (its mask holding): wrapped where its length divides the whole,
    else at `index - offset` known to lie in the piece (masked_pieces.load_pieces)."""
    size = t.size[dim]
    shifted = list(index)
    if WRAPPED_PIECE_INDEX and whole % size == 0:
        shifted[dim] = ModularIndexing(index[dim] + (-offset) % size, 1, size)
        return t.load(ops, shifted)
    shifted[dim] = index[dim] - offset
    return load_pieces(ops, t, shifted, [dim])


# A cat of at least this many pieces that are buffers of one layout and dtype (StableLM's 16 per-head
# LayerNorms) reads the piece an element lies in through a pointer chosen per element: one load, where
# a masked load per piece cost each element 16 predicated loads and range tests, 0.36x Inductor (H200).
MIN_SELECTED_PIECES = 3
SELECT_LIKE_PIECES = True  # off: every cat reads piece by piece under masks (A/B runs, bench/switch_ab.py)


def _like_stored_pieces(pieces: Sequence[TensorValue]) -> list[StorageView] | None:
    """The pieces, where they are enough buffers seen through one layout (so one index reads any of
    them) of one dtype; else None."""
    if not SELECT_LIKE_PIECES or len(pieces) < MIN_SELECTED_PIECES:
        return None
    if not all(isinstance(p, StorageView) for p in pieces):
        return None
    first = pieces[0].layout
    if any(p.layout != first or p.buffer.layout.dtype != first.dtype for p in pieces):
        return None
    return list(pieces)


def _load_selected_piece(ops: Any, pieces: list[StorageView], index: Sequence[Any], dim: int) -> Any:
    """The cat's element at `index` read as one load from the piece it lies in (compiler.ops
    load_selected); None where `ops` cannot."""
    size = pieces[0].size[dim]
    within = list(index)
    within[dim] = ModularIndexing(index[dim], 1, size)
    selector = FloorDiv(index[dim], size)
    return load_selected(ops, [p.buffer.name for p in pieces], selector, pieces[0].layout.index(within))


def _within(ops: Any, index: Any, start: int, end: int, size: int) -> Any:
    """`start <= index < end` for an index in [0, size), leaving out the bound that always holds."""
    position = ops.index_expr(index, "int64")
    if start == 0:
        return ops.lt(position, ops.constant(end, "int64"))
    if end == size:
        return ops.ge(position, ops.constant(start, "int64"))
    return ops.logical_and(ops.ge(position, ops.constant(start, "int64")), ops.lt(position, ops.constant(end, "int64")))


@register("aten.stack.default")
def stack(ctx: LoweringContext, tensors: Sequence[TensorValue], dim: int = 0) -> Lazy:
    dim = views.normalize_dim(dim, tensors[0].rank + 1)
    return cat(ctx, [views.unsqueeze(t, dim) for t in tensors], dim)


# The inside of a pad that adds after the end only is placed as well: its index needs no shift, but the
# bound `x < size` joins the divisions that views put beneath it. HaloNet's and BoTNet's relative
# logits pad a flattened [.., W, 2W - 1] and read it through views, as `((x // 207 + (x % 207) // 192)
# % 8192)` where, under the mask x % 207 < 192, the row is x // 207.
END_PAD_PLACED = True  # off: only a pad before the start is placed (A/B runs, bench/switch_ab.py)


@register("aten.constant_pad_nd.default")
def constant_pad_nd(ctx: LoweringContext, x: TensorValue, pad: Sequence[int], value: Any = 0) -> Lazy:
    """Pads (or, with negative amounts, crops) the last len(pad) / 2 dims. Only a side that adds
    elements needs a bound check: a pad of zeros (Swin's windows when the size divides) is a copy
    without masks, so that readers of x in the same kernel reuse its value."""
    dtype = compute_dtype(ctx.out_dtype)
    pairs = [(pad[2 * i], pad[2 * i + 1]) for i in range(len(pad) // 2)]  # last dim first

    def load(ops, index):
        shifted = list(index)
        inside = None
        bounded = []  # dims whose index may leave the piece outside the mask: placed by load_pieces
        for i, (before, after) in enumerate(pairs):
            d = x.rank - 1 - i
            shifted[d] = index[d] - before
            if before > 0 or (after > 0 and END_PAD_PLACED):
                bounded.append(d)
            if before <= 0 and after <= 0:
                continue
            position = ops.index_expr(index[d] - before, "int64")
            checks = ([ops.ge(position, ops.constant(0, "int64"))] if before > 0 else []) + \
                ([ops.lt(position, ops.constant(x.size[d], "int64"))] if after > 0 else [])
            for ok in checks:
                inside = ok if inside is None else ops.logical_and(inside, ok)
        if inside is None:
            return ops.to_dtype(x.load(ops, shifted), dtype)
        return ops.masked(inside, lambda: ops.to_dtype(load_pieces(ops, x, shifted, bounded), dtype), value)

    return Lazy(ctx.out_size, ctx.out_dtype, load)


@register("aten.repeat.default")
def repeat(ctx: LoweringContext, x: TensorValue, repeats: Sequence[int]) -> Lazy:
    lead = len(repeats) - x.rank
    sizes = list(x.size)

    def load(ops, index):
        inner = [ModularIndexing(index[lead + d], 1, s) for d, s in enumerate(sizes)]
        return x.load(ops, inner)

    return Lazy(ctx.out_size, ctx.out_dtype, load)


@register("aten.roll.default")
def roll(ctx: LoweringContext, x: TensorValue, shifts: Any, dims: Any = ()) -> Lazy:
    """x rolled along `dims`: out[i] = x[(i - shift) mod n], as index math that is never negative
    ((i + n - shift) % n), where the decomposition gathers through an int64 remainder of an arange
    with a sign fix-up per element (Swin's shifted windows)."""
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    dims = [dims] if isinstance(dims, int) else list(dims or [])
    if not dims and len(shifts) == 1:  # no dims: the flattened tensor rolls, then takes x's shape
        flat = roll(ctx, views.reshape(x, [math.prod(x.size)]), shifts, [0])
        return views.reshape(flat, x.size)
    if len(dims) != len(shifts):
        raise NotImplementedError("roll: shifts and dims differ in length")
    moves: dict[int, int] = {}
    for shift, dim in zip(shifts, dims):  # a dim named twice rolls twice
        d = views.normalize_dim(dim, x.rank)
        moves[d] = moves.get(d, 0) + shift
    offsets = {d: -shift % x.size[d] for d, shift in moves.items() if x.size[d] and shift % x.size[d]}

    def load(ops, index):
        moved = list(index)
        for d, offset in offsets.items():
            moved[d] = ModularIndexing(index[d] + offset, 1, x.size[d])
        return x.load(ops, moved)

    return Lazy(x.size, x.dtype, load)


@register("aten.slice_scatter.default")
def slice_scatter(ctx: LoweringContext, x: TensorValue, src: TensorValue, dim: int = 0, start: int | None = None,
                  end: int | None = None, step: int = 1) -> Lazy:
    """x with x[start:end:step] along `dim` replaced by src."""
    dim = views.normalize_dim(dim, x.rank)
    start, end, step = slice(start, end, step).indices(x.size[dim])
    end = start + step * src.size[dim]  # one past the last written position
    size = x.size[dim]
    return _scatter_where(ctx, x, src, dim, lambda ops, index: _slice_position(ops, index[dim], start, end, step, size),
                          lambda i: i - start if step == 1 else FloorDiv(i - start, step))


@register("aten.select_scatter.default")
def select_scatter(ctx: LoweringContext, x: TensorValue, src: TensorValue, dim: int, index: int) -> Lazy:
    """x with x.select(dim, index) replaced by src (which has one dim less)."""
    dim = views.normalize_dim(dim, x.rank)
    index %= x.size[dim]

    def inside(ops, out_index):
        return ops.eq(ops.index_expr(out_index[dim], "int64"), ops.constant(index, "int64"))

    return _scatter_where(ctx, x, views.unsqueeze(src, dim), dim, inside, lambda i: 0)


# A slice that starts at 0 (or runs to the dim's end) is tested on its other side only: its mask is
# one comparison, not two and-ed (`x >= 0` is always true, and the kernel would still compute it).
ONE_SIDED_SLICE_MASKS = True  # off: both sides tested (A/B runs, bench/switch_ab.py)


def _slice_position(ops, i, start: int, end: int, step: int, size: int):
    """Whether position `i` (along a dim of `size`) is one of start, start + step, ... < end."""
    position = ops.index_expr(i, "int64")

    def from_start():
        return ops.ge(position, ops.constant(start, "int64"))

    def to_end():
        return ops.lt(position, ops.constant(end, "int64"))

    if ONE_SIDED_SLICE_MASKS and start == 0:
        inside = to_end()
    elif ONE_SIDED_SLICE_MASKS and end >= size:
        inside = from_start()
    else:
        inside = ops.logical_and(from_start(), to_end())
    if step == 1:
        return inside
    offset = ops.index_expr(i - start, "int64")
    return ops.logical_and(inside, ops.eq(ops.remainder(offset, ops.constant(step, "int64")), ops.constant(0, "int64")))


# The base of a scatter is read only outside the written positions: its load is masked there, so
# that elements the source overwrites are never fetched. DeepSeek-V3's rotary query fills the two
# column ranges of a [4, 16, 1024, 96] bf16 tensor with two nested slice_scatters, and its base was
# read in full: 12.6 MB of its 34 MB for nothing.
MASKED_SCATTER_BASE = True  # off: the base read everywhere (A/B runs, bench/switch_ab.py)


def _scatter_where(ctx: LoweringContext, x: TensorValue, src: TensorValue, dim: int, inside, src_position) -> Lazy:
    """out = src[src_position(i)] where inside(i) along `dim`, else x: one masked load of each."""
    dtype = compute_dtype(ctx.out_dtype)
    base_in_memory = known_value(x, ctx.constant_buffers) is None  # a slice_backward's zeros are no load

    def load(ops, index):
        mask = inside(ops, index)
        src_index = list(index)
        src_index[dim] = src_position(index[dim])
        taken = ops.masked(mask, lambda: ops.to_dtype(load_pieces(ops, src, src_index, [dim]), dtype), 0)

        def base():
            return ops.to_dtype(x.load(ops, index), dtype)

        kept = ops.masked(ops.logical_not(mask), base, 0) if MASKED_SCATTER_BASE and base_in_memory else base()
        return ops.where(mask, taken, kept)

    return Lazy(ctx.out_size, ctx.out_dtype, load)
