"""Sympy index expressions: index variables, integer division and modulo that sympy
keeps exact, and helpers to rewrite a flat index into per-dimension indices.

All index variables are non-negative integers. `FloorDiv(a, b)` is a // b and
`ModularIndexing(a, b, c)` is (a // b) % c, for non-negative a and positive b, c.
"""

from __future__ import annotations

import math
from typing import Sequence

import sympy

Expr = sympy.Expr


def index_symbol(prefix: str, i: int) -> sympy.Symbol:
    return sympy.Symbol(f"{prefix}{i}", integer=True, nonnegative=True)


class FloorDiv(sympy.Function):
    """a // b for non-negative integer a and positive integer b."""

    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, base, divisor):
        if divisor == 1:
            return base
        if base == 0:
            return sympy.Integer(0)
        if isinstance(base, sympy.Integer) and isinstance(divisor, sympy.Integer):
            return sympy.Integer(int(base) // int(divisor))
        if isinstance(base, FloorDiv):  # (a // b) // c == a // (b * c)
            return FloorDiv(base.args[0], base.args[1] * divisor)
        if isinstance(divisor, sympy.Integer) and isinstance(base, sympy.Add):
            # pull out terms that are exact multiples of the divisor
            exact = [t for t in base.args if _is_multiple(t, int(divisor))]
            if exact and len(exact) < len(base.args):
                rest = sympy.Add(*[t for t in base.args if t not in exact])
                return sympy.Add(*[sympy.expand(t / divisor) for t in exact]) + FloorDiv(rest, divisor)
            if exact:
                return sympy.expand(base / divisor)
        if isinstance(divisor, sympy.Integer) and _is_multiple(base, int(divisor)):
            return sympy.expand(base / divisor)
        return None


class ModularIndexing(sympy.Function):
    """(a // b) % c for non-negative integer a and positive integers b, c."""

    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, base, divisor, modulus):
        if modulus == 1 or base == 0:
            return sympy.Integer(0)
        if all(isinstance(v, sympy.Integer) for v in (base, divisor, modulus)):
            return sympy.Integer((int(base) // int(divisor)) % int(modulus))
        if isinstance(divisor, sympy.Integer) and isinstance(modulus, sympy.Integer) and isinstance(base, sympy.Add):
            # drop terms that are multiples of divisor * modulus: they cannot change the result
            period = int(divisor) * int(modulus)
            kept = [t for t in base.args if not _is_multiple(t, period)]
            if len(kept) < len(base.args):
                return ModularIndexing(sympy.Add(*kept), divisor, modulus)
        return None


def _is_multiple(term: Expr, n: int) -> bool:
    if term.is_Integer:
        return int(term) % n == 0
    coefficient, _ = term.as_coeff_Mul()
    return coefficient.is_Integer and int(coefficient) % n == 0


def unflatten(flat: Expr, sizes: Sequence[int]) -> list[Expr]:
    """Per-dimension indices of a row-major flat index over `sizes`."""
    total = math.prod(sizes)
    out: list[Expr] = []
    stride = 1
    for size in reversed(sizes):
        if size == 1:
            out.append(sympy.Integer(0))
        elif stride * size == total:  # the outermost dim that is not 1: no modulo needed
            out.append(FloorDiv(flat, stride))
        else:
            out.append(ModularIndexing(flat, stride, size))
        stride *= size
    return out[::-1]


def flatten(index: Sequence[Expr], sizes: Sequence[int]) -> Expr:
    """Row-major flat index of per-dimension `index` over `sizes`."""
    flat: Expr = sympy.Integer(0)
    stride = 1
    for i, size in zip(reversed(index), reversed(sizes)):
        if size != 1:
            flat = flat + i * stride
        stride *= size
    return flat
