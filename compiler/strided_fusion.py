"""Fusions refused because they would leave a pointwise producer's memory strided inside a
reduction kernel.

A reduction kernel walks [XBLOCK, RBLOCK] tiles in its anchor's order: the reduced elements
along rindex, its rows along xindex. A pointwise node fused into it is walked in that order too.
When the node's buffers are laid out another way, its accesses step along neither tile axis, each
step a sector or more away. PoolFormer's GroupNorm reduces each image of an NCHW copy of a
channels-last tensor; the copy, fused into the reduction, read and wrote its channels-last buffers
128 elements apart along the row (0.16x Inductor, H100, 2026-11-27). Alone, the same node is a
pointwise kernel that walks its buffers in memory order, or in 2D tiles where they disagree
(compiler/tiling.py).

So a pointwise step joins a reduction group only where more than three quarters of its bytes stay
contiguous along one tile axis, after the row order compiler/row_order.py would pick; along the row
itself where the group reduces fewer than FEW_ROWS rows of LONG_ROW or more that it reads along the
row (such a kernel runs a row or two per program: a step along xindex is a step to another program,
and too few programs run to hide it). PoolFormer's
token mixer (pooled - normed, scaled, added to a channels-last convolution) reads one of its three
inputs channels-last, and fused it took 189 us against Inductor's 182 (H100, 2026-11-27). Bytes
weigh by the size of the buffer accessed, so that a per-channel weight, read again and again from
cache, does not count against the fusion. Rows shorter than MIN_ROW are left alone.
"""

from __future__ import annotations

from compiler.dependencies import MemoryDep, ReadWrites
from compiler.indexing import RINDEX, XINDEX
from compiler.row_order import choose_row_order
from compiler.split_reductions import FULL_LOOPED_PROGRAMS
from compiler.tiling import median_steps, unit_steps

STRIDED_SHARE = 0.25  # the share of a pointwise side's bytes strided along both axes from which it stays apart
MIN_ROW = 32  # rows shorter than this put many rows in a program, whose accesses meet in cache sectors
# An access is strided where one step along either tile axis moves it a whole sector (32 bytes) or more.
# Closer steps share sectors: CaiT's talking-heads softmax reads its (query, key, head) scores 4
# elements apart along the keys, and ran 24.0 us with the producer fused, 30.6 apart (H100, 2026-11-27).
SECTOR_BYTES = 32
REFUSE_STRIDED = True  # bench/census.py and bench/switch_ab.py turn it off to find and time what it changes
# A reduction over rows this long that it reads along the row runs one row or two per program (XBLOCK
# 1-2): an access contiguous only along xindex is strided there too, and where the rows are fewer than
# keep the memory system busy (split_reductions.FULL_LOOPED_PROGRAMS), nothing hides it. BoTNet's
# BatchNorm forward fused the NCHW copy of its channels-last input (64 channels apart along the row)
# and the ReLU's channels-last store into 256 programs of 6272: 39.0 us; judged along the row, the two
# run apart, 14.7 us (Inductor 35.7; H200, 2026-11-29, bench/switch_ab.py). The same rule over any
# number of rows changed 21 cases: the six of fewer rows ran 1.10-2.66x faster (BoTNet's three,
# Mamba-2's, MobileViT's, EdgeNeXt's), while over 768-8192 rows the fused kernels won or tied (CoaT's
# sum over 2048 rows 29.7 against 33.3 us apart, ResNeSt's 36.5 against 51.2, FastViT's 24.8 against
# 28.0) but for PoolFormer's GroupNorm backward (38.4 fused, 33.9 apart). The bound was fitted on
# those 17 timed cases.
LONG_ROW = 1024
FEW_ROWS = FULL_LOOPED_PROGRAMS
LONG_ROWS_BY_ROW_AXIS = True  # off: an access contiguous along either tile axis is never strided


def strided_in_reduction(pointwise_nodes: set[str], group, read_writes: dict[str, ReadWrites],
                         buffer_bytes: dict[str, int], itemsize: dict[str, int], internal: set[str]) -> str:
    """Why the nodes named `pointwise_nodes` (one side of the fusion that made `group`, a
    KernelGroup) should not run inside it: their accesses would be strided; "" when they may.
    `internal`: the group's buffers that would stay in registers (they move no bytes)."""
    if group.mapping.rnumel < MIN_ROW or not REFUSE_STRIDED:
        return ""
    strided, total, mapping = strided_bytes(pointwise_nodes, group, read_writes, buffer_bytes, itemsize, internal)
    if total and strided >= STRIDED_SHARE * total:
        return (f"{strided} of its {total} bytes would be strided in the reduction's "
                f"{mapping.numel}x{mapping.rnumel} tiles: it runs apart, in memory order")
    return ""


def strided_bytes(pointwise_nodes: set[str], group, read_writes: dict[str, ReadWrites], buffer_bytes: dict[str, int],
                  itemsize: dict[str, int], internal: set[str]) -> tuple[int, int, object]:
    """(bytes the nodes named `pointwise_nodes` would access strided along both tile axes of `group`,
    all the bytes they access, the tile mapping judged: the row order row_order.py would pick)."""
    mapping = group.mapping
    reordered = choose_row_order(group.nodes, mapping, read_writes, itemsize, internal)
    if reordered is not None:
        mapping = reordered[0]
    by_row = LONG_ROWS_BY_ROW_AXIS and mapping.rnumel >= LONG_ROW and mapping.numel < FEW_ROWS \
        and _reduces_along_rows(group, read_writes, mapping, pointwise_nodes)
    total = strided = 0
    for node in group.nodes:
        if node.name not in pointwise_nodes:
            continue
        rw = read_writes[node.name]
        for dep in rw.reads | rw.writes:
            if not isinstance(dep, MemoryDep) or dep.buffer in internal:
                continue
            index = mapping.nodes[node.name].apply(dep.index, mapping.bounds)
            if not index.free_symbols & {XINDEX, RINDEX}:
                continue  # one element for the whole kernel
            total += buffer_bytes[dep.buffer]
            if (_far_along_row if by_row else _far_along_both)(index, mapping, itemsize[dep.buffer]):
                strided += buffer_bytes[dep.buffer]
    return strided, total, mapping


def _reduces_along_rows(group, read_writes: dict[str, ReadWrites], mapping, pointwise_nodes: set[str]) -> bool:
    """Whether the group's reductions read some buffer contiguously along the row (a row reduction,
    which runs few rows per program), reads by the fusion's pointwise side left out."""
    for node in group.nodes:
        if not node.is_reduction or node.name in pointwise_nodes:
            continue
        for dep in read_writes[node.name].reads:
            if isinstance(dep, MemoryDep):
                index = mapping.nodes[node.name].apply(dep.index, mapping.bounds)
                if RINDEX in index.free_symbols and unit_steps(index, mapping.numel, mapping.rnumel)[1]:
                    return True
    return False


def _far_along_both(index, mapping, itemsize: int) -> bool:
    if any(unit_steps(index, mapping.numel, mapping.rnumel)):
        return False
    return min(median_steps(index, mapping.numel, mapping.rnumel)) * itemsize >= SECTOR_BYTES


def _far_along_row(index, mapping, itemsize: int) -> bool:
    """Strided for a kernel of one row or a few per program: each step along the row moves a sector
    or more (an access that stays put along the row, a per-row value, is not)."""
    if unit_steps(index, mapping.numel, mapping.rnumel)[1]:
        return False
    return median_steps(index, mapping.numel, mapping.rnumel)[1] * itemsize >= SECTOR_BYTES
