"""`KernelWriter`: the ops handler that prints one Triton kernel.

Node bodies call it (compiler/ops.py is the vocabulary); it appends lines to the
current *section* of the kernel with common-subexpression elimination. A kernel is a
sequence of sections: x-sections (per output row, shape [XBLOCK] or [XBLOCK, 1]) and
r-sections (per reduction element, [XBLOCK, RBLOCK], each a loop over the reduction
unless the kernel is persistent). A value stored by one node and loaded by another in
the same kernel is reused from registers when the load is visible from the store's
section; such buffers are dropped entirely when nothing outside the kernel reads them.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import sympy

from compiler.codegen.lane_loads import lane_load
from compiler.codegen.printer import texpr
from compiler.codegen.triton_ops import CodegenError, TritonMathOps
from compiler.codegen.values import TL_DTYPES, Var, is_float, literal, promote
from compiler.indexing import RINDEX, XINDEX, Expr, FloorDiv, ModularIndexing, digit_span, simplify_index, upper_bound
from compiler.unrolled_lanes import Unrolled, lane_index

__all__ = ["KernelWriter", "Section", "StoreLine", "LoadLine", "CodegenError", "ROW_ALIGN"]

# Row windows (looped inner reductions): a row whose stride is no multiple of this many elements
# (GPT-2's 50257-token vocabulary) starts mid-vector, so none of its loads can be 16-byte vectors.
# Its loop then walks the row from the aligned element before it, masking the few lanes outside
# it: 16 elements are 16 bytes or more for every dtype.
ROW_ALIGN = 16
# Under Triton's interpreter (the "cpu" target) a looped Welford reduction joins its lanes by sums
# (the weighted mean, then each lane's M2 and spread about it): the interpreter folds Chan's update
# over the lanes one at a time, rounding at each, and ReXNet's BatchNorm statistics erred 18x eager's
# (its training step failed the float64 rule). A GPU folds them in a tree, and there the sums' two
# passes over the lanes were 3-6 % slower on BatchNorm statistics of 4096-8192 lanes (1.002x over 30
# cases; H100, 2026-11-27): cuda targets keep the fold. Off: the fold everywhere (A/B runs).
WELFORD_LANES_BY_SUMS = True
# A value this kernel stored serves a masked read of it from registers too (the mask only picks the
# lanes that use it): a slice_scatter into the result of another, its base masked to the positions it
# keeps (lowering/shapes.py MASKED_SCATTER_BASE), read the first one back from memory.
REUSE_UNDER_MASKS = True  # off: masked reads go to memory (A/B runs, bench/switch_ab.py)
RPOS = sympy.Symbol("rpos", integer=True, nonnegative=True)  # a lane's position in its aligned row window
PID = sympy.Symbol("pid", integer=True, nonnegative=True)  # a mixed-order kernel's program id


@dataclass
class StoreLine:
    """A store, kept as data until the kernel knows whether the buffer must reach memory."""

    buffer: str
    text: str


@dataclass
class LoadLine:
    """A load, kept as data until the kernel knows its cache policy (see group.eviction_policy)."""

    buffer: str
    text: str  # "var = tl.load(...": the closing parenthesis comes with the policy
    # the same elements for every row (a weight, a bias) or for runs of a row (GroupNorm's per-channel
    # weight over its group's rows): read again and again, worth keeping in L2
    reread: bool


def _pair_offsets(first: str) -> str:
    """The [XBLOCK, 2] offsets of an element and its neighbour, from the [XBLOCK] offsets `first`."""
    return f"({first})[:, None] + tl.arange(0, 2)[None, :]"


@dataclass
class Section:
    kind: str  # "x" or "r"
    shape: str
    mask: str
    lines: list[str | StoreLine | LoadLine] = field(default_factory=list)
    cache: dict[str, Var] = field(default_factory=dict)


class KernelWriter(TritonMathOps):
    def __init__(self, name: str, numel: int, rnumel: int, is_reduction: bool, persistent: bool,
                 index_dtype: str, buffer_dtypes: dict[str, str], group_writes: set[str], portable_math: bool,
                 tiled: bool = False, unrounded: frozenset[str] = frozenset(), row_windows: bool = False,
                 mix_rows: int = 0, reverse_programs: bool = False, reread_later: frozenset[str] = frozenset(),
                 lane_extents: dict[str, int] | None = None, unrolled: Unrolled | None = None) -> None:
        """`unrounded`: buffers no other kernel reads (the group's internal ones). Their readers here
        get the float32 value itself, as Inductor's do: rounding it to a bf16/fp16 buffer's dtype would
        cost two conversions per element and value and make the result no more accurate.
        `row_windows`: a looped inner reduction may walk misaligned rows in aligned windows (ROW_ALIGN).
        `mix_rows`: a mixed-order kernel's rows per program (compiler/mixed_order.py): its sections
        run in a loop over the program's rows, XBLOCK at a time, and `reduce_columns` sums along
        the rows across that loop.
        `reverse_programs`, `reread_later`: see compiler.l2_reuse.
        `lane_extents`: a paired kernel's (compiler.paired_lanes) buffers and the elements their
        storage holds; its strided reads become aligned vector loads (compiler.codegen.lane_loads).
        `unrolled`: a kernel over cells (compiler.unrolled_lanes): the group's bodies are written once
        per lane (`lane` set to the lane's symbol values), and a lane's index expressions are
        evaluated at its values."""
        self.name = name
        self.row_windows = row_windows and is_reduction and not persistent and not tiled
        self.row_stride: int | None = None  # set once a row window is in use: the stride of its rows
        self.unrounded = unrounded
        self.is_reduction = is_reduction or tiled  # both are 2D: [XBLOCK, RBLOCK] blocks
        self.tiled = tiled
        self.persistent = persistent or tiled
        self.index_dtype = index_dtype
        self.buffer_dtypes = buffer_dtypes
        self.group_writes = group_writes
        self.portable_math = portable_math
        self.bounds = {XINDEX: numel, RINDEX: rnumel}
        self.setup: list[str] = []
        self.sections: list[Section] = []
        self.section: Section | None = None
        self.pointers: dict[str, str] = {}  # buffer name -> kernel argument name
        self.helpers: set[str] = set()
        self.counts_steps = False  # a looped Welford reduction weighs each lane by `rstep` (group._loop_headers)
        self.missed_loads: set[str] = set()  # group-written buffers that had to be read from memory
        self._stored: dict[str | tuple[str, str], tuple[Var, int]] = {}  # by buffer or (buffer, offset text)
        self._recompute: dict[str | tuple[str, str], Callable[[], Var]] = {}
        self._masks: list[str] = []
        self._counter = 0
        self._index_vars: dict[Expr, str] = {}
        self._twins: dict[str, tuple[str, tuple[int, int]]] = {}  # compiler.codegen.int_narrowing
        self._shared_caches = {"x": {}, "r": {}}
        self.pending_after: list[str] = []  # lines that must follow the loop just written
        self.mix_rows = mix_rows
        self.reverse_programs = reverse_programs
        self.reread_later = reread_later
        self.lane_extents = lane_extents
        self.unrolled = unrolled
        self.lane: dict[sympy.Symbol, int] | None = None  # the lane being written, in a kernel over cells
        self._lane_partners: dict[tuple, tuple[Expr, str]] = {}  # an inner lane 0's store, awaiting lane 1's
        self._known_bools: dict[str, bool] = {}  # conditions whose value the kernel's text already fixes
        self._dead = 0  # > 0 inside a masked body whose mask is known false: its loads read nothing
        if unrolled is not None:
            self.bounds.update(unrolled.lanes)
        self.program_id: str | None = None  # a part's program number, passed in (compiler.parallel_passes)
        if mix_rows:
            self.bounds[PID] = max(1, -(-numel // mix_rows))
        self.before_rows: list[str] = []  # a mixed-order kernel's lines before its loop over rows
        self.after_rows: list[str] = []  # ...and after it: the column sums and their stores
        self.loop_stages = 1  # steps a loop's loads run ahead (group.loop_header); set once the kernel is written

    # --- sections -------------------------------------------------------------------
    def open_section(self, kind: str) -> Section:
        if kind == "r":
            section = Section("r", "[XBLOCK, RBLOCK]", "rxmask")
        else:
            section = Section("x", "[XBLOCK, 1]" if self.is_reduction else "[XBLOCK]", "xmask")
        if self.persistent:  # straight-line code: values stay visible to later sections of the same kind
            section.cache = self._shared_caches[kind]
        section.lines.extend(self.pending_after)
        self.pending_after = []
        self.sections.append(section)
        self.section = section
        return section

    def _visible(self, defined_in: int) -> bool:
        current = len(self.sections) - 1
        if defined_in == current:
            return True
        kind = self.sections[defined_in].kind
        return defined_in < current and (kind == "x" or (self.persistent and self.section.kind == "r"))

    # --- emitting ---------------------------------------------------------------------
    def _fresh(self, prefix: str = "tmp") -> str:
        self._counter += 1
        return f"{prefix}{self._counter}"

    def emit(self, expression: str, dtype: str, line: Callable[[str], str | LoadLine] | None = None) -> Var:
        """A variable holding `expression` (reused if this section already has one); `line`
        writes its line from the variable's name when it is not `name = expression`."""
        cached = self.section.cache.get(expression)
        if cached is None and self.section.kind == "r":
            cached = self._from_row_sections(expression)
        if cached is not None:
            return cached
        var = Var(self._fresh(), dtype)
        self.section.lines.append(line(var.name) if line else f"{var.name} = {expression}")
        self.section.cache[expression] = var
        return var

    def _from_row_sections(self, expression: str) -> Var | None:
        """A per-row value an earlier x-section already computed (rstd = rsqrt(var / n + eps), which
        a LayerNorm's normalization evaluates again in its r-section): x-section values stay visible
        to every later section, and [XBLOCK, 1] broadcasts against the row. Loads are not taken:
        the kernel may have stored to that buffer since (a running statistic updated in place)."""
        if expression.startswith("tl.load("):
            return None
        for section in reversed(self.sections):
            if section.kind == "x" and expression in section.cache:
                return section.cache[expression]
        return None

    def pointer(self, buffer: str) -> str:
        return self.pointers.setdefault(buffer, f"ptr_{buffer}")

    def index(self, expr: Expr) -> str:
        """Triton text for an index expression; x-only div/mod terms become named variables."""
        return self._index_text(simplify_index(expr, self.bounds))

    def _in_lane(self, expr: Expr) -> Expr:
        """`expr` at the lane being written (a kernel over cells); `expr` itself elsewhere."""
        return expr if self.lane is None else lane_index(expr, self.lane, self.bounds)

    def _index_text(self, expr: Expr) -> str:
        if not expr.free_symbols:
            return f"tl.full({self.section.shape}, {int(expr)}, tl.int32)"
        if self.row_windows and RINDEX in expr.free_symbols:
            expr = self._in_row_window(expr)
        return texpr(expr, self._name_index_term)

    def _in_row_window(self, expr: Expr) -> Expr:
        """`expr` (rindex + stride * xindex + ...) as rpos + ROW_ALIGN * ((stride * xindex) // ROW_ALIGN) + ...:
        the same element, since the loop defines rindex = rpos - (stride * xindex) % ROW_ALIGN, but
        now Triton sees a 16-byte aligned start and contiguous lanes, and vectorizes the access. The
        first such row whose stride is no multiple of ROW_ALIGN turns the windows on (group.assemble
        then writes the window loops); other indices keep their plain rindex text, just as correct."""
        rest = expr - RINDEX
        stride = rest.coeff(XINDEX)
        if RINDEX in rest.free_symbols or not stride.is_Integer:
            return expr
        stride = int(stride)
        if self.row_stride is None:
            if stride < self.bounds[RINDEX] or stride % ROW_ALIGN == 0:
                return expr
            self.row_stride = stride
        if stride != self.row_stride:
            return expr
        return RPOS + ROW_ALIGN * FloorDiv(stride * XINDEX, ROW_ALIGN) + (rest - stride * XINDEX)

    def _name_index_term(self, expr: Expr) -> str | None:
        if not isinstance(expr, (FloorDiv, ModularIndexing)) or expr.free_symbols != {XINDEX}:
            return None
        if expr not in self._index_vars:
            name = f"x{len(self._index_vars)}"
            self._index_vars[expr] = name
            self.setup.append(f"{name} = {texpr(expr)}")
        return self._index_vars[expr]

    def current_mask(self) -> str:
        return " & ".join([self.section.mask] + self._masks)

    # --- loads, stores and the non-math ops ------------------------------------------------
    def _reads_elements_again(self, index: Expr) -> bool:
        """Whether a pointwise kernel's load reads its elements more than once (a position
        embedding added to every sequence of a batch, a token's id read for each of its features):
        an unmasked load spans fewer elements than the kernel has, or any load skips some of
        xindex's digits (a masked one reads only where its mask holds: a cat's input spans less)."""
        if self.is_reduction:
            return False
        if not self._masks:  # every program reads: fewer elements than programs means some read twice
            bound = upper_bound(index, self.bounds)
            if bound is not None and bound + 1 < self.bounds[XINDEX]:
                return True
        return skips_digits(index, self.bounds[XINDEX])

    def load(self, buffer: str, index: Expr) -> Var:
        if self._dead:
            return self.constant(0, self.buffer_dtypes[buffer])
        symbolic = index
        index = simplify_index(self._in_lane(index), self.bounds)
        offset = self._index_text(index)
        key = self._stored_key(buffer, offset)
        stored = self._stored.get(key)
        if stored is not None and self._visible(stored[1]) and (REUSE_UNDER_MASKS or not self._masks):
            return stored[0]
        recompute = self._recompute.get(key)
        if recompute is not None and not self._masks:
            return self._as_read(buffer, recompute())
        if buffer in self.group_writes:
            self.missed_loads.add(buffer)
        dtype = self.buffer_dtypes[buffer]
        # an empty loop (a reduction over no elements) reads nothing: its index may still fold to a constant
        scalar = not index.free_symbols and not self._masks and all(self.bounds.values())
        if self.lane_extents is not None and not scalar:
            paired = lane_load(self, buffer, index, self.lane_extents[buffer])
            if paired is not None:
                return paired
        if self.lane is not None and not scalar:
            pair = self._partner_lanes_load(buffer, symbolic)
            if pair is not None:
                return pair
        if scalar:  # one element for the whole block (a learning rate, a scalar tensor): one scalar load
            # per thread, broadcast in registers, not one load per element the thread holds
            call = f"tl.load({self.pointer(buffer)} + {int(index)}"
        else:
            call = f"tl.load({self.pointer(buffer)} + {offset}, {self._load_mask(index)}, other=0"
        reread = self._reread(index)
        raw = self.emit(call, dtype, lambda name: LoadLine(buffer, f"{name} = {call}", reread))
        if scalar:
            raw = self.emit(f"tl.broadcast_to({raw}, {self.section.shape})", dtype)
        return self.computed(raw)

    def computed(self, loaded: Var) -> Var:
        """A loaded value in the dtype kernels compute in: bf16 and fp16 widen to float32."""
        if loaded.dtype in ("bfloat16", "float16"):
            return self.emit(f"{loaded}.to(tl.float32)", "float32")
        return loaded

    def load_selected(self, buffers: tuple[str, ...], selector: Expr, index: Expr) -> Var | None:
        """One load at `index` from `buffers[selector]` (a cat of many like pieces: compiler.ops
        `load_selected`): the piece's pointer is chosen per element, then read once, where a load
        under each piece's mask costs every element one predicated load per piece. None where the
        kernel cannot take it: it writes one of the buffers, its loads go by lanes, or the buffers'
        dtypes differ; the caller then reads piece by piece."""
        if self._dead or self.lane is not None or self.lane_extents is not None:
            return None
        if any(b in self.group_writes for b in buffers):  # every buffer the kernel stores is among them
            return None
        dtypes = {self.buffer_dtypes[b] for b in buffers}
        if len(dtypes) != 1:
            return None
        (dtype,) = dtypes
        chosen = self._index_text(simplify_index(selector, self.bounds))
        pointers = [self.pointer(b) for b in buffers]
        pointer = pointers[-1]
        for k in reversed(range(len(buffers) - 1)):
            pointer = f"tl.where({chosen} == {k}, {pointers[k]}, {pointer})"
        base = self.emit(pointer, "pointer")
        index = simplify_index(index, self.bounds)
        call = f"tl.load({base} + {self._index_text(index)}, {self._load_mask(index)}, other=0"
        # each buffer holds a piece: what the kernel reads is the pieces one after another
        span = upper_bound(index, self.bounds)
        reread = self._reread(index if span is None else index + (span + 1) * selector)
        return self.computed(self.emit(call, dtype, lambda name: LoadLine(buffers[0], f"{name} = {call}", reread)))

    def _reread(self, index: Expr) -> bool:
        """Whether a load at `index` reads elements that other rows or programs read too."""
        row_invariant = self.bounds[XINDEX] > 1 and XINDEX not in index.free_symbols
        return row_invariant or repeats_along_row(index) or self._reads_elements_again(index)

    def _partner_lanes_load(self, buffer: str, index: Expr) -> Var | None:
        """A contiguous read of a kernel over cells whose inner lanes read neighbouring elements: one
        [XBLOCK, 2] load for both, split; None for any other read (masked ones included)."""
        inner = self.unrolled.inner
        if inner is None or self._masks or inner not in index.free_symbols:
            return None
        first = lane_index(index, self.lane | {inner: 0}, self.bounds)
        if sympy.expand(lane_index(index, self.lane | {inner: 1}, self.bounds) - first) != 1:
            return None
        call = f"tl.load({self.pointer(buffer)} + {_pair_offsets(self._index_text(first))}, xmask[:, None], other=0"
        dtype = self.buffer_dtypes[buffer]
        reread = self._reread(first)
        raw = self.emit(call, dtype, lambda name: LoadLine(buffer, f"{name} = {call}", reread))
        halves = self.emit(f"tl.split({raw})", dtype)
        return self.computed(self.emit(f"{halves}[{self.lane[inner]}]", dtype))

    def _load_mask(self, index: Expr) -> str:
        """The mask of a load at `index`. A load of one value per row in a loop over the row
        (mean and rstd in a norm's backward, a mask broadcast over the reduced dim) keeps the
        shape [XBLOCK, 1]: loaded once per row, not once per lane of the row, and broadcast
        where it meets the row's values (a reduction masks its input with rxmask first)."""
        if self.section.kind == "r" and not self._masks and index.free_symbols == {XINDEX} and self.bounds[RINDEX] > 0:
            return "xmask"
        return self.current_mask()

    def cast(self, value: Var, dtype: str) -> str:
        """Text converting `value` to `dtype`, rounding to nearest even like the GPU does."""
        if value.dtype == dtype:
            return value.name
        if dtype == "bfloat16" and self.portable_math:
            self.helpers.add("round_to_bf16")
            return f"_fw_round_to_bf16({value}).to(tl.bfloat16)"
        return f"{value}.to({TL_DTYPES[dtype]})"

    def store(self, buffer: str, index: Expr, value: Var, recompute: Callable[[], Var] | None = None) -> None:
        """`recompute`: evaluates the stored value again in the current section; a load of this
        element from a later section that cannot see the value in registers (the next loop of a
        looped kernel) calls it instead of reading the buffer back."""
        dtype = self.buffer_dtypes[buffer]
        index = self._in_lane(index)
        offset = self.index(index)
        cast = self.cast(value, dtype)
        if not self._partner_lanes_store(buffer, index, cast):
            self._store_line(buffer, offset, cast)
        key = self._stored_key(buffer, offset)
        self._stored[key] = (self._as_read(buffer, value), len(self.sections) - 1)
        if recompute is not None:
            self._recompute[key] = recompute

    def _partner_lanes_store(self, buffer: str, index: Expr, cast: str) -> bool:
        """In a kernel over cells, an inner lane 0's store waits for its partner's; lane 1's store
        then writes both as one [XBLOCK, 2] vector when they are neighbours. True when this store's
        line is taken care of."""
        inner = self.unrolled.inner if self.unrolled is not None and self.lane is not None else None
        if inner is None:
            return False
        key = (buffer, self._lane_key(without=inner))
        if self.lane[inner] == 0:
            self._lane_partners[key] = (index, cast)
            return True
        first, first_cast = self._lane_partners.pop(key)
        if sympy.expand(index - first) == 1:
            line = (f"tl.store({self.pointer(buffer)} + {_pair_offsets(self._index_text(first))}, "
                    f"tl.join({first_cast}, {cast}), xmask[:, None])")
            self.section.lines.append(StoreLine(buffer, line))
            return True
        self._store_line(buffer, self._index_text(first), first_cast)
        return False

    def finish_lanes(self) -> None:
        """Ends the lanes of a kernel over cells: a lane 0 store still waiting (none is expected:
        every lane stores the same buffers) is written alone."""
        for (buffer, _), (index, cast) in self._lane_partners.items():
            self._store_line(buffer, self._index_text(index), cast)
        self._lane_partners.clear()
        self.lane = None

    def _store_line(self, buffer: str, offset: str, value: str) -> None:
        self.section.lines.append(StoreLine(buffer, f"tl.store({self.pointer(buffer)} + {offset}, {value}, {self.section.mask})"))

    def _lane_key(self, without: sympy.Symbol | None = None) -> tuple[tuple[str, int], ...]:
        """The lane being written (but for its `without` symbol), as a hashable key."""
        return tuple(sorted((s.name, v) for s, v in self.lane.items() if s != without))

    def _stored_key(self, buffer: str, offset: str) -> str | tuple[str, Any]:
        """The group's mapping checked that a read of a buffer the group writes reads, at every
        kernel point, the element written there, even where the two index texts differ (the
        loop mapping's `check_consistent`): such a buffer is one value, whatever the offset text."""
        if buffer in self.group_writes:
            return buffer if self.lane is None else (buffer, self._lane_key())
        return (buffer, offset)

    def _as_read(self, buffer: str, value: Var) -> Var:
        """What a read of `buffer` in this kernel sees of `value`, stored there."""
        dtype = self.buffer_dtypes[buffer]
        if buffer in self.unrounded and dtype in ("bfloat16", "float16") and value.dtype == "float32":
            return value
        return self._as_stored(value, dtype)

    def _as_stored(self, value: Var, dtype: str) -> Var:
        """`value` as a load of it from a `dtype` buffer would see it (rounded to the buffer's dtype)."""
        if dtype in ("bfloat16", "float16") and value.dtype != dtype:
            return self.emit(f"{self.cast(value, dtype)}.to(tl.float32)", "float32")
        if value.dtype != dtype:
            return self.emit(f"{value}.to({TL_DTYPES[dtype]})", dtype)
        return value

    def constant(self, value: Any, dtype: str) -> Var:
        """[XBLOCK, 1] in both sections of a reduction kernel: a per-row value combined with it keeps
        the row's shape (one rsqrt per row, not per element) and matches the x-section's value."""
        dtype = "float32" if dtype in ("bfloat16", "float16") else dtype
        shape = "[XBLOCK, 1]" if self.section.kind == "r" else self.section.shape
        var = self.emit(f"tl.full({shape}, {literal(value, dtype)}, {TL_DTYPES[dtype]})", dtype)
        if dtype == "int64":
            self.note_constant(var, int(value))
        return var

    def index_expr(self, expr: Expr, dtype: str) -> Var:
        expr = self._in_lane(expr)
        text = self.index(expr)
        if dtype == "int64" and self.index_dtype == "int32":
            return self.narrow_index(text, expr)  # computed in int32, widened where needed
        return self.emit(f"({text}).to({TL_DTYPES[dtype]})", dtype)

    def to_dtype(self, x: Var, dtype: str) -> Var:
        if dtype in ("bfloat16", "float16"):  # round to the low precision, keep computing in float32
            return self.emit(f"{self.cast(x, dtype)}.to(tl.float32)", "float32")
        if x.dtype == dtype:
            return x
        if dtype == "bool":
            return self.emit(f"{x} != 0", "bool")
        narrow = self.narrow_cast(x, dtype) or (self.narrow_widen(x) if dtype == "int64" else None)
        if narrow is not None:
            return narrow
        return self.emit(f"{x}.to({TL_DTYPES[dtype]})", dtype)

    def known_bool(self, value: bool) -> Var:
        """A condition known to be `value` at every element (a cell's lane fixes its window's cover)."""
        var = self.emit(f"tl.full({self.section.shape}, {int(value)}, tl.int1)", "bool")
        self._known_bools[var.name] = value
        return var

    def logical_and(self, a: Var, b: Var) -> Var:
        return self._fold_logical(a, b, absorbing=False) or super().logical_and(a, b)

    def logical_or(self, a: Var, b: Var) -> Var:
        return self._fold_logical(a, b, absorbing=True) or super().logical_or(a, b)

    def _fold_logical(self, a: Var, b: Var, absorbing: bool) -> Var | None:
        """`a and b` (`absorbing` False) or `a or b` (True) when one side is a known condition: the
        known side itself if it decides (false for and, true for or), else the other side."""
        for known, other in ((a, b), (b, a)):
            if known.name not in self._known_bools:
                continue
            if self._known_bools[known.name] == absorbing:
                return known
            return other if other.dtype == "bool" else self.emit(f"{other} != 0", "bool")
        return None

    def where(self, condition: Var, a: Var, b: Var) -> Var:
        # folded in 1D kernels only, whose values all have the block's shape (a reduction's may be rows)
        if condition.name in self._known_bools and a.dtype == b.dtype and not self.is_reduction:
            return a if self._known_bools[condition.name] else b
        narrow = self.narrow_where(condition, a, b)
        if narrow is not None:
            return narrow
        return self.emit(f"tl.where({condition}, {a}, {b})", promote(a.dtype, b.dtype))

    def masked(self, mask: Var, body: Callable[[], Var], other: Any) -> Var:
        if mask.name in self._known_bools and not self.is_reduction:  # 1D kernels only, as `where`
            if self._known_bools[mask.name]:
                return body()
            self._dead += 1  # the body is written for its dtype only: its loads read nothing
            try:
                value = body()
            finally:
                self._dead -= 1
            return self.constant(other, value.dtype)
        self._masks.append(mask.name)
        try:
            value = body()
        finally:
            self._masks.pop()
        if value.dtype == "bool":  # a literal 0 or 1 beside an int1 would widen the result to int32
            return self.emit(f"tl.where({mask}, {value}, {literal(other, value.dtype)}) != 0", "bool")
        return self.emit(f"tl.where({mask}, {value}, {literal(other, value.dtype)})", value.dtype)

    def indirect(self, value: Var, size: int) -> sympy.Symbol:
        """An index read from `value`: negative ones count from the end, as in PyTorch, unless the
        value is known never to be negative (a reflection pad's)."""
        if self.never_negative(value):  # its int32 twin where the kernel's indices are int32
            name = self.int32_twin(value) if self.index_dtype == "int32" else None
            symbol = sympy.Symbol(name or value.name, integer=True, nonnegative=True)
        else:
            wrapped = self.emit(f"tl.where({value} < 0, {value} + {size}, {value})", value.dtype)
            symbol = sympy.Symbol(wrapped.name, integer=True, nonnegative=True)
        self.bounds[symbol] = size  # in range for valid indices, which lets index math simplify
        return symbol

    # --- mixed-order kernels: sums along the rows of a program --------------------------
    def reduce_columns(self, reduction_type: str, value: Var, dtype: str) -> Var:
        """The sum of `value` over the program's rows, per column: [1, RBLOCK], usable after the
        loop over rows only (`store_after_rows`)."""
        if reduction_type != "sum" or not self.mix_rows:
            raise CodegenError(f"a column {reduction_type} in a kernel that is no mixed-order one")
        acc = self._fresh("colacc")
        self.before_rows.append(f"{acc} = tl.zeros([XBLOCK, RBLOCK], {TL_DTYPES[dtype]})")
        self.section.lines.append(f"{acc} = {acc} + tl.where(rxmask, {value}, 0)")
        var = Var(self._fresh(), dtype)
        self.after_rows.append(f"{var.name} = tl.sum({acc}, 0)[None, :]")
        return var

    def store_after_rows(self, buffer: str, index: Expr, value: Var) -> None:
        """Stores a column sum once the program's rows are done, at `index` with the program's
        first row for xindex (a column result's index depends on xindex only through xindex // CH)."""
        at = simplify_index(index.xreplace({XINDEX: self.mix_rows * PID}), self.bounds)
        if XINDEX in at.free_symbols:
            raise CodegenError(f"a column result of {buffer} indexed by row: {index}")
        dtype = self.buffer_dtypes[buffer]
        self.after_rows.append(f"tl.store({self.pointer(buffer)} + {texpr(at)}, {self.cast(value, dtype)}, rmask)")

    # --- reductions -----------------------------------------------------------------
    def reduce(self, reduction_type: str, value: Var, dtype: str) -> list[Var]:
        """Reduces `value` over the r-section; returns [XBLOCK, 1] results usable in later sections."""
        if self.persistent:
            return self._reduce_persistent(reduction_type, value, dtype)
        return self._reduce_looped(reduction_type, value, dtype)

    def identity(self, reduction_type: str, dtype: str) -> str:
        if reduction_type in ("sum", "any", "welford"):
            return "0"
        if reduction_type == "prod":
            return "1.0" if is_float(dtype) else "1"
        largest = reduction_type in ("max", "argmax")  # the identity of max is the smallest value
        if is_float(dtype):
            return literal(-math.inf if largest else math.inf, dtype)
        bits = {"int64": 63, "int32": 31, "int16": 15, "int8": 7}
        if dtype in ("uint8", "bool"):
            return "0" if largest else str(255 if dtype == "uint8" else 1)
        return str(-(2 ** bits[dtype])) if largest else str(2 ** bits[dtype] - 1)

    def _reduce_persistent(self, kind: str, value: Var, dtype: str) -> list[Var]:
        masked = self.emit(f"tl.where(rxmask, {value}, {self.identity(kind, dtype)})", value.dtype)
        if kind == "sum":
            return [self.emit(f"tl.sum({masked}, 1)[:, None]", dtype)]
        if kind in ("max", "min", "prod"):
            self.helpers.add(kind)
            return [self.emit(self._row_combine(kind, masked.name, masked.dtype), dtype)]
        if kind == "any":
            return [self.emit(f"tl.max((rxmask & ({value} != 0)).to(tl.int8), 1)[:, None] != 0", "bool")]
        if kind in ("argmax", "argmin"):
            self.helpers.add(kind)
            indices = self.emit("rindex.to(tl.int64) + tl.zeros([XBLOCK, RBLOCK], tl.int64)", "int64")
            pair = self._fresh("arg")
            self.section.lines.append(f"{pair}_value, {pair}_index = tl.reduce(({masked}, {indices}), 1, _fw_{kind}_combine)")
            return [self.emit(f"{pair}_index[:, None]", "int64")]
        if kind == "welford":  # two passes over registers: exact and cheap when the row is resident
            # a row's every element (rows past xnumel are not stored); a row of none has a NaN mean, as in eager
            count = float(self.bounds[RINDEX])
            mean = self.emit(f"tl.sum({masked}, 1)[:, None] / {count}", dtype)
            centered = self.emit(f"tl.where(rxmask, {value} - {mean}, 0.0)", dtype)
            return [mean, self.emit(f"tl.sum({centered} * {centered}, 1)[:, None]", dtype)]
        raise CodegenError(f"reduction type {kind}")

    def _row_combine(self, kind: str, values: str, dtype: str) -> str:
        """Each row's max, min or product of `values` ([XBLOCK, RBLOCK]), a NaN winning a max or min as
        in torch. On a GPU one tl.reduce with the combine helper (max.NaN is one instruction). Triton's
        interpreter (the "cpu" target) runs a tl.reduce's combine in Python pair by pair: a max over a
        64 x 64 block took 115 ms, tl.max 1.7 ms. There a max or min is tl.max / tl.min, with the row's
        NaNs counted so that one still wins."""
        if not self.portable_math or kind == "prod" or dtype == "bool":
            return f"tl.reduce({values}, 1, _fw_{kind}_combine)[:, None]"
        builtin = f"tl.{kind}({values}, 1)[:, None]"
        if not is_float(dtype):
            return builtin
        return f"tl.where(tl.max(({values} != {values}).to(tl.int8), 1)[:, None] != 0, float(\"nan\"), {builtin})"

    def _reduce_looped(self, kind: str, value: Var, dtype: str) -> list[Var]:
        acc = self._fresh("acc")
        tl_dtype = TL_DTYPES[dtype]
        start = self.identity(kind, dtype)
        loop = self.section.lines
        after = self._after_loop
        if kind == "sum":
            self.setup.append(f"{acc} = tl.zeros([XBLOCK, RBLOCK], {tl_dtype})")
            loop.append(f"{acc} = {acc} + tl.where(rxmask, {value}, 0)")
            return [after(f"tl.sum({acc}, 1)[:, None]", dtype)]
        if kind in ("max", "min", "prod"):
            self.helpers.add(kind)
            self.setup.append(f"{acc} = tl.full([XBLOCK, RBLOCK], {start}, {tl_dtype})")
            loop.append(f"{acc} = _fw_{kind}_combine({acc}, tl.where(rxmask, {value}, {start}))")
            return [after(self._row_combine(kind, acc, dtype), dtype)]
        if kind == "any":
            self.setup.append(f"{acc} = tl.zeros([XBLOCK, RBLOCK], tl.int1)")
            loop.append(f"{acc} = {acc} | (rxmask & ({value} != 0))")
            return [after(f"tl.max({acc}.to(tl.int8), 1)[:, None] != 0", "bool")]
        if kind in ("argmax", "argmin"):
            return [self._arg_reduce_looped(kind, value, acc, start)]
        if kind == "welford":
            return self._welford_looped(value, acc, dtype)
        raise CodegenError(f"reduction type {kind}")

    def scan(self, scan_type: str, value: Var) -> Var:
        """The running sum or product of `value` along the row up to each element ([XBLOCK, RBLOCK]).
        A looped kernel carries each row's total from one step of its loop to the next."""
        if self.portable_math and value.dtype == "float32":  # as eager's CPU scans: totals in float64
            return self.to_dtype(self.scan(scan_type, self.to_dtype(value, "float64")), "float32")
        dtype = value.dtype
        identity = "0" if scan_type == "cumsum" else ("1.0" if is_float(dtype) else "1")
        masked = self.emit(f"tl.where(rxmask, {value}, {identity})", dtype)
        within = f"tl.{scan_type}({masked}, 1)"
        if self.persistent:
            return self.emit(within, dtype)
        carry, result = self._fresh("carry"), Var(self._fresh(), dtype)
        self.setup.append(f"{carry} = tl.full([XBLOCK, 1], {identity}, {TL_DTYPES[dtype]})")
        if scan_type == "cumsum":
            combine, total = "+", f"tl.sum({masked}, 1)[:, None]"
        else:
            self.helpers.add("prod")
            combine, total = "*", f"tl.reduce({masked}, 1, _fw_prod_combine)[:, None]"
        self.section.lines += [f"{result.name} = {carry} {combine} {within}", f"{carry} = {carry} {combine} {total}"]
        return result

    def online_softmax(self, value: Var, dtype: str) -> tuple[Var, Var]:
        """(row max, row sum of exp(value - max)) in one looped pass, one exponential per element:
        with gap = value - running max, e = exp(-|gap|) is either the new term (gap <= 0) or the
        factor that rescales the running sum to a new max (gap > 0, the new term being 1). A +inf
        entry leaves its lane's sum finite, but its lane max then weighs exp(inf - inf) = NaN in the
        lanes' combination, as eager's sum of exp(x - max) is NaN."""
        self.helpers.add("max")
        acc, tl_dtype = self._fresh("online"), TL_DTYPES[dtype]
        self.setup += [f"{acc}_max = tl.full([XBLOCK, RBLOCK], float(\"-inf\"), {tl_dtype})",
                       f"{acc}_sum = tl.zeros([XBLOCK, RBLOCK], {tl_dtype})"]
        self.section.lines += [
            f"{acc}_x = tl.where(rxmask, {value}, float(\"-inf\"))",
            f"{acc}_gap = {acc}_x - {acc}_max",
            f"{acc}_e = tl.exp(-tl.abs({acc}_gap))",
            f"{acc}_up = {acc}_sum * {acc}_e + 1.0",
            f"{acc}_sum = tl.where({acc}_x == float(\"-inf\"), {acc}_sum, tl.where({acc}_gap > 0, {acc}_up, {acc}_sum + {acc}_e))",
            f"{acc}_max = _fw_max_combine({acc}_max, {acc}_x)",
        ]
        row_max = self._after_loop(self._row_combine("max", f"{acc}_max", dtype), dtype)
        weights = f"tl.where({acc}_max == float(\"-inf\"), 0.0, tl.exp({acc}_max - {row_max}))"
        return row_max, self._after_loop(f"tl.sum({acc}_sum * {weights}, 1)[:, None]", dtype)

    def _after_loop(self, expression: str, dtype: str) -> Var:
        """A value computed once the current loop has finished: it goes in the next x-section."""
        var = Var(self._fresh(), dtype)
        self.pending_after.append(f"{var.name} = {expression}")
        return var

    def _arg_reduce_looped(self, kind: str, value: Var, acc: str, start: str) -> Var:
        self.helpers.add(kind)
        better = ">" if kind == "argmax" else "<"
        self.setup += [f"{acc}_value = tl.full([XBLOCK, RBLOCK], {start}, {TL_DTYPES[value.dtype]})",
                       f"{acc}_index = tl.zeros([XBLOCK, RBLOCK], tl.int64)"]
        self.section.lines += [
            f"{acc}_new = tl.where(rxmask, {value}, {start})",
            f"{acc}_take = ({acc}_new {better} {acc}_value) | (({acc}_new != {acc}_new) & ({acc}_value == {acc}_value))",
            f"{acc}_value = tl.where({acc}_take, {acc}_new, {acc}_value)",
            f"{acc}_index = tl.where({acc}_take, rindex.to(tl.int64) + tl.zeros([XBLOCK, RBLOCK], tl.int64), {acc}_index)",
        ]
        self.pending_after.append(f"{acc}_best, {acc}_result = tl.reduce(({acc}_value, {acc}_index), 1, _fw_{kind}_combine)")
        return self._after_loop(f"{acc}_result[:, None]", "int64")

    def _welford_looped(self, value: Var, acc: str, dtype: str) -> list[Var]:
        self.counts_steps = True
        self.setup += [f"{acc}_{part} = tl.zeros([XBLOCK, RBLOCK], {TL_DTYPES[dtype]})" for part in ("mean", "m2", "weight")]
        self.section.lines += [
            f"{acc}_delta = {value} - {acc}_mean",
            f"{acc}_weight_next = {acc}_weight + 1",
            # every lane that updates at this step has seen exactly one element per earlier step
            # (only the last step's tail is masked, and a row window's first step's head), so its new
            # weight is the step count `rstep` the loop header computes: one reciprocal per step (per
            # lane in a row window) instead of a division per element
            f"{acc}_mean_next = {acc}_mean + {acc}_delta * (1.0 / rstep)",
            f"{acc}_m2 = tl.where(rxmask, {acc}_m2 + {acc}_delta * ({value} - {acc}_mean_next), {acc}_m2)",
            f"{acc}_mean = tl.where(rxmask, {acc}_mean_next, {acc}_mean)",
            f"{acc}_weight = tl.where(rxmask, {acc}_weight_next, {acc}_weight)",
        ]
        # the interpreter's lanes joined by sums (WELFORD_LANES_BY_SUMS): numpy sums them pairwise
        if not (WELFORD_LANES_BY_SUMS and self.portable_math):
            self.helpers.add("welford")
            self.pending_after.append(f"{acc}_mean_out, {acc}_m2_out, {acc}_weight_out = "
                                      f"tl.reduce(({acc}_mean, {acc}_m2, {acc}_weight), 1, _fw_welford_combine)")
            return [self._after_loop(f"{acc}_mean_out[:, None]", dtype), self._after_loop(f"{acc}_m2_out[:, None]", dtype)]
        total = f"tl.sum({acc}_weight, 1)[:, None]"
        mean = self._after_loop(f"tl.sum({acc}_mean * {acc}_weight, 1)[:, None] / {total}", dtype)
        spread = f"{acc}_weight * ({acc}_mean - {mean}) * ({acc}_mean - {mean})"
        return [mean, self._after_loop(f"tl.sum({acc}_m2 + tl.where({acc}_weight > 0, {spread}, 0.0), 1)[:, None]", dtype)]


def repeats_along_row(index: Expr) -> bool:
    """Whether a load at `index` reads one element for each run of consecutive reduction indices:
    rindex appears only divided (rindex // 3136, a channel of a GroupNorm group's 8 x 56 x 56 row)."""
    if RINDEX not in index.free_symbols:
        return False
    coarse = [a for a in index.atoms(FloorDiv, ModularIndexing) if a.args[0] == RINDEX and a.args[1] != 1]
    placeholder = sympy.Dummy("run", integer=True, nonnegative=True)
    return bool(coarse) and RINDEX not in index.xreplace({a: placeholder for a in coarse}).free_symbols


@functools.lru_cache(maxsize=1 << 14)  # kernels of a graph load through the same few indices
def skips_digits(index: Expr, numel: int) -> bool:
    """Whether an index over xindex in [0, numel) leaves out some of xindex's digits: it reads
    xindex only through pieces (xindex // d, (xindex // d) % m) whose ranges [d, d * m) leave a gap
    in [1, numel), so xindex values that differ only there read the same element. A load through a
    loaded value (a gather) or through xindex itself is not judged."""
    if index.free_symbols != {XINDEX}:
        return False
    pieces = index.atoms(FloorDiv, ModularIndexing)
    if any(p.args[0] != XINDEX for p in pieces):
        return False
    placeholder = sympy.Dummy("piece", integer=True, nonnegative=True)
    if XINDEX in index.xreplace({p: placeholder for p in pieces}).free_symbols:
        return False  # xindex appears whole: every digit is used
    spans = sorted(digit_span(p, numel) for p in pieces)
    covered = 1
    for start, end in spans:
        if start > covered:
            return True
        covered = max(covered, end)
    return covered < numel
