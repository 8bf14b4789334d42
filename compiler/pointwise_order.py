"""The order in which a pointwise kernel walks its points, chosen by the bytes it moves.

A pointwise kernel's flat index walks its anchor's dims (the first node's) in the anchor's
memory order. The anchor is often a value that never reaches memory: in ConvNeXt-V2's
backward, a masked_fill of a channels-last gradient comes first, and its result, kept in
registers, has the default NCHW layout. Walked in that order, every buffer the kernel really
loads and stores (all channels-last) steps 160 elements per point, and the kernel needed a 2D
tile to read them at all.

This stage measures, for each access to a buffer that reaches memory and covers every point
(broadcast reads stay in cache and have no say), how far one step of each of the anchor's dims
moves it. Each such access proposes its own dim order, largest stride first; the kernel takes
the proposal under which every access is contiguous along the flat index, and so needs no 2D
tile. Where a transpose is left whatever the order, 2D tiling (compiler/tiling.py) starts from
the anchor's order, as measured best.

ORDER_BY_MEMORY off restores the old way (the anchor's order, and tiling votes by every
access, registers included), for A/B runs (bench/switch_ab.py).
"""

from __future__ import annotations

import functools
import math
import random

import numpy as np

from compiler.dependencies import MemoryDep, ReadWrites
from compiler.index_points import evaluate
from compiler.indexing import XINDEX
from compiler.loop_mapping import GroupMapping
from compiler.row_order import reorder_rows
from compiler.tiling import choose_tiling, flat_sizes

SAMPLES = 12
ORDER_BY_MEMORY = True


def choose_pointwise_layout(nodes: list, mapping: GroupMapping, read_writes: dict[str, ReadWrites],
                            itemsize: dict[str, int], internal: set[str]) -> tuple[GroupMapping, bool] | None:
    """(the mapping, whether it is 2D-tiled) for a pointwise group walked in another order or
    tiled; None to keep the anchor's order in a 1D kernel.

    Another order is taken when every access to memory is then contiguous (a plain 1D kernel).
    Otherwise a transpose is left in the kernel, and tiling starts from the anchor's order: on
    ConvMixer's BatchNorm backward (channels-last in, NCHW out) tiles split at the anchor's
    channels took 64.5 us against 71.1 split at the reordered ones (H100, 2026-11-27)."""
    if not ORDER_BY_MEMORY:
        tiled = choose_tiling(nodes, mapping, read_writes, itemsize, set())
        return None if tiled is None else (tiled, True)
    reordered = choose_flat_order(nodes, mapping, read_writes, itemsize, internal)
    if reordered is not None and reordered[1]:
        return reordered[0], False
    tiled = choose_tiling(nodes, mapping, read_writes, itemsize, internal)
    if tiled is not None:
        return tiled, True
    return None if reordered is None else (reordered[0], False)


def choose_flat_order(nodes: list, mapping: GroupMapping, read_writes: dict[str, ReadWrites],
                      itemsize: dict[str, int], internal: set[str]) -> tuple[GroupMapping, bool] | None:
    """(the reordered mapping, whether every access to memory is then contiguous) for a
    pointwise group whose accesses are contiguous more often in another order; None to keep
    the anchor's."""
    sizes = flat_sizes(nodes)
    if any(n.is_reduction for n in nodes) or mapping.rnumel != 1 or len(sizes) < 2 \
            or math.prod(sizes) != mapping.numel:
        return None
    accesses = _full_accesses(nodes, mapping, read_writes, itemsize, internal, sizes)
    identity = list(range(len(sizes)))
    best_order, best_score = identity, _contiguous_bytes(accesses, identity)
    for strides, _ in accesses:
        order = sorted(identity, key=lambda d: -abs(strides[d]))  # stable: ties keep the anchor's order
        score = _contiguous_bytes(accesses, order)
        if score > best_score:
            best_order, best_score = order, score
    if best_order == identity:
        return None
    every_byte = sum(size for _, size in accesses)
    return reorder_rows(mapping, sizes, best_order), best_score == every_byte


def _full_accesses(nodes: list, mapping: GroupMapping, read_writes: dict[str, ReadWrites],
                   itemsize: dict[str, int], internal: set[str], sizes: list[int]) -> list[tuple[list[int], int]]:
    """(the address step of each dim, the element's bytes) of every access to memory that moves
    along every dim."""
    accesses = []
    for node in nodes:
        rw = read_writes[node.name]
        for dep in rw.reads | rw.writes:
            if not isinstance(dep, MemoryDep) or dep.buffer in internal:
                continue
            strides = dim_strides(mapping.nodes[node.name].apply(dep.index, mapping.bounds), tuple(sizes))
            if strides is not None and all(strides):
                accesses.append((strides, itemsize[dep.buffer]))
    return accesses


def _contiguous_bytes(accesses: list[tuple[list[int], int]], order: list[int]) -> int:
    """Bytes of the accesses that step one element when the innermost dim of `order` does."""
    return sum(size for strides, size in accesses if abs(strides[order[-1]]) == 1)


@functools.lru_cache(maxsize=1 << 12)
def dim_strides(index, sizes: tuple[int, ...]) -> list[int] | None:
    """How far, in elements, one step of each dim of the flat index over `sizes` moves the
    address `index` (the median over sampled points); None if it cannot be evaluated."""
    numel = math.prod(sizes)
    if numel == 0:
        return None
    rng = random.Random(0)
    strides = []
    for dim, size in enumerate(sizes):
        step = math.prod(sizes[dim + 1:])
        points = [rng.randrange(numel) for _ in range(SAMPLES)]
        points = np.array([p - step if (p // step) % size == size - 1 else p for p in points], dtype=np.int64)
        here = evaluate(index, {XINDEX: points}, {XINDEX: numel})
        there = evaluate(index, {XINDEX: points + step}, {XINDEX: numel})
        if here is None or there is None:
            return None
        strides.append(int(np.median(there - here)))
    return strides
