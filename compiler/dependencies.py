"""Read/write memory dependencies of IR nodes, found by running a node's body under a
handler that records loads instead of generating code.

`MemoryDep(buffer, index, ranges)` is one access pattern: the index expression in the
node's own iteration variables. The scheduler compares them to decide whether a
consumer reads exactly what a producer wrote at the same point (fusable), and to order
mutations after earlier reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import sympy

from compiler.indexing import Expr, index_symbol
from compiler.ir import ComputeNode, ExternNode, Node
from compiler.ops import BINARY_OPS, RANDOM_OPS, UNARY_OPS


@dataclass(frozen=True)
class MemoryDep:
    buffer: str
    index: Expr
    ranges: tuple[int, ...]  # iteration space: ranges + reduction_ranges of the node


@dataclass(frozen=True)
class StarDep:
    """A dependency on a whole buffer with no known pattern (extern calls, indirect loads)."""

    buffer: str


Dep = MemoryDep | StarDep


@dataclass
class ReadWrites:
    reads: set[Dep] = field(default_factory=set)
    writes: set[Dep] = field(default_factory=set)
    index_bounds: dict[str, int] = field(default_factory=dict)  # buffer read as indices -> size they index

    def read_buffers(self) -> set[str]:
        return {d.buffer for d in self.reads}

    def write_buffers(self) -> set[str]:
        return {d.buffer for d in self.writes}


@dataclass(frozen=True)
class _Value:
    """Placeholder value: the buffers whose loads flow into it, and whether it is still one of
    their elements as loaded (only converted or selected), not computed from them."""

    sources: frozenset[str] = frozenset()
    as_loaded: bool = False


def _computed(*values: Any) -> _Value:
    return _Value(frozenset().union(*(v.sources for v in values if isinstance(v, _Value))))


class DependencyRecorder:
    def __init__(self, ranges: tuple[int, ...]) -> None:
        self.ranges = ranges
        self.reads: set[Dep] = set()
        self.index_bounds: dict[str, int] = {}
        self._indirect = 0

    def load(self, name: str, index: Expr) -> _Value:
        if any(str(s).startswith("indirect") for s in index.free_symbols):
            self.reads.add(StarDep(name))
        else:
            self.reads.add(MemoryDep(name, sympy.expand(index), self.ranges))
        return _Value(frozenset({name}), as_loaded=True)

    def indirect(self, value: Any, size: int) -> sympy.Symbol:
        """Records the size each index buffer indexes; 0 when its values are computed on first
        (idx * 3): then no fill of the buffer is known to stay in range."""
        value = value if isinstance(value, _Value) else _Value()
        for buffer in value.sources:
            self.index_bounds[buffer] = min(size if value.as_loaded else 0, self.index_bounds.get(buffer, size))
        self._indirect += 1
        return sympy.Symbol(f"indirect{self._indirect}", integer=True)

    def masked(self, mask: Any, body: Any, other: Any) -> _Value:
        return body()

    def constant(self, value: Any, dtype: str) -> _Value:
        return _Value(as_loaded=True)  # the graph's own value: in range or not, whatever the inputs

    def to_dtype(self, value: Any, dtype: str, *args: Any) -> _Value:
        return value if isinstance(value, _Value) else _Value()

    def where(self, condition: Any, a: Any, b: Any) -> _Value:
        chosen = [v if isinstance(v, _Value) else _Value() for v in (a, b)]
        return _Value(chosen[0].sources | chosen[1].sources, chosen[0].as_loaded and chosen[1].as_loaded)

    def __getattr__(self, name: str) -> Any:
        if name in UNARY_OPS or name in BINARY_OPS or name in RANDOM_OPS or name == "index_expr":
            return lambda *args, **kwargs: _computed(*args)
        raise AttributeError(name)


def node_index_symbols(node: ComputeNode) -> tuple[list[Expr], list[Expr]]:
    index = [index_symbol("x", i) if s != 1 else sympy.Integer(0) for i, s in enumerate(node.ranges)]
    rindex = [index_symbol("r", i) if s != 1 else sympy.Integer(0) for i, s in enumerate(node.reduction_ranges)]
    return index, rindex


def buffers_read_and_written(node_names: list[str], read_writes: dict[str, ReadWrites]) -> tuple[set[str], set[str]]:
    """The buffers that the named nodes (a step's) read, and those they write."""
    reads = set().union(*(read_writes[n].read_buffers() for n in node_names))
    writes = set().union(*(read_writes[n].write_buffers() for n in node_names))
    return reads, writes


def traced_loads(trace: Callable[["DependencyRecorder"], Any], ranges: tuple[int, ...]) -> list[MemoryDep] | None:
    """The loads `trace` makes through a recorder, or None when it makes none or one is a gather (its
    index is not known): lowering's look at a value's access pattern before the value is a node."""
    recorder = DependencyRecorder(ranges)
    trace(recorder)
    if not recorder.reads or not all(isinstance(dep, MemoryDep) for dep in recorder.reads):
        return None
    return list(recorder.reads)


def extract_read_writes(node: Node) -> ReadWrites:
    if isinstance(node, ExternNode):
        reads = {StarDep(t.buffer.name) for t in node.tensor_args()}
        writes = {StarDep(b.name) for b in node.outputs} | {StarDep(b.name) for b in node.mutated}
        return ReadWrites(reads, writes)
    index, rindex = node_index_symbols(node)
    recorder = DependencyRecorder(node.ranges + node.reduction_ranges)
    node.body(recorder, index, rindex)
    writes: set[Dep] = set()
    for store in node.stores:
        out_index = node.store_index(store, index, rindex)
        writes.add(MemoryDep(store.buffer.name, sympy.expand(out_index), node.ranges + node.reduction_ranges))
    return ReadWrites(recorder.reads, writes, recorder.index_bounds)
