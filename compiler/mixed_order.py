"""Mixed-order reductions: a row reduction and a column reduction over the same rows, one kernel.

A LayerNorm backward reduces its incoming gradient both ways: along each row (the input gradient
needs sum(dy * w) and sum(dy * w * xhat) per row) and along each column (the weight and bias
gradients sum dy * xhat and dy over the rows). As two kernels, both read dy and x. Here the column
reduction is split (split_reductions) into S partial sums of CH consecutive rows each, and its
partial pass joins the row kernel (Inductor's MixOrderReduction): program p walks rows
[p * CH, (p + 1) * CH) in steps of XBLOCK rows, each step a persistent [XBLOCK, RBLOCK] tile on
which the row kernel's work runs as usual, while the tile's column sums accumulate over the steps.
After its rows the program stores its CH rows' column sums; the split's final pass, a small kernel
of its own, adds the S partials.

In kernel terms the row group keeps its mapping (xindex over rows, rindex along a row), and the
column group's own kernel indices (xindex', rindex') = (s * C + c, r) become
(xindex // CH * C + rindex, xindex % CH): the same element of a shared input at the same point.
"""

from __future__ import annotations

from compiler.dependencies import MemoryDep, ReadWrites
from compiler.indexing import RINDEX, XINDEX, FloorDiv, ModularIndexing
from compiler.loop_mapping import FusionRefused, GroupMapping, check_consistent, same_index

# A row of at most this many elements stays in registers, a few rows per step (GPU; the CPU
# target's persistent limit is lower, see codegen/heuristics.py).
MIX_MAX_ROW = 4096
# Programs a mixed kernel launches at least: one per CH rows, so rows per program shrink until
# the GPU has this many (about four per SM of an H100 or H200). H100, 2026-11-24, LayerNorm
# backwards (mixing forced, graph replays on a cold L2, autotuned): BERT's 4096 x 768 with 256
# programs of 16 rows 20.4 us, 512 of 8 19.3; GPT-2's 8192 x 768 32.4 and 30.0 (unmixed 19.9, 34.1).
MIX_MIN_PROGRAMS = 512
# Rows per program at least: each program writes one partial sum per column, so fewer rows mean
# more partial bytes (1/CH of what the fusion saves reading).
MIX_MIN_CHUNK = 8
# Smaller reductions gain less than a launch: they stay two kernels.
MIX_MIN_ELEMENTS = 1 << 20
MIXABLE = frozenset({"sum"})  # column reductions accumulated over a program's steps
# Every column pass over a row kernel's rows joins it, not only the first (bench/census.py and
# bench/switch_ab.py turn it off to find and time what it changes).
SEVERAL_COLUMN_PASSES = True


def mix_chunk(rows: int, row_length: int) -> int | None:
    """Rows per program (CH) for a mixed kernel over rows x row_length: the largest power of two
    dividing `rows` that leaves MIX_MIN_PROGRAMS programs; None when none is worth it."""
    if rows * row_length < MIX_MIN_ELEMENTS or row_length > MIX_MAX_ROW:
        return None
    chunk = 1
    while rows % (2 * chunk) == 0 and rows // (2 * chunk) >= MIX_MIN_PROGRAMS:
        chunk *= 2
    return chunk if chunk >= MIX_MIN_CHUNK else None


def mixed_group_mapping(row: "KernelGroup", column: "KernelGroup", chunk: int,
                        read_writes: dict[str, ReadWrites]) -> GroupMapping:
    """The mapping of a kernel that runs `row` (rows x C, a reduction along its rows) and the partial
    pass of `column` (S * C outputs of CH rows each, S * CH = rows) together; raises FusionRefused
    when the two do not walk the same rows (no shared input read at the same element)."""
    rows, length = row.numel, row.rnumel
    if column.numel != (rows // chunk) * length or column.rnumel != chunk or rows % chunk:
        raise FusionRefused(f"{column.name} ({column.numel}x{column.rnumel}) is no partial column pass "
                            f"over {row.name}'s {rows} rows of {length}")
    composed = column.mapping.with_xindex(FloorDiv(XINDEX, chunk) * length + RINDEX, rows, length,
                                          rindex=ModularIndexing(XINDEX, 1, chunk))
    mapping = GroupMapping(rows, length, row.mapping.nodes | composed.nodes)
    if not _reads_shared_element(row, column, mapping, read_writes):
        raise FusionRefused(f"{column.name} reads nothing {row.name} touches at the same element: not the same rows")
    nodes = row.nodes + column.nodes
    check_consistent(nodes, mapping, read_writes)
    column_names = row.column_nodes | {n.name for n in column.nodes if n.is_reduction}  # `row` may be mixed already
    column_results = set().union(*(read_writes[n.name].write_buffers() for n in nodes if n.name in column_names))
    for node in nodes:
        if read_writes[node.name].read_buffers() & column_results:
            raise FusionRefused(f"{node.name} reads a column sum, which is whole only after the kernel")
    return mapping


def _reads_shared_element(row, column, mapping: GroupMapping, read_writes: dict[str, ReadWrites]) -> bool:
    """Whether the column group reads, at some kernel point, the element of a buffer that the row
    group reads or writes there (an input both reduce, or a product the row kernel computes)."""
    def accesses(group, kinds):
        return [(n.name, d) for n in group.nodes for kind in kinds for d in getattr(read_writes[n.name], kind)
                if isinstance(d, MemoryDep)]

    for row_node, row_dep in accesses(row, ("reads", "writes")):
        for column_node, column_dep in accesses(column, ("reads",)):
            if row_dep.buffer != column_dep.buffer:
                continue
            ours = mapping.nodes[row_node].apply(row_dep.index, mapping.bounds)
            theirs = mapping.nodes[column_node].apply(column_dep.index, mapping.bounds)
            if RINDEX in ours.free_symbols and same_index(ours, theirs, mapping.bounds):
                return True
    return False


def is_column_pass(group: "KernelGroup") -> bool:
    """A group that can be a mixed kernel's column part: its reductions all sum."""
    reductions = [n for n in group.nodes if n.is_reduction]
    return bool(reductions) and all(n.reduction_type in MIXABLE for n in reductions) and not group.mix_rows


def is_row_pass(group: "KernelGroup") -> bool:
    """A group that can be a mixed kernel's row part: a reduction whose row fits in registers."""
    return group.is_reduction and not group.mix_rows and not group.tiled and 1 < group.rnumel <= MIX_MAX_ROW
