"""The order of a reduction kernel's rows, chosen by how its accesses coalesce.

A reduction kernel walks [XBLOCK, RBLOCK] tiles: rows on xindex, the reduced elements on
rindex. Its rows are the anchor's output dims in order, so consecutive rows are neighbours in
the anchor's output. Another member may lay the same dims out differently: T5's attention
bias is stored (query, key, head) with the heads innermost, while the softmax over keys that
reads it runs its rows (batch, head, query). Along a row, that access then steps over the heads
(2 bytes every 16 for bf16 and 8 heads), and neither tile axis is contiguous for it.

Moving the head dim innermost in the row order makes that access contiguous along xindex: a
block of 8 rows reads and writes whole 16-byte vectors. This stage tries each of the anchor's
row dims as the innermost one and keeps the order under which the most bytes are contiguous
along one tile axis (the reduced elements' accesses stay contiguous along rindex whatever the
row order), if that beats the anchor's own order by ROW_ORDER_MIN_GAIN of the kernel's bytes.
The kernel then needs blocks of at least that dim's size in rows (`KernelGroup.row_block`).
"""

from __future__ import annotations

import math

from compiler.dependencies import ReadWrites
from compiler.indexing import RINDEX, XINDEX, flatten, unflatten
from compiler.loop_mapping import GroupMapping
from compiler.tiling import mapped_accesses, unit_steps

ROW_ORDER_MIN_GAIN = 1 / 8
MAX_ROW_BLOCK = 64  # a dim wider than this is no help: one row block cannot cover it
# A row block times a persistent row's elements (all in registers at once) stays within this: PoolFormer's
# GroupNorm statistics asked for 64 rows of 4096, which need 512 KiB of shared memory (H100, 2026-11-27).
MAX_BLOCK_ELEMENTS = 16384
OWN_ORDER_ROW_BLOCK = True  # off: a block of rows only where the order changes (A/B runs, bench/switch_ab.py)


def choose_row_order(nodes: list, mapping: GroupMapping, read_writes: dict[str, ReadWrites],
                     itemsize: dict[str, int], internal: set[str]) -> tuple[GroupMapping, int] | None:
    """(the reordered mapping, the rows a block needs) for a reduction group whose accesses
    coalesce better with another row dim innermost; None to keep the anchor's order.
    `internal`: the group's buffers that stay in registers (they move no bytes)."""
    anchor = next((n for n in nodes if n.is_reduction), None)
    if anchor is None or mapping.rnumel == 1:
        return None
    sizes = [s for s in anchor.ranges if s != 1]
    if len(sizes) < 2 or math.prod(sizes) != mapping.numel:
        return None
    total, best_score = _coalesced_bytes(nodes, mapping, read_writes, itemsize, internal)
    kept = _block_of_own_order(nodes, mapping, read_writes, internal, sizes)
    if best_score == total:
        return kept  # every access is contiguous already: no order gains
    best: tuple[GroupMapping, int] | None = kept
    for inner in range(len(sizes) - 1):
        if not 4 <= sizes[inner] <= MAX_ROW_BLOCK:  # narrower dims are not contiguous over most of a block
            continue
        if _block_elements(sizes[inner], mapping.rnumel) > MAX_BLOCK_ELEMENTS:
            continue
        order = [d for d in range(len(sizes)) if d != inner] + [inner]
        reordered = reorder_rows(mapping, sizes, order)
        _, score = _coalesced_bytes(nodes, reordered, read_writes, itemsize, internal)
        if score - best_score >= ROW_ORDER_MIN_GAIN * total:
            best, best_score = (reordered, sizes[inner]), score
    return best


def _block_of_own_order(nodes: list, mapping: GroupMapping, read_writes: dict[str, ReadWrites], internal: set[str],
                        sizes: list[int]) -> tuple[GroupMapping, int] | None:
    """(the mapping, the innermost row dim's size) where some access along the rows is contiguous along
    xindex only, in the anchor's own order: a block of one row would read it a lane at a time. CoaT's
    attention context sums 3137 tokens of a (token, head) layout of 8 heads: one row per program read
    2 bytes of every 16 (H100, 2026-11-27: 91.9 us, autotuned to 4 rows 41.3, Inductor 39.2)."""
    if not OWN_ORDER_ROW_BLOCK or not 4 <= sizes[-1] <= MAX_ROW_BLOCK:
        return None  # a block too large to hold whole rows loops over them (codegen/heuristics.py)
    for _, index in mapped_accesses(nodes, mapping, read_writes, internal):
        if XINDEX in index.free_symbols and RINDEX in index.free_symbols:
            step_x, step_r = unit_steps(index, mapping.numel, mapping.rnumel)
            if step_x and not step_r:
                return mapping, sizes[-1]
    return None


def _block_elements(row_block: int, rnumel: int) -> int:
    """Elements a program holds at once with `row_block` rows: a whole persistent row each, or a
    looped step of the heuristic's (codegen/heuristics.py) ~2048 elements."""
    from compiler.codegen.heuristics import GPU_PERSISTENT_LIMIT, next_power_of_2  # codegen imports this module

    rows = next_power_of_2(row_block)
    return rows * next_power_of_2(rnumel) if next_power_of_2(rnumel) <= GPU_PERSISTENT_LIMIT else max(rows, 2048)


def reorder_rows(mapping: GroupMapping, sizes: list[int], order: list[int]) -> GroupMapping:
    """The same mapping with its rows walked in `order` (dims of `sizes`, outermost first):
    each node's old flat row index is rewritten in terms of the new one."""
    digits = dict(zip(order, unflatten(XINDEX, [sizes[d] for d in order])))
    return mapping.with_xindex(flatten([digits[d] for d in range(len(sizes))], sizes), mapping.numel, mapping.rnumel)


def _coalesced_bytes(nodes: list, mapping: GroupMapping, read_writes: dict[str, ReadWrites],
                     itemsize: dict[str, int], internal: set[str]) -> tuple[int, int]:
    """(bytes the kernel moves, of which contiguous along xindex or rindex), up to a common
    factor. Per-row accesses weigh 1/rnumel of an access along the row; an access the same for
    every row (a broadcast vector, a scalar) stays in cache and does not count."""
    total = good = 0
    for dep, index in mapped_accesses(nodes, mapping, read_writes, internal):
        if XINDEX not in index.free_symbols:
            continue
        along_row = RINDEX in index.free_symbols
        weight = itemsize[dep.buffer] * (mapping.rnumel if along_row else 1)
        step_x, step_r = unit_steps(index, mapping.numel, mapping.rnumel)
        total += weight
        good += weight if step_x or (along_row and step_r) else 0
    return total, good
