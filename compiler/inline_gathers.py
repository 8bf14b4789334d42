"""Recompute instead of materialize: a pointwise node is inlined into its readers, which
evaluate its body at the element they read, and the node itself is then dead, when

- its output is only ever read through indirect indices (a gather, an embedding lookup, the
  target logit of a cross-entropy loss): for cross-entropy this is the difference between
  writing and re-reading the whole [tokens x vocab] log-probability tensor and reading the
  logits once; or
- it *widens*: it reads fewer bytes per element than it writes (a bf16 tensor cast to float32,
  as the backward of a bf16 norm casts its input and incoming gradient). A reader in another
  kernel then reads the narrow input instead of a float32 copy that need not exist; or
- its one reader is pointwise work that reads it at most twice per element of its own, over at
  most MAX_SPREAD times the node's elements: the negated half of a rotary embedding's `cat`, a
  gradient padded back by `slice_backward`, a product read at an element and at its rotated
  partner. No loop of the scheduler can hold such a pair when the reader's iteration space or
  its second index differs; the reader evaluates the node where it reads it (about the same
  arithmetic), and the buffer's write and read are gone.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import sympy

from compiler.dependencies import MemoryDep, ReadWrites, StarDep, extract_read_writes
from compiler.graph import ITEMSIZES
from compiler.indexing import Expr, ModularIndexing, index_symbol
from compiler.ir import ComputeNode, Layout, Program
from compiler.ops import load_view

MAX_INLINE_PASSES = 4


def gathered_producers(program: Program, read_writes: dict[str, ReadWrites] | None = None) -> list[ComputeNode]:
    """The nodes inlining would recompute at their gathered elements (one pass's worth)."""
    read_writes = read_writes or {n.name: extract_read_writes(n) for n in program.nodes}
    uses = _BufferUses(program, read_writes)
    return [n for n in program.nodes if _inlinable(n, read_writes, uses)]


def inline_gathered_producers(program: Program) -> dict[str, ReadWrites] | None:
    """Rewrites readers' bodies in place and drops the producers from the program. Returns the
    dependencies of every node of the program as it leaves it, when it found them (the scheduler
    needs them next), else None."""
    for _ in range(MAX_INLINE_PASSES):
        read_writes = {n.name: extract_read_writes(n) for n in program.nodes}
        candidates = gathered_producers(program, read_writes)
        if not candidates:
            return read_writes
        uses = _BufferUses(program, read_writes)
        for producer in candidates:
            store = producer.stores[0]
            for reader in uses.readers.get(store.buffer.name, []):
                reader.body = _with_inlined(reader.body, store.buffer.name, store.layout, producer)
                # the reader now does the producer's work: kernel names and explain say so
                reader.origins = list(dict.fromkeys(producer.origins + reader.origins))
        # gone at once, not left to dead-node elimination: their own inputs may be inlinable next pass
        inlined = {id(n) for n in candidates}
        program.nodes[:] = [n for n in program.nodes if id(n) not in inlined]


class _BufferUses:
    """Who reads and who writes each buffer, in program order, gathered in one walk (asking per
    node walked the whole program each time: quadratic)."""

    def __init__(self, program: Program, read_writes: dict[str, ReadWrites]) -> None:
        self.readers: dict[str, list] = {}
        self.writers: dict[str, list] = {}
        self.position = {id(n): i for i, n in enumerate(program.nodes)}
        self.outputs = {o.buffer.name for o in program.outputs}
        self.dtypes = {name: buffer.dtype for name, buffer in program.buffers.items()}
        for node in program.nodes:
            for buffer in read_writes[node.name].read_buffers():
                self.readers.setdefault(buffer, []).append(node)
            for buffer in read_writes[node.name].write_buffers():
                self.writers.setdefault(buffer, []).append(node)


def _inlinable(node: Any, read_writes: dict[str, ReadWrites], uses: _BufferUses) -> bool:
    if not isinstance(node, ComputeNode) or node.is_reduction or len(node.stores) != 1:
        return False
    store = node.stores[0]
    name = store.buffer.name
    if store.buffer.kind != "computed" or store.layout.size != store.buffer.layout.size or \
            name in uses.outputs or not store.layout.is_dense() or 0 in store.layout.size:
        return False
    readers = uses.readers.get(name, [])
    if not readers or any(not isinstance(r, ComputeNode) for r in readers):
        return False
    reads_by_readers = [d for r in readers for d in read_writes[r.name].reads if d.buffer == name]
    if not all(isinstance(d, StarDep) for d in reads_by_readers) and not _widens(node, read_writes, uses) \
            and not _read_once_elsewhere(node, readers, reads_by_readers):
        return False  # some reader reads it in order: fusion serves that better than recompute
    writers = [n for n in uses.writers.get(name, []) if n is not node]
    return not writers and _inputs_unchanged(node, readers, read_writes, uses)


BROADCAST_REUSE = 8  # a load whose elements are each read for this many outputs or more comes from cache
# Work that a widening producer's readers would repeat per element: too dear to recompute everywhere
# (a rotary table's sin and cos built from an arange widens, and is better read from memory).
COSTLY_OPS = frozenset({"exp", "exp2", "log", "log2", "log1p", "expm1", "sin", "cos", "tan", "tanh", "sigmoid",
                        "erf", "erfinv", "pow", "atan2", "asin", "acos", "atan", "sinh", "cosh", "lgamma",
                        "rand", "randn"})


def _widens(node: ComputeNode, read_writes: dict[str, ReadWrites], uses: _BufferUses) -> bool:
    """Whether the node reads fewer bytes per output element than it writes. Loads of values
    broadcast over many outputs (a scalar, a per-row mean) cost nothing per element."""
    written = ITEMSIZES[node.stores[0].buffer.dtype]
    sizes = {index_symbol("x", i): size for i, size in enumerate(node.ranges)}
    read = 0
    for dep in read_writes[node.name].reads:
        if not isinstance(dep, MemoryDep) or dep.buffer not in uses.dtypes:
            return False
        footprint = math.prod(sizes.get(symbol, 1) for symbol in dep.index.free_symbols)
        if footprint * BROADCAST_REUSE > node.numel:
            read += ITEMSIZES[uses.dtypes[dep.buffer]]
    return read < written and not (_ops_used(node) & COSTLY_OPS)


MAX_SPREAD = 4  # loads of the node by its reader, at most this many per element of the node


def _read_once_elsewhere(node: ComputeNode, readers: list, reads: list) -> bool:
    """One pointwise reader over another iteration space or loading the node at two places, at
    most MAX_SPREAD loads per element of the node in all (`cat` and padding load each piece masked
    to its place), and no costly ops to repeat."""
    if len(readers) != 1 or not 1 <= len(reads) <= 2:
        return False
    (reader,) = readers
    if reader.ranges == node.ranges and len(reads) == 1:
        return False  # read in the node's own loop: fusing the two serves it, with benchmark-driven fusion's say
    return (not reader.is_reduction and reader.numel * len(reads) <= MAX_SPREAD * node.numel
            and not (_ops_used(node) & COSTLY_OPS))


def _ops_used(node: ComputeNode) -> set[str]:
    recorder = _OpRecorder()
    node.body(recorder, [index_symbol("x", i) for i in range(len(node.ranges))], [])
    return recorder.used


class _OpRecorder:
    """An ops handler that only notes which ops a body calls."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def masked(self, mask: Any, body: Callable[[], Any], other: Any) -> None:
        self.used.add("masked")
        body()

    def indirect(self, value: Any, size: int) -> Any:
        self.used.add("indirect")
        return index_symbol("indirect", 0)

    def __getattr__(self, name: str) -> Callable[..., None]:
        self.used.add(name)
        return lambda *args, **kwargs: None


def _inputs_unchanged(producer: ComputeNode, readers: list, read_writes: dict[str, ReadWrites],
                      uses: _BufferUses) -> bool:
    """Nothing the producer reads is written between it and its last reader."""
    start = uses.position[id(producer)]
    end = max(uses.position[id(r)] for r in readers)
    return not any(start < uses.position[id(w)] < end
                   for buffer in read_writes[producer.name].read_buffers() for w in uses.writers.get(buffer, []))


def _with_inlined(body: Callable, buffer: str, layout: Layout, producer: ComputeNode) -> Callable:
    def inlined_body(ops: Any, index: list, rindex: list) -> Any:
        return body(_InliningOps(ops, buffer, layout, producer), index, rindex)

    return inlined_body


class _InliningOps:
    """Forwards every op; a load of the inlined buffer evaluates its producer at that element."""

    def __init__(self, inner: Any, buffer: str, layout: Layout, producer: ComputeNode) -> None:
        self._inner, self._buffer, self._layout, self._producer = inner, buffer, layout, producer

    def load(self, name: str, index: Expr) -> Any:
        if name != self._buffer:
            return self._inner.load(name, index)
        flat = index - self._layout.offset
        coords = [ModularIndexing(flat, stride, size) for size, stride in zip(self._layout.size, self._layout.stride)]
        return self._evaluate(coords)

    def load_view(self, name: str, view: Layout, index: tuple[Expr, ...]) -> Any:
        """A load through a view, with the reader's coordinates (StorageView.load). A view that is a
        box of the stored layout maps them straight to the producer's coordinates: a masked read
        (padding, `slice_backward`, `cat`) keeps its plain index, `x - 32`, where the storage offset
        taken apart again would be a div/mod chain that only the mask keeps in range."""
        if name != self._buffer:
            return load_view(self._inner, name, view, index)
        coords = box_coordinates(view, self._layout, index)
        return self.load(name, view.index(index)) if coords is None else self._evaluate(coords)

    def _evaluate(self, coords: list[Expr]) -> Any:
        value = self._producer.body(self, coords, [])
        if self._layout.dtype in ("bfloat16", "float16"):
            return value  # never stored: its readers compute on the float32 value, as for a kernel's internal buffers
        return self._inner.to_dtype(value, self._layout.dtype)  # what storing and reloading would give

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def box_coordinates(view: Layout, stored: Layout, index: tuple[Expr, ...]) -> list[Expr] | None:
    """The stored layout's coordinates of `view`'s element `index`, when each dim of the view walks
    one dim of the stored (dense) layout inside its bounds, from a start the offsets give; None
    for any other view (a reshape, a bitcast, overlapping or strided steps)."""
    if view.dtype != stored.dtype:
        return None
    starts = _offset_coordinates(view.offset - stored.offset, stored)
    if starts is None:
        return None
    coords: list[Expr] = [sympy.Integer(s) for s in starts]
    taken: set[int] = set()
    for i, (size, stride) in enumerate(zip(view.size, view.stride)):
        if size == 1 or stride == 0:
            continue  # one element, or a broadcast: the coordinate does not move the offset
        dims = [j for j, (s, st) in enumerate(zip(stored.size, stored.stride)) if st == stride and s != 1 and j not in taken]
        if len(dims) != 1 or starts[dims[0]] + size > stored.size[dims[0]]:
            return None
        taken.add(dims[0])
        coords[dims[0]] = coords[dims[0]] + index[i]
    return coords


def _offset_coordinates(offset: int, stored: Layout) -> list[int] | None:
    """`offset` taken apart over a dense layout's dims, largest stride first; None when outside it."""
    if offset < 0 or offset >= max(stored.numel, 1):
        return None
    coords = [0] * len(stored.size)
    for j in sorted(range(len(stored.size)), key=lambda j: -stored.stride[j]):
        if stored.size[j] != 1:
            coords[j], offset = divmod(offset, stored.stride[j])
    return coords if offset == 0 else None
