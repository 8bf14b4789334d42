"""Split reductions: a large reduction with few outputs (a full sum to a scalar, a column
sum of a tall matrix) would give the GPU only a handful of programs, each looping over
a long row. It is rewritten as two reductions: the first reduces S chunks of each row
in parallel into a small buffer, the second reduces the S partial results.

Reductions whose partial results combine with the same reduction (sum, prod, max, min, any)
split into a partial and a final pass of the same kind. A welford reduction (mean and M2, for
variance: BatchNorm's statistics over N, H and W, a handful of channels each reducing millions
of elements) splits into equal chunks, each a welford reduction of its own, then two small sums
combine them: mean = mean of the chunk means, M2 = sum of the chunk M2s + chunk size * sum of the
squared distances of the chunk means to the mean (the parallel variance formula, exact for equal
chunks). argmax/argmin stay whole. Where a power of two divides the row, chunks of such a length
are preferred (split_factor), so that a chunk's loop has no masked tail step.

A column sum over the rows of a row reduction that reads the same input (a LayerNorm backward's
weight gradient beside its input gradient) splits into chunks of CH rows instead, CH chosen by
compiler/mixed_order.py: the scheduler can then run its partial pass inside the row kernel.
"""

from __future__ import annotations

import math
from dataclasses import replace

from compiler.indexing import Expr, FloorDiv, ModularIndexing, affine_coefficients, digit_span, unflatten
from compiler.ir import ComputeNode, Layout, Program, Store
from compiler.mixed_order import MIXABLE, mix_chunk

SPLITTABLE = frozenset({"sum", "prod", "max", "min", "any"})
SPLIT_SUFFIX = "_split"  # names the buffers of a split's partial results
MIN_CHUNK = 1024  # each partial of a row reduction still reduces at least this many contiguous elements
MIN_OUTER_CHUNK = 128  # rows per partial of a column reduction (a program already covers OUTER_XBLOCK columns)
OUTER_XBLOCK = 64  # columns per program of an outer reduction (codegen/heuristics.py)
# The cost model that picks the factor, for the GPUs fusewire targets (an H100 or H200: 132 SMs):
FULL_PROGRAMS = 264  # programs in flight that keep the memory system busy (two per SM)
# ...when each holds its whole chunk in registers (one wide load). A program that loops over a
# longer chunk has one block in flight at a time and wants four per SM. This only picks the factor
# of a split: whether to split at all is judged at FULL_PROGRAMS, since a row reduction left whole
# keeps its consumers in its kernel, which re-read the row from L2 (H100, 2026-11-24, ResNet's
# BatchNorm forward: 128 channels x 25088 whole 16.0 us, in 4 or 8 chunks 19.1 or 17.0 us;
# 64 channels x 100352 in 8 chunks 25.8 us, in 16 22.0 us).
FULL_LOOPED_PROGRAMS = 528
# A column sum's program holds a tile of rows x columns per step and often the arithmetic of the
# pointwise work fused into it (a GELU backward with its bias gradient): it wants eight per SM.
# H100, 2026-11-24, bench/kernels.py with 264 -> 1056 for every reduction: GPT-2's GELU-tanh backward
# + bias sum 0.088 -> 0.068 ms, ViT's GELU backward + sum 0.076 -> 0.063, plain column sums of
# 8192 rows -0.4..+4 %.
FULL_OUTER_PROGRAMS = 1056
# An outer reduction whose columns alone give FULL_PROGRAMS programs of OUTER_XBLOCK stays whole:
# autotuning finds it a tile, and a split only adds a pass. H100, 2026-11-27, bench/switch_ab.py
# (scripts/gpu_switch_ab.sh) with the bound at 132 programs: BERT's and Phi's bias gradients over
# vocabularies of 30522 and 51200 columns 1.02-1.09x faster whole, ConvMixer's means over 24576
# columns 1.05x; ReXNet's over 9600 columns (150 programs) 0.92-1.00x, hence the bound at 264.
WHOLE_OUTER_WHEN_BUSY = True  # off: the cost model below decides for every outer reduction (A/B runs)
ELEMENTS_PER_US = 1_500_000  # bf16 elements streamed per microsecond at ~3 TB/s
LAUNCH_US = 3.0  # what the second kernel of a split costs beyond its bytes (launch, tail, partials)
MAX_FACTOR = 1024
# A chunk length that is a power of two and divides the row is preferred (split_factor), up to this
# many chunks, as Inductor cuts rows. H100, 2026-11-26, bench/switch_ab.py: ConvNeXt's column sum
# of 25088 x 768 bf16 in 196 chunks of 128 rows 23.4 us, in 128 chunks of 196 24.5; Swin's stacked
# sum of 100352 x 288 53.3 against 58.4; ResNet's channels-last BatchNorm forward of 64 x 100352 in
# 784 chunks of 128 27.7 against 24.2 in 512 of 196 (hence the bound); its NCHW max-pool backward +
# BatchNorm backward in 49 chunks of 8192 held in registers 360 against 204 in 16 looped ones (hence
# a row's chunks stay looped or held as the power-of-two factor's are).
MAX_EXACT_FACTOR = 512
EXACT_CHUNKS = True  # bench/switch_ab.py turns it off to time the power-of-two factors alone
# A column reduction's chunk may be one digit of its row (row_digits) of at least this many rows.
MIN_DIGIT_CHUNK = 32
DIGIT_CHUNKS = True  # the digit rule's switch, for bench/switch_ab.py
# A welford column reduction (a channels-last BatchNorm's statistics) needs equal chunks: its factor is
# the largest divisor of the row up to the cost model's, not only a power of two. Inception-v3's
# BatchNorm over 32 x 147 x 147 rows (2^5 x 21609) halved from 1024 to 32 chunks of one image, 256
# programs of 8 of its 64 channels: 115 us for the statistics of 88 MB. In 1008 chunks of 686 rows the
# whole case ran 189 -> 131 us (Inductor 137), and three more of Inception's 5-26 % faster (H100, 2026-11-27).
WELFORD_DIVISOR_CHUNKS = True
SIMPLIFIED_READS = True  # is_outer and row_digits read indices simplified by the node's ranges (off: as written)
SOURCE_DEPTH = 8  # pointwise producers followed back to find a column and a row reduction's shared input
IDENTITY = {"sum": 0, "prod": 1, "any": 0, "max": -math.inf, "min": math.inf}


def split_factor(numel: int, rnumel: int, outer: bool = False, digits: frozenset[int] = frozenset()) -> int:
    """How many chunks to cut each row into (1 = do not split). Split when some factor's estimated
    time beats the whole row's, where too few programs leave bandwidth unused and a split adds a
    kernel; then take the factor that keeps enough programs in flight for their chunk length
    (looped chunks want more of them than chunks held in registers).

    An outer reduction already spreads its outputs over programs of OUTER_XBLOCK columns; one whose
    accesses cut the row at `digits` (row_digits) takes chunks of the smallest such digit that
    keeps as many chunks as the cost model asks for."""
    from compiler.codegen.heuristics import GPU_PERSISTENT_LIMIT, next_power_of_2  # codegen imports this module

    if numel == 0 or rnumel == 0:
        return 1  # nothing to reduce, or no outputs: no second kernel
    programs = -(-numel // OUTER_XBLOCK) if outer else numel
    if outer and WHOLE_OUTER_WHEN_BUSY and programs >= FULL_PROGRAMS:
        return 1
    min_chunk = MIN_OUTER_CHUNK if outer else MIN_CHUNK
    factors = [1 << k for k in range(1, MAX_FACTOR.bit_length()) if rnumel >> k >= min_chunk]

    def looped(factor: int) -> bool:
        return next_power_of_2(-(-rnumel // factor)) > GPU_PERSISTENT_LIMIT

    def estimated_us(factor: int, looped_full: int) -> float:
        full = FULL_OUTER_PROGRAMS if outer else looped_full if looped(factor) else FULL_PROGRAMS
        busy = min(1.0, programs * factor / full)
        return numel * rnumel / ELEMENTS_PER_US / busy + (LAUNCH_US if factor > 1 else 0.0)

    whole = estimated_us(1, FULL_PROGRAMS)
    if not any(estimated_us(f, FULL_PROGRAMS) < whole for f in factors):
        return 1
    best = min(factors, key=lambda f: (estimated_us(f, FULL_LOOPED_PROGRAMS), f))
    aligned = [rnumel // d for d in sorted(digits) if outer and DIGIT_CHUNKS and d >= MIN_DIGIT_CHUNK
               and rnumel % d == 0 and best <= rnumel // d <= MAX_EXACT_FACTOR]
    if aligned:
        return aligned[0]
    if not EXACT_CHUNKS:
        return best
    # Chunks of a power-of-two length that divides the row (their loops have no masked tail), as
    # busy as best's: at least as many, and a row's chunk held in registers or looped as best's is.
    chunks = [1 << k for k in range(min_chunk.bit_length() - 1, rnumel.bit_length()) if rnumel % (1 << k) == 0]
    exact = [rnumel // c for c in chunks if best <= rnumel // c <= MAX_EXACT_FACTOR
             and (outer or looped(rnumel // c) == looped(best))]
    return min(exact, default=best)


def row_digits(node: ComputeNode, producers: dict[str, ComputeNode]) -> frozenset[int]:
    """The row lengths other than powers of two at which a column reduction's row is read in
    pieces (rows N x H x W, read through a per-image value or an NCHW tensor), directly or by a
    pointwise producer of its input (`producers`: by the buffer they store) iterating the same
    rows x columns: d of the node's own `r // d` and `r % d`, and the run of rows that the
    producer reads contiguously (H * W of an NCHW tensor). A chunk of d rows reads such pieces
    whole, with no division in its index math."""
    from compiler.dependencies import node_index_symbols

    _, rindex = node_index_symbols(node)
    symbols = {s for s in rindex if not s.is_Integer}
    if len(symbols) != 1:
        return frozenset()
    digits = set()
    for buffer, read in simplified_reads(node):
        for piece in read.atoms(FloorDiv, ModularIndexing):
            if piece.args[0].free_symbols & symbols:
                digits.update(digit_span(piece, node.rnumel))
        producer = producers.get(buffer)
        if producer is not None:
            digits.update(_contiguous_row_runs(producer, node.numel, node.rnumel))
    return frozenset(d for d in digits if 1 < d < node.rnumel and d & (d - 1))


def _contiguous_row_runs(producer: ComputeNode, columns: int, rows: int) -> set[int]:
    """Over a pointwise producer whose ranges are the rows, then the columns, of a column
    reduction: the rows that each of its accesses reads contiguously along its last row dims."""
    from compiler.dependencies import MemoryDep, extract_read_writes, node_index_symbols

    ranges = list(producer.ranges)
    split = next((k for k in range(len(ranges)) if math.prod(ranges[k:]) == columns), None)
    if split is None or math.prod(ranges[:split]) != rows:
        return set()
    index, _ = node_index_symbols(producer)
    row_dims = [(index[k], ranges[k]) for k in range(split - 1, -1, -1) if ranges[k] != 1]  # innermost first
    runs = set()
    for dep in extract_read_writes(producer).reads:
        affine = affine_coefficients(dep.index, [s for s in index if not s.is_Integer]) \
            if isinstance(dep, MemoryDep) else None
        if affine is None:
            continue
        run = 1
        for symbol, size in row_dims:
            if affine[0].get(symbol, 0) != run:
                break
            run *= size
        runs.add(run)
    return runs


def is_outer(node: ComputeNode) -> bool:
    """A reduction whose loads are contiguous along an output dim, not along a reduced one."""
    from compiler.dependencies import node_index_symbols

    index, rindex = node_index_symbols(node)
    symbols = [s for s in index + rindex if not s.is_Integer]
    for _, read in simplified_reads(node):
        affine = affine_coefficients(read, symbols)
        if affine is None:
            continue
        coefficients = affine[0]
        if not any(s in rindex for s in coefficients):
            continue  # a per-output value broadcast over the reduction says nothing about its shape
        if any(c == 1 for s, c in coefficients.items() if s in index) and \
                not any(c == 1 for s, c in coefficients.items() if s in rindex):
            return True
    return False


def simplified_reads(node: ComputeNode) -> list[tuple[str, Expr]]:
    """(buffer, index) of each memory read of the node, the index simplified by the node's ranges:
    a read through views (GroupNorm's [N, G, C/G * H * W] of a channels-last tensor) is affine, and
    has no digits, only once the divisions and modulos that the ranges make trivial are gone.
    PoolFormer's GroupNorm backward judged one of its two sums over the same tensor inner and the
    other outer, and split the first by a digit its reads did not have."""
    from compiler.dependencies import MemoryDep, extract_read_writes, node_index_symbols
    from compiler.indexing import simplify_index

    index, rindex = node_index_symbols(node)
    bounds = {s: size for s, size in zip(index + rindex, [*node.ranges, *node.reduction_ranges]) if not s.is_Integer}
    return [(dep.buffer, simplify_index(dep.index, bounds) if SIMPLIFIED_READS else dep.index)
            for dep in extract_read_writes(node).reads if isinstance(dep, MemoryDep)]


def split_reductions(program: Program) -> None:
    """Rewrites qualifying reductions in place (program.nodes and program.buffers)."""
    outer = {n.name: is_outer(n) for n in program.nodes if isinstance(n, ComputeNode) and n.is_reduction}
    mixed = mixed_order_factors(program, outer)
    producers = pointwise_producers(program)
    rewritten: list = []
    for node in program.nodes:
        factor = 1
        if node.name in outer:
            factor = mixed.get(node.name) or split_factor(
                node.numel, node.rnumel, outer[node.name],
                row_digits(node, producers) if outer[node.name] else frozenset())
        if factor > 1 and _splittable_welford(node):
            factor = welford_factor(node.rnumel, factor, outer[node.name])
            if factor > 1:
                rewritten.extend(_split_welford(program, node, factor))
                continue
        if factor == 1 or not _splittable(node):
            rewritten.append(node)
            continue
        rewritten.extend(_split(program, node, factor))
    program.nodes[:] = rewritten
    for i, node in enumerate(program.nodes):  # node names encode program order
        node.name = f"op{i}"


def welford_factor(rnumel: int, factor: int, outer: bool) -> int:
    """A factor for a welford reduction, whose chunks must be equal: `factor` where it divides the row
    (a chunk of whole images, split_factor's digit rule), else for a column reduction the largest
    divisor of the row below it that leaves chunks of MIN_OUTER_CHUNK rows or more (1 if none), for a
    row reduction (and with WELFORD_DIVISOR_CHUNKS off) `factor` halved until it divides the row."""
    if outer and WELFORD_DIVISOR_CHUNKS and rnumel % factor:
        return next((f for f in range(factor - 1, 1, -1) if rnumel % f == 0 and rnumel // f >= MIN_OUTER_CHUNK), 1)
    while rnumel % factor:
        factor //= 2
    return factor


def pointwise_producers(program: Program) -> dict[str, ComputeNode]:
    """The pointwise node that stores each buffer, by the buffer's name."""
    return {s.buffer.name: n for n in program.nodes if isinstance(n, ComputeNode) and not n.is_reduction
            for s in n.stores}


def mixed_order_factors(program: Program, outer: dict[str, bool]) -> dict[str, int]:
    """Split factors of the column sums that a row reduction over the same rows shares an input
    with (read directly or through pointwise work): rows / CH, so that each partial covers the CH
    rows of one mixed kernel's program. `outer`: is_outer of every reduction, by name."""
    reductions = [n for n in program.nodes if n.name in outer]
    columns: dict[tuple[int, int], list[ComputeNode]] = {}  # by (rows, row length) of their row partner
    for node in reductions:
        if outer[node.name] and node.reduction_type in MIXABLE and len(node.stores) == 1 \
                and mix_chunk(node.rnumel, node.numel) is not None:
            columns.setdefault((node.rnumel, node.numel), []).append(node)
    sources = _SourceBuffers(program)
    row_sources: dict[tuple[int, int], set[str]] = {}
    for node in reductions:  # only rows that some column sum could pair with are walked
        key = (node.numel, node.rnumel)
        if key in columns and node.rnumel > 1 and not outer[node.name]:
            row_sources.setdefault(key, set()).update(sources.of(node))
    return {node.name: node.rnumel // mix_chunk(node.rnumel, node.numel)
            for key, candidates in columns.items() if key in row_sources
            for node in candidates if sources.of(node) & row_sources[key]}


class _SourceBuffers:
    """The buffers a node reads, and those that pointwise work producing them reads, up to
    SOURCE_DEPTH producers back: a column sum of dy and a row sum of dy * w share dy. Each node's
    own reads are extracted once."""

    def __init__(self, program: Program) -> None:
        self._producer = pointwise_producers(program)
        self._reads: dict[str, frozenset[str]] = {}

    def reads(self, node: ComputeNode) -> frozenset[str]:
        from compiler.dependencies import extract_read_writes

        if node.name not in self._reads:
            self._reads[node.name] = frozenset(extract_read_writes(node).read_buffers())
        return self._reads[node.name]

    def of(self, node: ComputeNode) -> set[str]:
        found = set(self.reads(node))
        frontier = set(found)
        for _ in range(SOURCE_DEPTH):
            producers = {self._producer[b].name: self._producer[b] for b in frontier if b in self._producer}
            frontier = set().union(*(self.reads(p) for p in producers.values())) - found
            found |= frontier
        return found


def _split(program: Program, node: ComputeNode, factor: int) -> list[ComputeNode]:
    chunk = -(-node.rnumel // factor)
    out_dtype = node.stores[0].layout.dtype
    # the chunk dim goes first: each chunk's partial results are then contiguous, like the outputs
    partial_layout = Layout.contiguous([factor] + list(node.ranges), _accumulator_dtype(out_dtype))
    partial = _new_buffer(program, partial_layout)
    kind, total = node.reduction_type, node.rnumel
    original_body, reduction_ranges = node.body, node.reduction_ranges

    def partial_body(ops, index, rindex):
        flat = index[0] * chunk + rindex[0]
        if chunk * factor == total:  # the chunks tile the row exactly: no element past its end
            return original_body(ops, index[1:], unflatten(flat, reduction_ranges))
        inside = ops.lt(ops.index_expr(flat, "int64"), ops.constant(total, "int64"))
        return ops.masked(inside, lambda: original_body(ops, index[1:], unflatten(flat, reduction_ranges)),
                          IDENTITY[kind])

    def final_body(ops, index, rindex):
        return ops.load(partial.name, partial_layout.index([rindex[0]] + list(index)))

    first = ComputeNode(node.name, (factor,) + tuple(node.ranges), (chunk,), partial_body,
                        [Store(partial, partial_layout)], kind, node.origins)
    second = replace(node, name=node.name + "_final", reduction_ranges=(factor,), body=final_body,
                     reduction_type="any" if kind == "any" else kind)
    return [first, second]


def _split_welford(program: Program, node: ComputeNode, factor: int) -> list[ComputeNode]:
    """(mean, M2) of each of `factor` equal chunks, then the mean and the M2 of the whole row."""
    chunk = node.rnumel // factor
    mean_store, m2_store = node.stores
    acc = mean_store.layout.dtype
    partial_layout = Layout.contiguous([factor] + list(node.ranges), acc)
    means, m2s = _new_buffer(program, partial_layout), _new_buffer(program, partial_layout)
    original_body, reduction_ranges = node.body, node.reduction_ranges

    def partial_body(ops, index, rindex):
        return original_body(ops, index[1:], unflatten(index[0] * chunk + rindex[0], reduction_ranges))

    def at(index, rindex):
        return partial_layout.index([rindex[0]] + list(index))

    def mean_body(ops, index, rindex):
        return ops.mul(ops.load(means.name, at(index, rindex)), ops.constant(1.0 / factor, acc))

    def m2_body(ops, index, rindex):
        where = at(index, rindex)
        mean = ops.load(mean_store.buffer.name, mean_store.layout.index(list(index)))
        delta = ops.sub(ops.load(means.name, where), mean)
        return ops.add(ops.load(m2s.name, where), ops.mul(ops.mul(delta, delta), ops.constant(float(chunk), acc)))

    partial = ComputeNode(node.name, (factor,) + tuple(node.ranges), (chunk,), partial_body,
                          [Store(means, partial_layout), Store(m2s, partial_layout)], "welford", node.origins)
    mean = replace(node, name=node.name + "_mean", reduction_ranges=(factor,), body=mean_body, stores=[mean_store],
                   reduction_type="sum")
    m2 = replace(node, name=node.name + "_m2", reduction_ranges=(factor,), body=m2_body, stores=[m2_store],
                 reduction_type="sum")
    return [partial, mean, m2]


def _splittable_welford(node: ComputeNode) -> bool:
    return node.reduction_type == "welford" and len(node.stores) == 2 and \
        all(store.layout.dtype in ("float32", "float64") for store in node.stores)


def _splittable(node: ComputeNode) -> bool:
    if node.reduction_type not in SPLITTABLE or len(node.stores) != 1:
        return False
    dtype = node.stores[0].layout.dtype
    return dtype.startswith("float") or dtype == "bfloat16" or node.reduction_type not in ("max", "min")


def _accumulator_dtype(dtype: str) -> str:
    return "float32" if dtype in ("bfloat16", "float16") else dtype


def rows_before_split(node: ComputeNode) -> int:
    """How many elements each of the node's outputs reduces in all: its reduction's length, times its
    chunks where the node is a split's first pass (ranges (chunks, outputs...), stored into a buffer
    of this module's)."""
    first_pass = node.stores and node.stores[0].buffer.name.endswith(SPLIT_SUFFIX)
    return node.rnumel * node.ranges[0] if first_pass and node.ranges else node.rnumel


def _new_buffer(program: Program, layout: Layout):
    from compiler.ir import Buffer

    buffer = Buffer(f"buf{len(program.buffers)}{SPLIT_SUFFIX}", layout, "computed")
    program.buffers[buffer.name] = buffer
    return buffer
