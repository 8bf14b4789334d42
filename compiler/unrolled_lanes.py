"""Pointwise kernels whose neighbouring outputs read the same inputs: a cell of 2 or 2 x 2 outputs
a point, written out once per lane, the loads the lanes share loaded once. The same cells walk the
pieces of a stack (`_piece_cells`): a short dim, one lane a position, each lane's masks known.

A pool's backward gives each input position the gradients of the windows that chose it. For a
3x3 window of stride 2 that is up to 2 windows per dim: each output loads 4 saved indices and 4
gradients, masked, and computes their positions (`(1 + w) // 2` and the window's cover) in
integer arithmetic of its own. Yet the outputs at rows 2*i and 2*i + 1 and columns 2*j and 2*j + 1
read between them just the windows (i..i+1, j..j+1), and an even position is covered by one window
only. ResNet's max-pool backward over 32 x 64 x 112 x 112 bf16 took 118 us on an H200 that way, an
instruction-bound kernel at 51 % of a copy of its bytes.

Such a kernel walks cells: the unrolled dims are halved, each point of the kernel is one cell,
and its lanes are the cell's outputs. Its mapping writes the flat output index as a function of
xindex and of lane symbols (`LANES`, each 0 or 1), and the kernel writer evaluates the group's
bodies once per lane with the symbols replaced by their values (compiler/codegen/kernel.py). There
the index arithmetic folds: `(1 + 2*j + 1) // 2` is `j + 1`, a window's cover `2 < 3` is true,
and two lanes' loads of one window are the same text, so one load. A lane along the kernel's
innermost dim has a partner at the next element: its contiguous loads are one [XBLOCK, 2] vector
split in two and its stores one joined vector, as a 1D kernel's would be.

A group is unrolled when it gathers (some read divides a sum that moves with the output, as
`(1 + w) // 2`) and the lanes of its best cell share enough of those reads: their distinct
(buffer, index) pairs over all lanes at most SHARED_READS of the reads the lanes make. A pool's
backward of stride 2 shares 9 windows among 16 reads a cell (for each buffer read by window);
its reads at the output's own position (a ReLU's mask, a BatchNorm's input) have no say, nor do
reads that stay in place along an unrolled dim (a token's statistics across its channels: a
broadcast, shared by any walk in cache). A 4x4 window of stride 2 shares all its windows between
a cell's lanes. A pool's
forward reads at `2*w - 1 + j`, no gather: it keeps its form (compiler/paired_lanes.py pairs it).
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass

import numpy as np
import sympy

from compiler.dependencies import ReadWrites
from compiler.index_points import evaluate
from compiler.indexing import XINDEX, Expr, FloorDiv, ModularIndexing, simplify_index
from compiler.loop_mapping import GroupMapping
from compiler.tiling import flat_sizes, mapped_accesses

UNROLLED_LANES = True  # off: such kernels stay 1D, one output a point (A/B runs)
MIN_CELLS = 1024  # fewer cells leave too few programs to gain from sharing
SHARED_READS = 0.75  # distinct gathered reads of a cell's lanes over the gathered reads they make, at most
MAX_UNROLLED_DIMS = 2
PIECE_LANES = True  # off: the piece rule (_piece_cells) is not tried (A/B runs)
MAX_PIECES = 4  # a dim this short may be walked whole, one lane a position, when its pieces' masks fold
LIVE_READS = 0.6  # loads left live over a cell's lanes, over the lanes times the 1D kernel's loads, at most
# ...and the 1D kernel makes at least this many loads an output per piece: pieces that are copies (VOLO's
# and SK-ResNet's stacks, one load a piece) keep the 1D kernel's contiguous stores, which were 6-12 %
# faster on an H200; EVA-02's q/k/v gradient stack, 11 loads for 3 pieces, went 19.2 -> 11.1 us over lanes
MIN_PIECE_LOADS = 2
LANES = tuple(sympy.Symbol(f"lane{i}", integer=True, nonnegative=True) for i in range(MAX_UNROLLED_DIMS))


@dataclass(frozen=True)
class Unrolled:
    """A group's cells: `mapping` walks them (xindex over cells, node indices in terms of the lane
    symbols too), `lanes` bounds each lane symbol (2), `inner` is the lane along the flat index's
    innermost dim, if one is (its partner lane sits at the next element)."""

    mapping: GroupMapping
    lanes: dict[sympy.Symbol, int]
    inner: sympy.Symbol | None

    def assignments(self) -> list[dict[sympy.Symbol, int]]:
        """Every lane's symbol values, the inner lane varying fastest (its partner written next)."""
        symbols = list(self.lanes)
        return [dict(zip(symbols, values)) for values in itertools.product(*(range(self.lanes[s]) for s in symbols))]

    @property
    def count(self) -> int:
        return math.prod(self.lanes.values())


def choose_unrolled(nodes: list, mapping: GroupMapping, read_writes: dict[str, ReadWrites],
                    internal: set[str]) -> Unrolled | None:
    """The cells of a pointwise group whose outputs share reads with their neighbours; None to
    keep its 1D kernel."""
    if not UNROLLED_LANES or any(n.is_reduction for n in nodes) or mapping.rnumel != 1:
        return None
    sizes = flat_sizes(nodes)
    if math.prod(sizes) != mapping.numel:
        return None
    return _gather_cells(nodes, mapping, read_writes, internal, sizes) or \
        (_piece_cells(nodes, mapping, internal, sizes) if PIECE_LANES else None)


def _gather_cells(nodes: list, mapping: GroupMapping, read_writes: dict[str, ReadWrites], internal: set[str],
                  sizes: list[int]) -> Unrolled | None:
    """Cells of 2 or 2 x 2 outputs whose lanes share the windows they gather (a pool's backward)."""
    base = _reads(nodes, mapping, read_writes, internal)
    gathers = [i for i, (_, index) in enumerate(base) if _divides_a_sum(index)]
    if not gathers:
        return None
    even = [d for d, size in enumerate(sizes) if size % 2 == 0 and size > 1]
    moving = {d: {i for i in gathers if _moves_along_dim(base[i][1], sizes, d)} for d in even}
    best: tuple[float, int, Unrolled] | None = None
    for count in range(1, MAX_UNROLLED_DIMS + 1):
        for dims in itertools.combinations(even, count):
            cells = mapping.numel >> count
            if cells < MIN_CELLS:
                continue
            unrolled = _cells(mapping, sizes, {d: 2 for d in dims})
            reads = _reads(nodes, unrolled.mapping, read_writes, internal)
            shared = _shared_share([reads[i] for i in gathers if all(i in moving[d] for d in dims)], unrolled)
            if shared <= SHARED_READS and (best is None or (shared, count) < best[:2]):
                best = (shared, count, unrolled)
    return best[2] if best else None


def _reads(nodes: list, mapping: GroupMapping, read_writes: dict[str, ReadWrites],
           internal: set[str]) -> list[tuple[str, Expr]]:
    """(buffer, index in kernel terms) of each read from memory of the group's nodes, in the same
    order for every mapping of the group."""
    return [(dep.buffer, index) for dep, index in mapped_accesses(nodes, mapping, read_writes, internal, writes=False)]


def _divides_a_sum(index: Expr) -> bool:
    """Whether an index divides a sum that moves with the output (`(1 + w) // 2`): a position
    derived from the output's, which neighbouring outputs may share."""
    return any(isinstance(piece, (FloorDiv, ModularIndexing)) and isinstance(piece.args[0], sympy.Add)
               and XINDEX in piece.args[0].free_symbols
               for piece in sympy.preorder_traversal(index))


def _cells(mapping: GroupMapping, sizes: list[int], counts: dict[int, int]) -> Unrolled:
    """The mapping over cells of `counts[d]` lanes along each dim d (a position in `sizes`,
    outermost first): that dim divided by its count."""
    dims = sorted(counts)
    cell_sizes = [size // counts[d] if d in counts else size for d, size in enumerate(sizes)]
    lanes = {LANES[i]: counts[d] for i, d in enumerate(dims)}
    lane_of = dict(zip(dims, LANES))
    flat, stride, cell_stride = sympy.Integer(0), 1, 1
    for d in reversed(range(len(sizes))):
        coordinate = ModularIndexing(XINDEX, cell_stride, cell_sizes[d]) if d else FloorDiv(XINDEX, cell_stride)
        if d in lane_of:
            coordinate = counts[d] * coordinate + lane_of[d]
        flat += stride * coordinate
        stride *= sizes[d]
        cell_stride *= cell_sizes[d]
    cells = math.prod(cell_sizes)
    inner = lane_of.get(len(sizes) - 1) if counts.get(len(sizes) - 1) == 2 else None
    return Unrolled(mapping.with_xindex(flat, cells, 1, extra_bounds=lanes), lanes, inner)


def lane_index(index: Expr, lane: dict[sympy.Symbol, int], bounds: dict[sympy.Symbol, int]) -> Expr:
    """`index` at one lane of a cell: the lane symbols replaced by their values, simplified."""
    return simplify_index(index.xreplace({s: sympy.Integer(v) for s, v in lane.items()}), bounds)


def _shared_share(reads: list[tuple[str, Expr]], unrolled: Unrolled) -> float:
    """Distinct (buffer, index) pairs over the reads the cell's lanes make."""
    bounds = unrolled.mapping.bounds | unrolled.lanes
    distinct = {(buffer, lane_index(index, lane, bounds)) for buffer, index in reads for lane in unrolled.assignments()}
    made = len(reads) * unrolled.count
    return len(distinct) / made if made else 1.0


def _moves_along_dim(index: Expr, sizes: list[int], d: int, samples: int = 16) -> bool:
    """Whether a read of the 1D kernel (flat output index xindex over `sizes`) reads elsewhere for
    the next output along dim `d`, at some of `samples` sampled outputs. One that never does (a
    token's statistics, read alike across its channels) is a broadcast along `d`: any walk shares
    it, in cache, so it has no say in the cells' choice."""
    stride = math.prod(sizes[d + 1:])
    rng = random.Random(0)
    points = []
    for _ in range(samples):  # outputs whose coordinate along d has a next one
        flat = rng.randrange(math.prod(sizes))
        if (flat // stride) % sizes[d] == sizes[d] - 1:
            flat -= stride
        points.append(flat)
    here, there = (evaluate(index, {XINDEX: np.array(points, dtype=np.int64) + shift}, {XINDEX: math.prod(sizes)})
                   for shift in (0, stride))
    if here is None or there is None:  # not evaluable with numpy: one point at a time
        here = [int(index.xreplace({XINDEX: p})) for p in points]
        there = [int(index.xreplace({XINDEX: p + stride})) for p in points]
    return bool(np.any(np.asarray(here) != np.asarray(there)))


def _piece_cells(nodes: list, mapping: GroupMapping, internal: set[str], sizes: list[int]) -> Unrolled | None:
    """A short dim walked whole, one lane a position, where each lane reads only some of the
    pieces a concatenation or stack joins along it: the pieces' masks compare that dim's index
    with constants, known at each lane, so a lane loads its own piece alone (EVA-02's stack of
    q, k and v gradients, each its own rotary backward). The 1D kernel evaluates every piece's
    masked loads at every output. Taken when the loads left live over all lanes are at most
    LIVE_READS of the lanes times the 1D kernel's loads, and the pieces are work of their own
    (MIN_PIECE_LOADS); the innermost dim is never walked whole."""
    short = [d for d, size in enumerate(sizes[:-1]) if 2 <= size <= MAX_PIECES and mapping.numel // size >= MIN_CELLS]
    if not short:
        return None  # nothing to trace
    made = len(_live_reads(nodes, mapping, {}, internal))
    best: tuple[float, Unrolled] | None = None
    for d in short:
        size = sizes[d]
        if made < MIN_PIECE_LOADS * size:
            continue
        unrolled = _cells(mapping, sizes, {d: size})
        live = sum(len(_live_reads(nodes, unrolled.mapping, lane, internal, unrolled.lanes))
                   for lane in unrolled.assignments())
        share = live / (made * size) if made else 1.0
        if share <= LIVE_READS and (best is None or share < best[0]):
            best = (share, unrolled)
    return best[1] if best else None


def _live_reads(nodes: list, mapping: GroupMapping, lane: dict[sympy.Symbol, int], internal: set[str],
                lanes: dict[sympy.Symbol, int] | None = None) -> list[tuple[str, Expr]]:
    """The loads from memory of the group's bodies at one lane, those under a mask known false
    there left out, as the kernel writer leaves them out (its index arithmetic folds the same way)."""
    bounds = mapping.bounds | (lanes or {})
    recorder = _MaskedLoads(lambda e: lane_index(e, lane, bounds) if lane else e)
    for node in nodes:
        index, rindex = mapping.index_of(node)
        node.body(recorder, index, rindex)
    return [(buffer, index) for buffer, index in recorder.loads if buffer not in internal]


class _MaskedLoads:
    """An ops handler that evaluates index arithmetic and comparisons symbolically (sympy) and
    records the loads a body makes, skipping a masked body whose mask is known false. Every other
    value is opaque (None)."""

    _COMPARE = {"lt": sympy.Lt, "le": sympy.Le, "gt": sympy.Gt, "ge": sympy.Ge, "eq": sympy.Eq, "ne": sympy.Ne}

    def __init__(self, at_lane) -> None:
        self.at_lane = at_lane
        self.loads: list[tuple[str, Expr]] = []

    def load(self, name: str, index: Expr) -> None:
        self.loads.append((name, index))

    def index_expr(self, expr: Expr, dtype: str) -> Expr:
        return self.at_lane(expr)

    def indirect(self, value, size: int) -> sympy.Symbol:
        return sympy.Symbol("indirect", integer=True)  # a gathered position: never known

    def constant(self, value, dtype: str):
        return sympy.Integer(value) if isinstance(value, (bool, int)) else None

    def masked(self, mask, body, other) -> None:
        if mask is not sympy.false:
            body()

    def logical_and(self, a, b):
        return a & b if _known(a) and _known(b) else sympy.false if sympy.false in (a, b) else None

    def logical_or(self, a, b):
        return a | b if _known(a) and _known(b) else sympy.true if sympy.true in (a, b) else None

    def logical_not(self, a):
        return ~a if _known(a) else None

    def __getattr__(self, name: str):
        compare = self._COMPARE.get(name)
        if compare is None:
            return lambda *args, **kwargs: None

        def decided(a, b):
            if not (isinstance(a, sympy.Expr) and isinstance(b, sympy.Expr)):
                return None
            result = compare(a, b)
            return result if result in (sympy.true, sympy.false) else None
        return decided


def _known(value) -> bool:
    return value is sympy.true or value is sympy.false
