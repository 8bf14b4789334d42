"""2D tiling for pointwise kernels whose accesses disagree on the contiguous dim
(transpose + add, permute copies), as the seed's select_tiling does.

A pointwise group's flat iteration space N is split as Y x X at a boundary of its
anchor's dims (compiler/pointwise_order.py takes another order only where no tile is
needed); the kernel then walks [XBLOCK, RBLOCK] tiles with `xindex` over Y and `rindex`
over X. A split is a candidate when every access to memory is contiguous along one of the
two tile axes (or steps at most two elements either way along it: a stride-2 pool's window,
a flipped copy) and both axes have some (buffers kept in registers move no bytes and have no
say); the candidate with the most coalesced bytes wins. A group with no such split keeps its 1D kernel.
"""

from __future__ import annotations

import functools
import math
import random
from typing import Any, Iterator

import numpy as np

from compiler.dependencies import MemoryDep, ReadWrites
from compiler.index_points import evaluate
from compiler.indexing import RINDEX, XINDEX
from compiler.loop_mapping import GroupMapping, memory_order

MIN_TILED_NUMEL = 1024
# An access that is not contiguous along either tile axis but steps at most two elements either way
# along one (a stride-2 pool's window, a flipped copy) still reads whole cache lines along it, as a
# window's other loads fill the gaps: it votes for that axis. Off, it vetoes tiling, and an NCHW
# max pool whose output is copied channels-last stayed a 1D kernel storing 64 or 192 elements apart.
# H200, 2026-11-28 (bench/switch_ab.py, the 2 cases it changes in all 16 sets): ResNet's
# 32 x 64 x 112 x 112 pool 111.1 -> 45.8 us (Inductor 102.2), MViT-v2's 32 x 192 x 56 x 56
# 63.6 -> 41.0 us (Inductor 130.2).
STRIDED_WINDOWS_VOTE = True
NEAR_STEP = 2
# An access whose address stays put for most steps along one tile axis (Mamba-2's per-head gate,
# read at channel // 64 along a [4 x 1024] x 2176 kernel's channels) reads one element for runs
# along it, as a broadcast does: it abstains. As a veto it kept Mamba-2's gate backward, which reads
# a [4, 2176, 1027] convolution output across its rows, a 1D kernel loading 1027 elements apart.
REPEATS_ABSTAIN = True
MAX_GRID_Y = 65535
TILE = 64


def choose_tiling(nodes: list, mapping: GroupMapping, read_writes: dict[str, ReadWrites],
                  itemsize: dict[str, int], internal: set[str]) -> GroupMapping | None:
    """The tiled mapping, or None to keep the 1D kernel. `internal`: the group's buffers that
    stay in registers (they move no bytes, so they have no say)."""
    if any(n.is_reduction for n in nodes) or mapping.numel < MIN_TILED_NUMEL:
        return None
    ranges = flat_sizes(nodes)
    best: tuple[int, GroupMapping] | None = None
    for split in range(1, len(ranges)):
        outer, inner = math.prod(ranges[:split]), math.prod(ranges[split:])
        if -(-inner // TILE) > MAX_GRID_Y:
            continue
        tiled = retile(mapping, outer, inner)
        score = _coalesced_bytes(nodes, tiled, read_writes, itemsize, internal)
        if score is not None and (best is None or score > best[0]):
            best = (score, tiled)
    return best[1] if best else None


def flat_sizes(nodes: list) -> list[int]:
    """The sizes of the dims a pointwise kernel's flat index walks, outermost first: the
    anchor's (its first node's) dims other than 1, in its memory order."""
    anchor = nodes[0]
    return [anchor.ranges[d] for d in memory_order(anchor) if anchor.ranges[d] != 1]


def retile(mapping: GroupMapping, outer: int, inner: int) -> GroupMapping:
    """The same mapping with the flat index written as xindex * inner + rindex."""
    return mapping.with_xindex(XINDEX * inner + RINDEX, outer, inner)


def mapped_accesses(nodes: list, mapping: GroupMapping, read_writes: dict[str, ReadWrites],
                    internal: set[str], writes: bool = True) -> Iterator[tuple[MemoryDep, Any]]:
    """Each access to memory of the group's nodes (buffers kept in registers left out), with its
    index in the group's kernel variables; without `writes`, the reads only."""
    for node in nodes:
        rw = read_writes[node.name]
        for dep in (rw.reads | rw.writes if writes else rw.reads):
            if isinstance(dep, MemoryDep) and dep.buffer not in internal:
                yield dep, mapping.nodes[node.name].apply(dep.index, mapping.bounds)


def _coalesced_bytes(nodes: list, tiled: GroupMapping, read_writes: dict[str, ReadWrites],
                     itemsize: dict[str, int], internal: set[str]) -> int | None:
    """Bytes of accesses contiguous along rindex plus along xindex, if both axes have some
    and no access is strided along both (then tiling would not help it)."""
    along_x = along_r = 0
    for dep, index in mapped_accesses(nodes, tiled, read_writes, internal):
        if RINDEX not in index.free_symbols:
            continue  # the same element for a whole row of the tile (a broadcast): no vote
        step_x, step_r = unit_steps(index, tiled.numel, tiled.rnumel)
        if not (step_x or step_r) and (STRIDED_WINDOWS_VOTE or REPEATS_ABSTAIN):
            far_x, far_r = median_steps(index, tiled.numel, tiled.rnumel)
            if REPEATS_ABSTAIN and 0 in (far_x, far_r):
                continue  # one element for runs along an axis (a per-group scale): as a broadcast, no vote
            if STRIDED_WINDOWS_VOTE:
                step_r, step_x = 0 < far_r <= NEAR_STEP, 0 < far_x <= NEAR_STEP
        if step_r:
            along_r += itemsize[dep.buffer]
        elif step_x:
            along_x += itemsize[dep.buffer]
        else:
            return None
    return along_x + along_r if along_x and along_r else None


@functools.lru_cache(maxsize=1 << 14)  # kernels of one shape ask about the same indices again and again
def unit_steps(index, rows: int, columns: int, samples: int = 12) -> tuple[bool, bool]:
    """Whether moving one step along xindex (resp. rindex) moves the address by one element,
    at most sampled points (tiles that straddle a dim boundary are the exception)."""
    along_x, along_r = _step_deltas(index, rows, columns, samples)
    return int(np.sum(along_x == 1)) * 4 >= samples * 3, int(np.sum(along_r == 1)) * 4 >= samples * 3


def median_steps(index, rows: int, columns: int, samples: int = 12) -> tuple[int, int]:
    """How far, in elements, one step along xindex (resp. rindex) moves the address, the median
    over sampled points."""
    along_x, along_r = _step_deltas(index, rows, columns, samples)
    return int(np.median(np.abs(along_x))), int(np.median(np.abs(along_r)))


@functools.lru_cache(maxsize=1 << 14)  # unit_steps and median_steps ask about the same index in turn
def _step_deltas(index, rows: int, columns: int, samples: int) -> tuple[np.ndarray, np.ndarray]:
    """The address moves of one step along xindex and along rindex at `samples` sampled points
    (read-only: the arrays are shared by every caller)."""
    rng = random.Random(0)
    points = [(rng.randrange(max(rows - 1, 1)), rng.randrange(max(columns - 1, 1))) for _ in range(samples)]
    xs, rs = (np.array(column, dtype=np.int64) for column in zip(*points))
    bounds = {XINDEX: max(rows, 2), RINDEX: max(columns, 2)}
    here, right, down = (evaluate(index, {XINDEX: x, RINDEX: r}, bounds) for x, r in ((xs, rs), (xs + 1, rs), (xs, rs + 1)))
    if here is None or right is None or down is None:  # not evaluable with numpy: one point at a time
        here, right, down = ([int(index.xreplace({XINDEX: x + dx, RINDEX: r + dr})) for x, r in points]
                             for dx, dr in ((0, 0), (1, 0), (0, 1)))
        here, right, down = np.array(here), np.array(right), np.array(down)
    return right - here, down - here
