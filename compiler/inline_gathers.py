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

A pass of its own (`inline_transposed_producers`) inlines a *transposed* producer: read by several
readers, a reduction among them, loading no more bytes per element than it stores and storing
along another dim than it loads (an activation's gradient of a channels-last tensor that the meta
kernels lay out NCHW, feeding a norm's backward sums and apply). The scheduler runs it before
reductions are split, on a copy of the program, only where a GPU judge times that schedule
against the other (compiler/scheduler.py).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import sympy

from compiler.dependencies import MemoryDep, ReadWrites, StarDep, extract_read_writes
from compiler.graph import ITEMSIZES
from compiler.indexing import Expr, ModularIndexing, affine_coefficients, index_symbol
from compiler.ir import ComputeNode, Layout, Program
from compiler.ops import load_selected, load_view

MAX_INLINE_PASSES = 4

# (who recomputes, why both schedules were timed): the manifest's record of a recompute-or-store trial
GATHERED_TRIAL = ("their gathering readers", "recompute: results read only through gathers are recomputed at each "
                  "gathered element instead of stored (both whole schedules timed)")
TRANSPOSED_TRIAL = ("their readers, from the inputs", "transposed: results stored along another dim than their "
                    "inputs and read by reductions are recomputed by their readers from the inputs, in the inputs' "
                    "layout, instead of stored (both whole schedules timed)")


def gathered_producers(program: Program, read_writes: dict[str, ReadWrites] | None = None,
                       rule: Callable[..., bool] | None = None) -> list[ComputeNode]:
    """The nodes inlining would recompute at their gathered elements (one pass's worth); with `rule`,
    those that rule picks instead (`_transposed_for_reductions`)."""
    read_writes = read_writes or {n.name: extract_read_writes(n) for n in program.nodes}
    uses = _BufferUses(program, read_writes)
    return [n for n in program.nodes if _inlinable(n, read_writes, uses, rule or _recomputed_cheaper)]


def inline_gathered_producers(program: Program, rule: Callable[..., bool] | None = None) -> dict[str, ReadWrites] | None:
    """Rewrites readers' bodies in place and drops the producers from the program. Returns the
    dependencies of every node of the program as it leaves it, when it found them (the scheduler
    needs them next), else None."""
    for _ in range(MAX_INLINE_PASSES):
        read_writes = {n.name: extract_read_writes(n) for n in program.nodes}
        candidates = gathered_producers(program, read_writes, rule)
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


def transposed_producers(program: Program) -> list[ComputeNode]:
    """The nodes `_transposed_for_reductions` would pick once the widening producers between them and
    their readers are inlined (a bf16 gradient cast to float32 inside a BatchNorm backward)."""
    read_writes = {n.name: extract_read_writes(n) for n in program.nodes}
    uses = _BufferUses(program, read_writes)
    return [n for n in program.nodes if _plain_producer(n, uses) and _feeds_a_reduction(n, uses)
            and _transposes(n, read_writes)
            and _inlinable(n, read_writes, uses, _transposed_for_reductions, through_widening=True)]


def _feeds_a_reduction(node: ComputeNode, uses: _BufferUses) -> bool:
    """A reduction reads the node, or reads a one-store node that reads it (a cast): a cheap test
    before the others (this runs over every node of a graph)."""
    readers = uses.readers.get(node.stores[0].buffer.name, [])
    later = [r2 for r in readers if isinstance(r, ComputeNode) and len(r.stores) == 1
             for r2 in uses.readers.get(r.stores[0].buffer.name, [])]
    return any(isinstance(r, ComputeNode) and r.is_reduction for r in readers + later)


def inline_transposed_producers(program: Program) -> None:
    """Inlines the transposed producers and the widening producers around them (their readers'
    casts, their inputs' broadcasts). The scheduler runs this before it splits reductions, since
    a reduction's split follows the layout it reads: two sums over one channels-last tensor split
    alike and share a kernel, where one of them read the NCHW copy."""
    inline_gathered_producers(program, _transposed_or_widening)


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


def _inlinable(node: Any, read_writes: dict[str, ReadWrites], uses: _BufferUses, rule: Callable[..., bool],
               through_widening: bool = False) -> bool:
    """`through_widening`: a reader that widens (and will be inlined itself) counts as its readers."""
    if not _plain_producer(node, uses):
        return False
    name = node.stores[0].buffer.name
    readers = uses.readers.get(name, [])
    if through_widening:
        readers = [later for r in readers
                   for later in (uses.readers.get(r.stores[0].buffer.name, []) if _widening_reader(r, read_writes, uses)
                                 else [r])]
    if not readers or any(not isinstance(r, ComputeNode) for r in readers):
        return False
    if not rule(node, readers, read_writes, uses):
        return False
    writers = [n for n in uses.writers.get(name, []) if n is not node]
    return not writers and _inputs_unchanged(node, readers, read_writes, uses)


def _plain_producer(node: Any, uses: _BufferUses) -> bool:
    """A pointwise node storing one dense buffer of its own, which no graph output is."""
    if not isinstance(node, ComputeNode) or node.is_reduction or len(node.stores) != 1:
        return False
    store = node.stores[0]
    return not (store.buffer.kind != "computed" or store.layout.size != store.buffer.layout.size or
                store.buffer.name in uses.outputs or not store.layout.is_dense() or 0 in store.layout.size)


def _widening_reader(node: Any, read_writes: dict[str, ReadWrites], uses: _BufferUses) -> bool:
    """A plain producer that widens: the first rules inline it, wherever it is read."""
    return _plain_producer(node, uses) and _widens(node, read_writes, uses)


def _transposed_or_widening(node: ComputeNode, readers: list, read_writes: dict[str, ReadWrites],
                            uses: _BufferUses) -> bool:
    return _widens(node, read_writes, uses) or _transposed_for_reductions(node, readers, read_writes, uses)


def _recomputed_cheaper(node: ComputeNode, readers: list, read_writes: dict[str, ReadWrites], uses: _BufferUses) -> bool:
    """The rules the module docstring lists first (read through gathers, widening, read once
    elsewhere); transposed producers have a pass of their own."""
    reads_by_readers = [d for r in readers for d in read_writes[r.name].reads if d.buffer == node.stores[0].buffer.name]
    # otherwise some reader reads it in order: fusion serves that better than recompute
    return all(isinstance(d, StarDep) for d in reads_by_readers) or _widens(node, read_writes, uses) \
        or _read_once_elsewhere(node, readers, reads_by_readers)


BROADCAST_REUSE = 8  # a load whose elements are each read for this many outputs or more comes from cache
# Work that a widening producer's readers would repeat per element: too dear to recompute everywhere
# (a rotary table's sin and cos built from an arange widens, and is better read from memory).
COSTLY_OPS = frozenset({"exp", "exp2", "log", "log2", "log1p", "expm1", "sin", "cos", "tan", "tanh", "sigmoid",
                        "erf", "erfinv", "pow", "atan2", "asin", "acos", "atan", "sinh", "cosh", "lgamma",
                        "rand", "randn"})


def _widens(node: ComputeNode, read_writes: dict[str, ReadWrites], uses: _BufferUses) -> bool:
    """Whether the node reads fewer bytes per output element than it writes."""
    read = _bytes_read_per_element(node, read_writes, uses)
    return read is not None and read < ITEMSIZES[node.stores[0].buffer.dtype] and not (_ops_used(node) & COSTLY_OPS)


def _bytes_read_per_element(node: ComputeNode, read_writes: dict[str, ReadWrites], uses: _BufferUses,
                            through_widening: bool = False) -> int | None:
    """Bytes the node loads per output element; loads of values broadcast over many outputs (a
    scalar, a per-row mean) cost nothing per element. None when a load is not a plain one. With
    `through_widening`, a load of a widening producer's result (inlined later) costs what that
    producer loads per element (an expanded gradient divided by the pixels it was averaged over)."""
    sizes = {index_symbol("x", i): size for i, size in enumerate(node.ranges)}
    read = 0
    for dep in read_writes[node.name].reads:
        if not isinstance(dep, MemoryDep) or dep.buffer not in uses.dtypes:
            return None
        footprint = math.prod(sizes.get(symbol, 1) for symbol in dep.index.free_symbols)
        if footprint * BROADCAST_REUSE <= node.numel:
            continue
        writers = uses.writers.get(dep.buffer, [])
        if through_widening and len(writers) == 1 and _widening_reader(writers[0], read_writes, uses):
            read += _bytes_read_per_element(writers[0], read_writes, uses) or 0
        else:
            read += ITEMSIZES[uses.dtypes[dep.buffer]]
    return read


# Math a memory-bound reader repeats for free: one or two special-function instructions per element.
# Trigonometry, powers and the like stay COSTLY for the rule below.
CHEAP_TRANSCENDENTALS = frozenset({"exp", "exp2", "log", "log2", "log1p", "expm1", "sigmoid", "tanh", "erf"})


def _transposed_for_reductions(node: ComputeNode, readers: list, read_writes: dict[str, ReadWrites],
                               uses: _BufferUses) -> bool:
    """Several readers, a reduction among them, no more bytes read per element than written, and
    a store that runs along another dim than the node's loads: an activation's gradient (SiLU's,
    GELU's) of a channels-last tensor that the meta kernels lay out NCHW, feeding a norm's backward
    sums and apply. Each reader recomputes it from its inputs, in their layout: the same bytes
    read, the write saved, and the norm's kernels no longer read one tensor across the other."""
    if len(readers) < 2 or not any(r.is_reduction for r in readers) or not _transposes(node, read_writes):
        return False
    read = _bytes_read_per_element(node, read_writes, uses, through_widening=True)
    return read is not None and read <= ITEMSIZES[node.stores[0].buffer.dtype] and \
        not (_ops_used(node) & (COSTLY_OPS - CHEAP_TRANSCENDENTALS))


def _transposes(node: ComputeNode, read_writes: dict[str, ReadWrites]) -> bool:
    """Whether the node's store is contiguous along one of its dims and a load that reads an element
    per output element is contiguous along another."""
    symbols = [index_symbol("x", i) for i, size in enumerate(node.ranges) if size != 1]

    def unit_dim(dep: Any) -> Any:
        affine = affine_coefficients(dep.index, symbols) if isinstance(dep, MemoryDep) else None
        units = [s for s, c in affine[0].items() if c == 1] if affine is not None else []
        return units[0] if len(units) == 1 and len(affine[0]) == len(symbols) else None

    (store,) = read_writes[node.name].writes
    stored = unit_dim(store)
    return stored is not None and any(unit_dim(d) not in (None, stored) for d in read_writes[node.name].reads)


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

    def rewrapped(self, wrap: Callable[[Any], Any]) -> "_InliningOps":
        """This handler over `wrap` of the handler it forwards to (through any inliners below it):
        masked_pieces puts its index placement under every inlined producer's loads this way."""
        inner = self._inner.rewrapped(wrap) if hasattr(type(self._inner), "rewrapped") else wrap(self._inner)
        return _InliningOps(inner, self._buffer, self._layout, self._producer)

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

    def load_selected(self, buffers: tuple[str, ...], selector: Expr, index: Expr) -> Any:
        """A read of like buffers as one (compiler.ops.load_selected); None where one of them is the
        producer inlined here, which has no memory to read."""
        if self._buffer in buffers:
            return None
        return load_selected(self._inner, buffers, selector, index)

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
