"""Pointwise kernels that read their input two elements per output: walked two outputs at a time.

A 3x3 max pool or a 2x2 average pool of stride 2 over NCHW (ResNet's, DenseNet's), or arithmetic
on interleaved (real, imaginary) pairs, reads its input at 2*j + c for output column j: each load
reads every other element, so no load can be a vector, and every window position costs each
output a load of its own. ResNet's 3x3 stride-2 max pool over 32 x 64 x 112 x 112 bf16 ran that
way at 49.4 us on an H100, 59 % of a same-bytes copy (Inductor's 72.2).

Such a kernel is walked as pairs: its flat index becomes 2*xindex + rindex, rindex in {0, 1}, a
2D tile of [XBLOCK, 2] (compiler.tiling's kernels, with the tile's width fixed at 2). A strided
read is then 2*rindex + start + offset, where `start` is a multiple of 4 for every row and the
offset a constant: the two outputs' elements lie in aligned runs of 4, which the kernel loads as
one vector each and takes apart in registers (compiler/codegen/lane_loads.py). The pool above
then loads two runs of 4 per input row for two outputs, where it loaded 3 elements for each,
and stores both outputs with one vector: 36.6 us, 80 % of a copy (H100, 2026-11-28; a hand-written
kernel of this shape took 32.8; docs/PERF.md).

A group is walked in pairs when its flat index splits so (its innermost dim even), some buffer
is read at both parities through such strided reads (elements used densely: a `::2` slice
alone is not), no other access moves otherwise than one element per output or none, and those
buffers hold at least the bytes of the contiguous accesses that the pairs narrow (a pair of
bf16 is a 4-byte vector where a 1D kernel moves 16 bytes a thread): EdgeNeXt's positional
encoding reads a table of 32 frequencies in pairs and writes 6 MB of float32; it stays 1D.
"""

from __future__ import annotations

import sympy

from compiler.dependencies import ReadWrites
from compiler.graph import ITEMSIZES
from compiler.ir import Buffer
from compiler.indexing import RINDEX, XINDEX, Expr
from compiler.loop_mapping import GroupMapping
from compiler.tiling import flat_sizes, mapped_accesses, retile

PAIRED_LANES = True  # off: such kernels stay 1D, one output per lane (A/B runs)
MIN_PAIRS = 1024  # smaller kernels keep their 1D form: too few programs to gain from vectors
RUN = 4  # elements a strided pair of outputs reads as one aligned vector
VECTOR_BYTES = 16  # the widest load or store a thread issues


def pair_read(index: Expr) -> tuple[Expr, int] | None:
    """(start, offset) of an index 2*rindex + start + offset of a paired kernel, `start` a
    multiple of RUN for every row and 0 <= offset < RUN; None for any other index."""
    expanded = sympy.expand(index)
    if expanded.coeff(RINDEX) != 2:
        return None
    rest = sympy.expand(expanded - 2 * RINDEX)
    if rest.free_symbols != {XINDEX}:  # the same element for every row is no strided read
        return None
    constant = 0
    for term in sympy.Add.make_args(rest):
        if term.is_Integer:
            constant += int(term)
            continue
        coefficient = term.as_coeff_Mul()[0]
        if not coefficient.is_Integer or int(coefficient) % RUN:
            return None
    offset = constant % RUN
    return rest - offset, offset


def choose_lanes(nodes: list, mapping: GroupMapping, read_writes: dict[str, ReadWrites],
                 internal: set[str], buffers: dict[str, Buffer]) -> GroupMapping | None:
    """The paired mapping (flat index = 2 * xindex + rindex) for a pointwise group that reads
    pairs; None to keep its 1D kernel. `buffers`: the program's, by name."""
    if not PAIRED_LANES or any(n.is_reduction for n in nodes) or mapping.rnumel != 1:
        return None
    sizes = flat_sizes(nodes)
    if not sizes or sizes[-1] % 2 or mapping.numel % 2 or mapping.numel // 2 < MIN_PAIRS:
        return None
    paired = retile(mapping, mapping.numel // 2, 2)
    written = set().union(*(read_writes[n.name].write_buffers() for n in nodes))
    parities: dict[str, set[int]] = {}
    narrowed: set[str] = set()  # contiguous accesses whose pairs are narrower than a 16-byte vector
    for dep, index in mapped_accesses(nodes, paired, read_writes, internal):
        step = _rindex_step(index)
        if step is None:
            return None
        if step == 2:
            found = pair_read(index)
            if found is None or dep.buffer in written:
                return None
            parities.setdefault(dep.buffer, set()).add(found[1] % 2)
        elif step == 1 and 2 * ITEMSIZES[buffers[dep.buffer].dtype] < VECTOR_BYTES:
            narrowed.add(dep.buffer)
    pairs = {buffer for buffer, found in parities.items() if len(found) == 2}
    paired_bytes = sum(buffers[b].layout.storage_bytes() for b in pairs)
    narrowed_bytes = sum(buffers[b].layout.storage_bytes() for b in narrowed - pairs)
    return paired if pairs and paired_bytes >= narrowed_bytes else None


def _rindex_step(index: Expr) -> int | None:
    """How far an access moves from one lane of a pair to the next (0, 1 or 2); None where it
    moves otherwise or not linearly (the pair would gain nothing or lose its vector)."""
    expanded = sympy.expand(index)
    step = expanded.coeff(RINDEX)
    if RINDEX in sympy.expand(expanded - step * RINDEX).free_symbols or not step.is_Integer:
        return None
    return int(step) if int(step) in (0, 1, 2) else None
