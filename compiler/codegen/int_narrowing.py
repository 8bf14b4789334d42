"""int64 arithmetic done in int32 where the values provably fit.

ATen computes positions in int64: a max-pool's argmax and its window bounds, an arange's masks, the
offsets a pool's backward compares with the saved indices. A kernel computes its indices in int32
when every buffer fits, and on a GPU an int64 compare, select or multiply takes several
instructions where int32 takes one; an int64 division by a tensor is a long subroutine. ResNet's
max-pool backward spent most of its time on such arithmetic (1290 PTX instructions for 8 elements a
thread; 742 with comparisons narrowed).

Each int64 value that has an int32 *twin* (a variable or a literal equal to it) carries the interval
of its values. Index expressions get theirs from the kernel's ranges, constants from their value;
an op on twins gets one from its operands' (a sum's is the sum of theirs). When the result's
magnitude stays under NARROW_LIMIT, the op runs on the twins in int32 and its int64 value is the twin
widened, which the compiler drops when nothing needs it. Values read from memory have no twin, so
an int64 tensor's contents are never assumed small.
"""

from __future__ import annotations

from typing import Callable

import sympy

from compiler.codegen.values import Var
from compiler.indexing import Expr, upper_bound

# Half of int32's range: row windows and masked lanes compute indices a little outside the
# kernel's ranges (rindex from -15), which the bound does not see.
NARROW_LIMIT = 1 << 30
# On, a narrower integer cast to int64 keeps an int32 twin. Off (shipped), it stays int64, as in
# Inductor's kernels. The int8 pool-offset decode of ResNet loads int8 and stores int64, and the two
# want different register layouts. Triton moves the layout conversion up to the last widening before
# the store: on, it converts the int32 results through shared memory; off, the int8 input (the TTGIR
# for sm_90 shows both). Off was 2 % faster in both layouts (H100, 2026-11-27, bench/switch_ab.py:
# 25.12 -> 24.61 us NCHW, 24.77 -> 24.38 channels-last); no other bench case changes.
NARROW_WIDENED = False
_NARROW_INT_DTYPES = ("int32", "int16", "int8", "uint8")
_DTYPE_BOUNDS = {"int8": 128, "uint8": 255, "int16": 1 << 15, "int32": 1 << 31}  # of |value|

Interval = tuple[int, int]  # the least and the largest value an integer takes
_COMPARISONS: dict[str, Callable[[int, int], bool]] = {
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
}


def _product(a: Interval, b: Interval) -> Interval:
    corners = [x * y for x in a for y in b]
    return min(corners), max(corners)


def _absolute(a: Interval) -> Interval:
    low, high = a
    if low >= 0:
        return a
    if high <= 0:
        return -high, -low
    return 0, max(-low, high)


_ARITHMETIC: dict[str, tuple[str, Callable[[Interval, Interval], Interval]]] = {
    "add": ("{a} + {b}", lambda a, b: (a[0] + b[0], a[1] + b[1])),
    "sub": ("{a} - {b}", lambda a, b: (a[0] - b[1], a[1] - b[0])),
    "mul": ("{a} * {b}", _product),
    "maximum": ("tl.maximum({a}, {b})", lambda a, b: (max(a[0], b[0]), max(a[1], b[1]))),
    "minimum": ("tl.minimum({a}, {b})", lambda a, b: (min(a[0], b[0]), min(a[1], b[1]))),
}
# On, |x| of a twin is computed in int32, and an index read from a twin whose interval shows it is
# never negative is used without the wrap of negative indices, as Inductor's value ranges allow: a
# reflection pad's 55 - |55 - |x - 1||. Off: int64, wrapped (A/B runs, bench/switch_ab.py). H100,
# 2026-11-28: TResNet's reflection-pad backward with its BatchNorm 104.8 -> 101.8 us, its forward and
# VOLO's unfold within 1 %.
NARROW_ABS = True


def interval(expr: Expr, bounds: dict[sympy.Symbol, int]) -> Interval | None:
    """The values `expr` takes when each symbol s ranges over [0, bounds[s]); None if unknown."""
    if expr.is_Integer:
        return int(expr), int(expr)
    if isinstance(expr, sympy.Add):
        parts = [interval(term, bounds) for term in expr.args]
        if None in parts:
            return None
        return sum(p[0] for p in parts), sum(p[1] for p in parts)  # type: ignore[index]
    if isinstance(expr, sympy.Mul):
        coefficient, rest = expr.as_coeff_Mul()
        part = interval(rest, bounds) if rest != expr else None
        return None if part is None else _product((int(coefficient), int(coefficient)), part)
    high = upper_bound(expr, bounds)  # symbols, floor divisions and modulos are non-negative
    return None if high is None else (0, high)


def _fits(values: Interval) -> bool:
    return max(-values[0], values[1]) < NARROW_LIMIT


class NarrowIntegers:
    """Mixed into KernelWriter, which supplies `emit`, `bounds` and an empty `_twins`."""

    bounds: dict[sympy.Symbol, int]
    _twins: dict[str, tuple[str, Interval]]  # int64 variable -> (its int32 twin: variable or literal, its values)

    def emit(self, expression: str, dtype: str) -> Var:  # pragma: no cover - provided by KernelWriter
        raise NotImplementedError

    def narrow_index(self, text: str, expr: Expr) -> Var:
        """An int64 index value whose text the kernel computes in int32."""
        narrow = self.emit(f"({text})", "int32")
        values = interval(expr, self.bounds)
        return self._widen(narrow, values if values is not None and _fits(values) else (-NARROW_LIMIT, NARROW_LIMIT))

    def note_constant(self, var: Var, value: int) -> None:
        if abs(value) < NARROW_LIMIT:
            self._twins[var.name] = (str(value), (value, value))

    def never_negative(self, x: Var) -> bool:
        """Whether an int64 value is known to be >= 0 (its int32 twin's interval)."""
        twin = self._twins.get(x.name)
        return NARROW_ABS and twin is not None and twin[1][0] >= 0

    def int32_twin(self, x: Var) -> str | None:
        """The int32 variable an int64 value was widened from, if any."""
        twin = self._twins.get(x.name)
        return None if twin is None or twin[0].lstrip("-").isdigit() else twin[0]

    def narrow_compare(self, operator: str, a: Var, b: Var) -> Var | None:
        twins = self._operands(a, b)
        if twins is None:
            return None
        (_, left), (_, right) = twins
        if left[0] == left[1] and right[0] == right[1]:  # two known values (a cell's lane: compiler.unrolled_lanes)
            return self.known_bool(_COMPARISONS[operator](left[0], right[0]))
        return self.emit(f"{twins[0][0]} {operator} {twins[1][0]}", "bool")

    def known_bool(self, value: bool) -> Var:  # pragma: no cover - provided by KernelWriter
        raise NotImplementedError

    def narrow_arithmetic(self, op: str, a: Var, b: Var) -> Var | None:
        twins = self._operands(a, b)
        if twins is None:
            return None
        template, combine = _ARITHMETIC[op]
        values = combine(twins[0][1], twins[1][1])
        if not _fits(values):
            return None
        return self._widen(self.emit(template.format(a=twins[0][0], b=twins[1][0]), "int32"), values)

    def narrow_where(self, condition: Var, a: Var, b: Var) -> Var | None:
        twins = self._operands(a, b)
        if twins is None:
            return None
        narrow = self.emit(f"tl.where({condition}, {twins[0][0]}, {twins[1][0]})", "int32")
        (a_low, a_high), (b_low, b_high) = twins[0][1], twins[1][1]
        return self._widen(narrow, (min(a_low, b_low), max(a_high, b_high)))

    def narrow_floordiv(self, a: Var, b: Var) -> Var | None:
        """a // b (flooring, Python's sign rule) for a positive literal divisor."""
        twins = self._operands(a, b)
        if twins is None or not twins[1][0].isdigit() or int(twins[1][0]) == 0:
            return None
        (x, values), divisor = twins[0], twins[1][0]
        if divisor == "1":
            return a
        magnitude = self.emit(f"tl.abs({x}) // {divisor}", "int32")
        inexact = self.emit(f"{magnitude} * {divisor} != tl.abs({x})", "bool")
        floored = self.emit(f"tl.where({x} < 0, tl.where({inexact}, -{magnitude} - 1, -{magnitude}), {magnitude})", "int32")
        return self._widen(floored, (values[0] // int(divisor), values[1] // int(divisor)))

    def narrow_neg(self, x: Var) -> Var | None:
        twin = self._twins.get(x.name)
        return None if twin is None else self._widen(self.emit(f"-{twin[0]}", "int32"), (-twin[1][1], -twin[1][0]))

    def narrow_abs(self, x: Var) -> Var | None:
        twin = self._twins.get(x.name)
        if twin is None or not NARROW_ABS:
            return None
        return self._widen(self.emit(f"tl.abs({twin[0]})", "int32"), _absolute(twin[1]))

    def narrow_widen(self, x: Var) -> Var | None:
        """A narrower integer cast to int64 (a max-pool's saved int8 window offsets): its int32
        value is its twin, bounded by its dtype."""
        if x.dtype not in _DTYPE_BOUNDS or not NARROW_WIDENED:
            return None
        narrow = x if x.dtype == "int32" else self.emit(f"{x}.to(tl.int32)", "int32")
        bound = _DTYPE_BOUNDS[x.dtype]
        return self._widen(narrow, (0, bound) if x.dtype == "uint8" else (-bound, bound))

    def narrow_cast(self, x: Var, dtype: str) -> Var | None:
        """An int64 twinned value cast to a narrower integer: the twin's low bits are the same."""
        twin = self._twins.get(x.name)
        if twin is None or dtype not in _NARROW_INT_DTYPES or twin[0].lstrip("-").isdigit():
            return None
        return self.emit(f"{twin[0]}.to(tl.{dtype})", dtype)

    def _operands(self, a: Var, b: Var) -> tuple[tuple[str, Interval], tuple[str, Interval]] | None:
        """Both operands' twins, when one of them is int64 and at least one twin is a tensor."""
        if "int64" not in (a.dtype, b.dtype) or any(v.dtype not in ("int64",) + _NARROW_INT_DTYPES for v in (a, b)):
            return None
        unknown = (-(NARROW_LIMIT - 1), NARROW_LIMIT - 1)
        twins = [self._twins.get(v.name, (v.name, unknown) if v.dtype != "int64" else None) for v in (a, b)]
        if twins[0] is None or twins[1] is None or all(t[0].lstrip("-").isdigit() for t in twins):
            return None
        return twins[0], twins[1]

    def _widen(self, narrow: Var, values: Interval) -> Var:
        wide = self.emit(f"{narrow}.to(tl.int64)", "int64")
        self._twins[wide.name] = (narrow.name, values)
        return wide
