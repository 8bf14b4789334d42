"""int64 arithmetic done in int32 where the values provably fit.

ATen computes positions in int64: a max-pool's argmax and its window bounds, an arange's masks, the
offsets a pool's backward compares with the saved indices. A kernel computes its indices in int32
when every buffer fits, and on a GPU an int64 compare, select or multiply takes several
instructions where int32 takes one; an int64 division by a tensor is a long subroutine. ResNet's
max-pool backward spent most of its time on such arithmetic (1290 PTX instructions for 8 elements a
thread; 742 with comparisons narrowed).

Each int64 value that has an int32 *twin* (a variable or a literal equal to it) carries a bound on
its magnitude. Index expressions get theirs from the kernel's ranges, constants from their value;
an op on twins gets one from its operands' (a sum's bound is the sum of theirs). When the result's
bound stays under NARROW_LIMIT, the op runs on the twins in int32 and its int64 value is the twin
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
_ARITHMETIC: dict[str, tuple[str, Callable[[int, int], int]]] = {
    "add": ("{a} + {b}", lambda a, b: a + b),
    "sub": ("{a} - {b}", lambda a, b: a + b),
    "mul": ("{a} * {b}", lambda a, b: a * b),
    "maximum": ("tl.maximum({a}, {b})", max),
    "minimum": ("tl.minimum({a}, {b})", max),
}


def magnitude_bound(expr: Expr, bounds: dict[sympy.Symbol, int]) -> int | None:
    """A bound on |expr| when each symbol s ranges over [0, bounds[s]); None if unknown."""
    if expr.is_Integer:
        return abs(int(expr))
    if isinstance(expr, sympy.Add):
        parts = [magnitude_bound(term, bounds) for term in expr.args]
        return None if None in parts else sum(parts)
    if isinstance(expr, sympy.Mul):
        coefficient, rest = expr.as_coeff_Mul()
        part = magnitude_bound(rest, bounds) if rest != expr else None
        return None if part is None else abs(int(coefficient)) * part
    return upper_bound(expr, bounds)  # symbols, floor divisions and modulos are non-negative


class NarrowIntegers:
    """Mixed into KernelWriter, which supplies `emit`, `bounds` and an empty `_twins`."""

    bounds: dict[sympy.Symbol, int]
    _twins: dict[str, tuple[str, int]]  # int64 variable -> (its int32 twin: variable or literal, |value| bound)

    def emit(self, expression: str, dtype: str) -> Var:  # pragma: no cover - provided by KernelWriter
        raise NotImplementedError

    def narrow_index(self, text: str, expr: Expr) -> Var:
        """An int64 index value whose text the kernel computes in int32."""
        narrow = self.emit(f"({text})", "int32")
        bound = magnitude_bound(expr, self.bounds)
        return self._widen(narrow, bound if bound is not None else NARROW_LIMIT)

    def note_constant(self, var: Var, value: int) -> None:
        if abs(value) < NARROW_LIMIT:
            self._twins[var.name] = (str(value), abs(value))

    def narrow_compare(self, operator: str, a: Var, b: Var) -> Var | None:
        twins = self._operands(a, b)
        return None if twins is None else self.emit(f"{twins[0][0]} {operator} {twins[1][0]}", "bool")

    def narrow_arithmetic(self, op: str, a: Var, b: Var) -> Var | None:
        twins = self._operands(a, b)
        if twins is None:
            return None
        template, combine = _ARITHMETIC[op]
        bound = combine(twins[0][1], twins[1][1])
        if bound >= NARROW_LIMIT:
            return None
        return self._widen(self.emit(template.format(a=twins[0][0], b=twins[1][0]), "int32"), bound)

    def narrow_where(self, condition: Var, a: Var, b: Var) -> Var | None:
        twins = self._operands(a, b)
        if twins is None:
            return None
        narrow = self.emit(f"tl.where({condition}, {twins[0][0]}, {twins[1][0]})", "int32")
        return self._widen(narrow, max(twins[0][1], twins[1][1]))

    def narrow_floordiv(self, a: Var, b: Var) -> Var | None:
        """a // b (flooring, Python's sign rule) for a positive literal divisor."""
        twins = self._operands(a, b)
        if twins is None or not twins[1][0].isdigit() or int(twins[1][0]) == 0:
            return None
        (x, bound), divisor = twins[0], twins[1][0]
        if divisor == "1":
            return a
        magnitude = self.emit(f"tl.abs({x}) // {divisor}", "int32")
        inexact = self.emit(f"{magnitude} * {divisor} != tl.abs({x})", "bool")
        floored = self.emit(f"tl.where({x} < 0, tl.where({inexact}, -{magnitude} - 1, -{magnitude}), {magnitude})", "int32")
        return self._widen(floored, bound)

    def narrow_neg(self, x: Var) -> Var | None:
        twin = self._twins.get(x.name)
        return None if twin is None else self._widen(self.emit(f"-{twin[0]}", "int32"), twin[1])

    def narrow_widen(self, x: Var) -> Var | None:
        """A narrower integer cast to int64 (a max-pool's saved int8 window offsets): its int32
        value is its twin, bounded by its dtype."""
        if x.dtype not in _DTYPE_BOUNDS or not NARROW_WIDENED:
            return None
        narrow = x if x.dtype == "int32" else self.emit(f"{x}.to(tl.int32)", "int32")
        return self._widen(narrow, _DTYPE_BOUNDS[x.dtype])

    def narrow_cast(self, x: Var, dtype: str) -> Var | None:
        """An int64 twinned value cast to a narrower integer: the twin's low bits are the same."""
        twin = self._twins.get(x.name)
        if twin is None or dtype not in _NARROW_INT_DTYPES or twin[0].lstrip("-").isdigit():
            return None
        return self.emit(f"{twin[0]}.to(tl.{dtype})", dtype)

    def _operands(self, a: Var, b: Var) -> tuple[tuple[str, int], tuple[str, int]] | None:
        """Both operands' twins, when one of them is int64 and at least one twin is a tensor."""
        if "int64" not in (a.dtype, b.dtype) or any(v.dtype not in ("int64",) + _NARROW_INT_DTYPES for v in (a, b)):
            return None
        twins = [self._twins.get(v.name, (v.name, NARROW_LIMIT - 1) if v.dtype != "int64" else None) for v in (a, b)]
        if twins[0] is None or twins[1] is None or all(t[0].lstrip("-").isdigit() for t in twins):
            return None
        return twins[0], twins[1]

    def _widen(self, narrow: Var, bound: int) -> Var:
        wide = self.emit(f"{narrow}.to(tl.int64)", "int64")
        self._twins[wide.name] = (narrow.name, bound)
        return wide
