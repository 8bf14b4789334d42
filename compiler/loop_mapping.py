"""Where each node of a fused group runs inside one kernel's iteration space.

A kernel iterates `xindex` over X outputs and `rindex` over R reduction elements (R = 1
for pointwise kernels). Fusing nodes means expressing every node's own loop variables
as functions of (xindex, rindex) such that, at every kernel point, a node that reads a
buffer another member writes reads exactly the element written at that point.

The mapping is found through shared buffers: the anchor (the group's first reduction,
else its first node) maps its loops onto the kernel directly; any other node that
accesses a buffer the mapped nodes access is mapped by inverting its own access
(`a_U(u) == a_M(m(k))` solved for u). Inverting an access also reorders loops: a
transpose + add maps the producer's (i, j) onto the consumer's (j, i) ("loop
reordering"). A node that shares no access with the nodes placed so far is placed by its shape;
where that order is refused, the group is placed again with every access tried first
(ACCESSES_BEFORE_SHAPES). A group whose accesses disagree is refused with the reason.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
from dataclasses import dataclass, field

import numpy as np
import sympy

from compiler.dependencies import MemoryDep, ReadWrites
from compiler.indexing import (
    RINDEX, XINDEX, Expr, FloorDiv, ModularIndexing, affine_coefficients, bounds_key, index_symbol, simplify_index,
    unflatten,
)
from compiler.index_points import evaluate
from compiler.ir import ComputeNode

_EXHAUSTIVE_POINTS = 4096
_EXHAUSTIVE_ONE_TO_ONE = 1 << 16
_APPLIED_KEPT = 4096
_SAMPLED_POINTS = 512


@dataclass
class NodeMapping:
    """A node's loop variables (x_i, r_j symbols) as expressions of xindex/rindex."""

    substitutions: dict[sympy.Symbol, Expr]
    _applied: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # (expr, bounds) -> result

    def apply(self, expr: Expr, bounds: dict[sympy.Symbol, int]) -> Expr:
        key = (expr, bounds_key(bounds))
        if key not in self._applied:
            if len(self._applied) >= _APPLIED_KEPT:  # mappings are shared (_invert_cached): keep this bounded
                self._applied.clear()
            self._applied[key] = simplify_index(expr.xreplace(self.substitutions), bounds)
        return self._applied[key]


@dataclass
class GroupMapping:
    numel: int
    rnumel: int
    nodes: dict[str, NodeMapping]

    @property
    def bounds(self) -> dict[sympy.Symbol, int]:
        return {XINDEX: self.numel, RINDEX: self.rnumel}

    def index_of(self, node: ComputeNode) -> tuple[list[Expr], list[Expr]]:
        """The node's (index, rindex) lists in kernel terms, ready for its body."""
        mapping = self.nodes[node.name]
        index = [mapping.apply(_var("x", i, s), self.bounds) for i, s in enumerate(node.ranges)]
        rindex = [mapping.apply(_var("r", i, s), self.bounds) for i, s in enumerate(node.reduction_ranges)]
        return index, rindex

    def with_xindex(self, flat: Expr, numel: int, rnumel: int, rindex: Expr = RINDEX,
                    extra_bounds: dict[sympy.Symbol, int] | None = None) -> GroupMapping:
        """The same points walked another way: each node's xindex replaced by `flat` (and its rindex
        by `rindex`), expressions of the new kernel's (xindex, rindex) over numel x rnumel (a 2D
        tiling, another row order, a column pass inside a row kernel: compiler/mixed_order.py).
        `extra_bounds`: other symbols `flat` uses and their ranges (a cell's lanes:
        compiler/unrolled_lanes.py)."""
        bounds = {XINDEX: numel, RINDEX: rnumel} | (extra_bounds or {})
        replaced = {XINDEX: flat, RINDEX: rindex}
        nodes = {name: NodeMapping({s: simplify_index(e.xreplace(replaced), bounds)
                                    for s, e in m.substitutions.items()})
                 for name, m in self.nodes.items()}
        return GroupMapping(numel, rnumel, nodes)

    def uses_rindex(self, node: ComputeNode) -> bool:
        return any(RINDEX in e.free_symbols for e in self.nodes[node.name].substitutions.values())


class FusionRefused(ValueError):
    """A group of nodes cannot share one kernel; the message is the WhyNoFuse reason."""


def _var(prefix: str, i: int, size: int) -> Expr:
    return index_symbol(prefix, i) if size != 1 else sympy.Integer(0)


def _space(node: ComputeNode) -> list[tuple[sympy.Symbol, int]]:
    return [(index_symbol("x", i), s) for i, s in enumerate(node.ranges) if s != 1] + \
           [(index_symbol("r", i), s) for i, s in enumerate(node.reduction_ranges) if s != 1]


def map_group(nodes: list[ComputeNode], read_writes: dict[str, ReadWrites]) -> GroupMapping:
    """Maps every node onto one kernel space, or raises FusionRefused."""
    if len(nodes) > 1 and any(0 in n.ranges + n.reduction_ranges for n in nodes):
        raise FusionRefused("an empty loop nest has nothing to share")
    group, by_shape = _mapped_nodes(nodes, read_writes, shapes_last=False)
    try:
        check_consistent(nodes, group, read_writes)
    except FusionRefused:
        if not (ACCESSES_BEFORE_SHAPES and by_shape):
            raise
        group, _ = _mapped_nodes(nodes, read_writes, shapes_last=True)
        check_consistent(nodes, group, read_writes)
    return group


# A node mapped by its shape alone (_same_space_mapping, _row_split_mapping) before the node it shares a
# buffer with was mapped takes its own order, which that buffer's reader may not share: xLSTM's head-wise
# norm permutes (batch, head, time) rows to (batch, time, head) between a division and the reduction, and the
# division, met first, was laid on the rows in its own order, so the group was refused. Where the first
# mapping is refused, the nodes are mapped again with every access inverted before any shape is used.
ACCESSES_BEFORE_SHAPES = True


def _mapped_nodes(nodes: list[ComputeNode], read_writes: dict[str, ReadWrites],
                  shapes_last: bool) -> tuple[GroupMapping, bool]:
    """(every node laid onto the kernel, whether some node was mapped by its shape alone). With
    `shapes_last`, a shape is used only when no pending node shares an access with a mapped one."""
    anchor = next((n for n in nodes if n.is_reduction), nodes[0])
    numel, rnumel = anchor.numel, anchor.rnumel if anchor.is_reduction else 1
    bounds = {XINDEX: numel, RINDEX: rnumel}
    mapped: dict[str, NodeMapping] = {anchor.name: _direct_mapping(anchor, bounds)}
    by_name = {n.name: n for n in nodes}
    pending = [n for n in nodes if n.name != anchor.name]
    by_shape = False
    while pending:
        progress = False
        for node in list(pending):
            mapping, shaped = _inverted_mapping(node, mapped, read_writes, bounds), False
            if mapping is None and not shapes_last:
                mapping = _shape_mapping(node, mapped, by_name, bounds)
                shaped = mapping is not None
            if mapping is not None:
                mapped[node.name], progress, by_shape = mapping, True, by_shape or shaped
                pending.remove(node)
        if not progress and shapes_last:
            for node in pending:
                mapping = _shape_mapping(node, mapped, by_name, bounds)
                if mapping is not None:  # one at a time: the others may now invert an access of this one
                    mapped[node.name], progress, by_shape = mapping, True, True
                    pending.remove(node)
                    break
        if not progress:
            raise FusionRefused(f"no shared access maps {pending[0].name} into the kernel's loops")
    return GroupMapping(numel, rnumel, mapped), by_shape


def _direct_mapping(node: ComputeNode, bounds: dict[sympy.Symbol, int]) -> NodeMapping:
    """The node's loops laid onto the kernel: x dims in the order its output sits in memory
    (so consecutive xindex values are neighbours in memory), r dims in row-major order."""
    substitutions: dict[sympy.Symbol, Expr] = {}
    order = memory_order(node)
    if 0 in node.ranges:  # no outputs: the kernel is never launched
        substitutions |= {index_symbol("x", d): sympy.Integer(0) for d in range(len(node.ranges))}
    else:
        for position, expr in zip(order, unflatten(XINDEX, [node.ranges[d] for d in order])):
            if node.ranges[position] != 1:
                substitutions[index_symbol("x", position)] = simplify_index(expr, bounds)
    if 0 in node.reduction_ranges:  # an empty reduction: the loop never runs, the identity is stored
        substitutions |= {index_symbol("r", d): sympy.Integer(0) for d in range(len(node.reduction_ranges))}
    else:
        for i, expr in enumerate(unflatten(RINDEX, node.reduction_ranges)):
            if node.reduction_ranges[i] != 1:
                substitutions[index_symbol("r", i)] = simplify_index(expr, bounds)
    return NodeMapping(substitutions)


def memory_order(node: ComputeNode) -> list[int]:
    """Dims from the largest to the smallest stride of the node's first output."""
    layout = node.stores[0].layout
    if node.is_reduction or len(layout.stride) != len(node.ranges):
        return list(range(len(node.ranges)))
    return sorted(range(len(node.ranges)), key=lambda d: -layout.stride[d])


def _inverted_mapping(node: ComputeNode, mapped: dict[str, NodeMapping], read_writes: dict[str, ReadWrites],
                      bounds: dict[sympy.Symbol, int]) -> NodeMapping | None:
    """A reduction's own loops (it must span the kernel), or a pointwise node's found by inverting one of
    its accesses onto an access of a mapped node to the same buffer."""
    if node.is_reduction:
        if (node.numel, node.rnumel) != (bounds[XINDEX], bounds[RINDEX]):
            raise FusionRefused(
                f"reduction {node.name} iterates {node.numel}x{node.rnumel}, the kernel {bounds[XINDEX]}x{bounds[RINDEX]}")
        return _direct_mapping(node, bounds)
    mine = _accesses(read_writes[node.name])
    for other_name, other_mapping in mapped.items():
        for (buffer, index, kind), (other_buffer, other_index, other_kind) in itertools.product(
                mine, _accesses(read_writes[other_name])):
            if buffer != other_buffer or (kind == other_kind == "write"):
                continue
            kernel_index = other_mapping.apply(other_index, bounds)
            mapping = _invert(node, index, kernel_index, bounds)
            if mapping is not None:
                return mapping
    return None


def _shape_mapping(node: ComputeNode, mapped: dict[str, NodeMapping], by_name: dict[str, ComputeNode],
                   bounds: dict[sympy.Symbol, int]) -> NodeMapping | None:
    """A node's loops laid by its shape alone, where no access inverts (check_consistent confirms them)."""
    return _same_space_mapping(node, mapped, by_name, bounds) or _row_split_mapping(node, bounds)


def _same_space_mapping(node: ComputeNode, mapped: dict[str, NodeMapping], by_name: dict[str, ComputeNode],
                        bounds: dict[sympy.Symbol, int]) -> NodeMapping | None:
    """A pointwise kernel's node whose loops and output order are those of a node already in it
    takes the same mapping, whatever it reads: two results of one window (a pool's maximum and
    its position) read the input at strided positions that no access inverts."""
    if bounds[RINDEX] != 1:
        return None
    for name in mapped:
        other = by_name[name]
        if not other.is_reduction and other.ranges == node.ranges and memory_order(other) == memory_order(node):
            return mapped[name]  # the same loop variables, laid onto the kernel the same way
    return None


def _row_split_mapping(node: ComputeNode, bounds: dict[sympy.Symbol, int]) -> NodeMapping | None:
    """A pointwise node over as many elements as the reduction has points, whose leading dims
    make the kernel's rows and trailing dims one row, laid out row-major: its leading dims go on
    xindex, its trailing dims on rindex. Such a node shares only per-row buffers with the
    reduction (a cross entropy's backward reads the row's target and the row sum it uses), so no
    access inverts onto both loops; check_consistent then confirms every shared read."""
    if node.is_reduction or bounds[RINDEX] == 1 or memory_order(node) != list(range(len(node.ranges))):
        return None
    for split in range(len(node.ranges) + 1):
        rows, row = math.prod(node.ranges[:split]), math.prod(node.ranges[split:])
        if (rows, row) == (bounds[XINDEX], bounds[RINDEX]):
            break
    else:
        return None
    spread = zip(unflatten(XINDEX, node.ranges[:split]) + unflatten(RINDEX, node.ranges[split:]), node.ranges)
    return NodeMapping({index_symbol("x", d): simplify_index(expr, bounds)
                        for d, (expr, size) in enumerate(spread) if size != 1})


def _accesses(rw: ReadWrites) -> list[tuple[str, Expr, str]]:
    return [(d.buffer, d.index, "read") for d in rw.reads if isinstance(d, MemoryDep)] + \
           [(d.buffer, d.index, "write") for d in rw.writes if isinstance(d, MemoryDep)]


def _invert(node: ComputeNode, access: Expr, kernel_index: Expr, bounds: dict[sympy.Symbol, int]) -> NodeMapping | None:
    """Solves access(u) == kernel_index for the node's variables u, if access is a dense bijection."""
    return _invert_cached(tuple(_space(node)), access, kernel_index, bounds_key(bounds))


@functools.lru_cache(maxsize=1 << 14)
def _invert_cached(space: tuple[tuple[sympy.Symbol, int], ...], access: Expr, kernel_index: Expr,
                   bounds_items: tuple[tuple[sympy.Symbol, int], ...]) -> NodeMapping | None:
    """_invert for a node whose iteration space is `space` (all it depends on of the node)."""
    bounds = dict(bounds_items)
    symbols = [s for s, _ in space]
    if all(size > 0 for _, size in space):  # x1 // 32 is 0 when x1 < 32: views leave such terms
        access = simplify_index(access, dict(space))
    affine = affine_coefficients(access, symbols)
    if affine is None:
        return None
    coefficients, constant = affine
    if len(coefficients) != len(symbols) or any(c <= 0 for c in coefficients.values()):
        return None
    ordered = sorted(space, key=lambda item: coefficients[item[0]])
    for (s0, size0), (s1, _) in zip(ordered, ordered[1:]):
        if coefficients[s1] != coefficients[s0] * size0:
            return None  # not dense: the access skips or overlaps elements
    node_numel = 1
    for _, size in space:
        node_numel *= size
    if XINDEX not in kernel_index.free_symbols and bounds[XINDEX] != 1:
        return None  # would recompute the node for every output row
    kernel_points = (bounds[XINDEX] if XINDEX in kernel_index.free_symbols else 1) * \
        (bounds[RINDEX] if RINDEX in kernel_index.free_symbols else 1)
    if node_numel != kernel_points:
        return None
    if not _one_to_one(kernel_index, bounds):
        return None  # two kernel points would compute one element of the node, and some none
    offset = kernel_index - constant
    substitutions = {s: simplify_index(ModularIndexing(offset, coefficients[s], size), bounds) for s, size in space}
    # the solution must exist: 6*u + 1 == 6*xindex has none (another column of the same rows)
    if not same_index(simplify_index(access.xreplace(substitutions), bounds), kernel_index, bounds):
        return None
    return NodeMapping(substitutions)


def _one_to_one(kernel_index: Expr, bounds: dict[sympy.Symbol, int]) -> bool:
    """Whether no two kernel points give `kernel_index` the same value. A read may reach one element
    from several points (a slice_backward's read, masked to every other row, drops the row's lowest
    digit): inverted, such an access maps the node onto half its elements, twice each (Mamba's
    backward scan). Every point is checked in small kernels; in large ones, sampled points against
    the points one digit away, a digit being any divisor or modulus the index holds (what such an
    index drops)."""
    symbols = sorted(kernel_index.free_symbols, key=str)
    if not symbols:
        return True  # one point
    if any(s not in bounds for s in symbols):
        return False
    total = math.prod(bounds[s] for s in symbols)
    if total <= _EXHAUSTIVE_ONE_TO_ONE:
        grid = np.indices([bounds[s] for s in symbols]).reshape(len(symbols), -1)
        values = evaluate(kernel_index, dict(zip(symbols, grid)), bounds)
        return values is None or len(np.unique(values)) == total
    steps = sorted({1} | {int(a) for piece in kernel_index.atoms(FloorDiv, ModularIndexing)
                          for a in piece.args[1:] if a.is_Integer and a > 0})
    rng = np.random.default_rng(0)
    for symbol in symbols:
        for step in steps:
            if step >= bounds[symbol]:
                continue
            columns = {s: rng.integers(0, bounds[s] - (step if s == symbol else 0), _SAMPLED_POINTS) for s in symbols}
            moved = dict(columns) | {symbol: columns[symbol] + step}
            here, there = evaluate(kernel_index, columns, bounds), evaluate(kernel_index, moved, bounds)
            if here is not None and there is not None and bool(np.any(here == there)):
                return False
    return True


def check_consistent(nodes: list[ComputeNode], group: GroupMapping, read_writes: dict[str, ReadWrites]) -> None:
    """Every read of a buffer written in the group must read, at each kernel point, the element
    written there; a buffer written twice (in-place updates) must be written at the same element."""
    writes: dict[str, tuple[str, Expr]] = {}
    for node in nodes:
        for dep in read_writes[node.name].writes:
            if not isinstance(dep, MemoryDep):
                continue
            index = group.nodes[node.name].apply(dep.index, group.bounds)
            if dep.buffer in writes and not same_index(index, writes[dep.buffer][1], group.bounds):
                raise FusionRefused(f"{writes[dep.buffer][0]} and {node.name} write different elements of {dep.buffer}")
            writes.setdefault(dep.buffer, (node.name, index))
    for node in nodes:
        for dep in read_writes[node.name].reads:
            if dep.buffer not in writes or writes[dep.buffer][0] == node.name:
                continue
            if not isinstance(dep, MemoryDep):
                raise FusionRefused(f"{node.name} reads {dep.buffer} through an indirect index")
            read_index = group.nodes[node.name].apply(dep.index, group.bounds)
            if not same_index(read_index, writes[dep.buffer][1], group.bounds):
                raise FusionRefused(f"{node.name} reads {dep.buffer} at other elements than {writes[dep.buffer][0]} writes")


def same_index(a: Expr, b: Expr, bounds: dict[sympy.Symbol, int]) -> bool:
    """Whether two index expressions agree at every kernel point.

    Symbolic equality first; otherwise evaluated at every point for small kernels, or at
    the corners of each range plus random points for large ones.
    """
    return _same_index_cached(a, b, bounds_key(bounds))


@functools.lru_cache(maxsize=1 << 14)
def _same_index_cached(a: Expr, b: Expr, bounds_items: tuple[tuple[sympy.Symbol, int], ...]) -> bool:
    bounds = dict(bounds_items)
    if sympy.expand(a - b) == 0:
        return True
    symbols = sorted(a.free_symbols | b.free_symbols, key=str)
    if any(s not in bounds for s in symbols):
        return False
    total = 1
    for s in symbols:
        total *= bounds[s]
    if total <= _EXHAUSTIVE_POINTS:
        points = list(itertools.product(*[range(bounds[s]) for s in symbols]))
    else:
        rng = random.Random(0)
        corners = itertools.product(*[(0, 1, bounds[s] - 1) for s in symbols])
        points = list(itertools.chain(corners, ([rng.randrange(bounds[s]) for s in symbols] for _ in range(_SAMPLED_POINTS))))
    agree = _agree_at_points(a, b, symbols, points, bounds)
    if agree is not None:
        return agree
    for point in points:
        values = dict(zip(symbols, map(sympy.Integer, point)))
        if a.xreplace(values) != b.xreplace(values):
            return False
    return True


def _agree_at_points(a: Expr, b: Expr, symbols: list[sympy.Symbol], points: list, bounds: dict[sympy.Symbol, int]) -> bool | None:
    """same_index's point comparison, all points at once (compiler.index_points); None when
    an expression cannot be evaluated that way."""
    coordinates = np.array(points, dtype=np.int64).reshape(len(points), len(symbols))
    columns = {s: coordinates[:, i] for i, s in enumerate(symbols)}
    left, right = evaluate(a, columns, bounds), evaluate(b, columns, bounds)
    if left is None or right is None:
        return None
    return bool(np.array_equal(left, right))
