"""Sympy index expressions: index variables, integer division and modulo that sympy
keeps exact, and helpers to rewrite a flat index into per-dimension indices.

All index variables are non-negative integers. `FloorDiv(a, b)` is a // b and
`ModularIndexing(a, b, c)` is (a // b) % c, for non-negative a and positive b, c.
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import sympy

Expr = sympy.Expr


XINDEX = sympy.Symbol("xindex", integer=True, nonnegative=True)  # a kernel's flat output index
RINDEX = sympy.Symbol("rindex", integer=True, nonnegative=True)  # a kernel's flat reduction index


@functools.lru_cache(maxsize=None)  # few distinct ones; sympy.Symbol() re-checks its assumptions on every call
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
        if isinstance(base, ModularIndexing) and isinstance(divisor, sympy.Integer) and int(base.args[2]) % int(divisor) == 0:
            # ((a // b) % m) // c == (a // (b * c)) % (m / c) when c divides m
            inner, step, modulus = base.args
            return ModularIndexing(inner, step * divisor, sympy.Integer(int(modulus) // int(divisor)))
        if isinstance(divisor, sympy.Integer) and isinstance(base, sympy.Add):
            split = _whole_constant(base, int(divisor))
            if split is not None:  # (rest + q*d + c) // d == q + (rest + c) // d, rest >= 0 and 0 <= c < d
                return split[0] + FloorDiv(split[1], divisor)
            # pull out terms that are exact multiples of the divisor
            exact = [t for t in base.args if _is_multiple(t, int(divisor))]
            if exact and len(exact) < len(base.args):
                rest = sympy.Add(*[t for t in base.args if t not in exact])
                if rest.is_nonnegative is not True:
                    return None  # (x - 8 + 9y) // 9 is not (x - 8) // 9 + y once printed: Triton's // truncates
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
        if isinstance(base, FloorDiv):  # ((a // b) // d) % m: one canonical form, so that pieces can join
            return ModularIndexing(base.args[0], base.args[1] * divisor, modulus)
        if isinstance(base, ModularIndexing) and isinstance(divisor, sympy.Integer) and \
                isinstance(modulus, sympy.Integer) and int(base.args[2]) % int(divisor) == 0:
            # ((a // b) % m) // d % n == (a // (b * d)) % n when d divides m and n divides m / d
            # (and % (m / d) when that is at most n: the outer modulo then changes nothing)
            inner, step, period = base.args[0], base.args[1], int(base.args[2]) // int(divisor)
            if period % int(modulus) == 0:
                return ModularIndexing(inner, step * divisor, modulus)
            if period <= int(modulus):
                return ModularIndexing(inner, step * divisor, period)
        if isinstance(divisor, sympy.Integer) and isinstance(modulus, sympy.Integer) and isinstance(base, sympy.Add):
            # drop terms that are multiples of divisor * modulus: they cannot change the result
            period = int(divisor) * int(modulus)
            split = _whole_constant(base, period)
            if split is not None:  # a constant of a period or more: whole periods change nothing
                return ModularIndexing(split[1], divisor, modulus)
            kept = [t for t in base.args if not _is_multiple(t, period)]
            rest = sympy.Add(*kept)
            # only while what is kept stays non-negative: Triton's % and // truncate toward zero
            if len(kept) < len(base.args) and rest.is_nonnegative is True:
                return ModularIndexing(rest, divisor, modulus)
            # ((d*k + rest) // d) % m == (k + rest // d) % m: the multiples of d leave the division
            exact = [t for t in base.args if _is_multiple(t, int(divisor))]
            rest = sympy.Add(*[t for t in base.args if t not in exact])
            if int(divisor) > 1 and exact and _non_negative(rest):
                whole = sympy.Add(*[sympy.expand(t / divisor) for t in exact])
                return ModularIndexing(whole + FloorDiv(rest, divisor), 1, modulus)
        return None


def digit_span(piece: FloorDiv | ModularIndexing, numel: int) -> tuple[int, int]:
    """The range [low, high) of an index's values that a piece of it reads: `a // low` reads
    [low, numel) of `a` in [0, numel), `(a // low) % m` reads [low, low * m)."""
    low = int(piece.args[1])
    return low, low * int(piece.args[2]) if isinstance(piece, ModularIndexing) else numel


def _whole_constant(base: sympy.Add, n: int) -> tuple[int, Expr] | None:
    """(q, rest + c) for a sum rest + q*n + c whose constant is n or more (0 <= c < n) and whose
    other terms are non-negative (Triton's // truncates, so only then is this floor division),
    else None: the lane of a pool's backward at row 2*h2 + 1 reads (2*w2 + 113) // 112."""
    constant = sum(int(t) for t in base.args if t.is_Integer)
    if constant < n or not _non_negative(base - constant):
        return None
    return constant // n, base - (constant // n) * n


def _is_multiple(term: Expr, n: int) -> bool:
    if term.is_Integer:
        return int(term) % n == 0
    coefficient, _ = term.as_coeff_Mul()
    return coefficient.is_Integer and int(coefficient) % n == 0


def unflatten(flat: Expr, sizes: Sequence[int]) -> list[Expr]:
    """Per-dimension indices of a row-major flat index over `sizes`."""
    total = math.prod(sizes)
    if total == 0:  # a tensor of no elements: no index into it is ever evaluated
        return [sympy.Integer(0) for _ in sizes]
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


# ---------------------------------------------------------------------------------
# Range-aware simplification and affine analysis
# ---------------------------------------------------------------------------------


def upper_bound(expr: Expr, bounds: dict[sympy.Symbol, int]) -> int | None:
    """Largest value `expr` takes when each symbol s ranges over [0, bounds[s]); None if unknown."""
    if expr.is_Integer:
        return int(expr)
    if isinstance(expr, sympy.Symbol):
        return bounds[expr] - 1 if expr in bounds else None
    if isinstance(expr, sympy.Add):
        total = 0
        for term in expr.args:
            if term.is_Integer:
                total += int(term)
                continue
            coefficient, rest = term.as_coeff_Mul()
            if coefficient < 0:
                continue  # a non-negative index expression: negative terms only lower the bound
            bound = upper_bound(rest, bounds)
            if bound is None:
                return None
            total += int(coefficient) * bound
        return total
    if isinstance(expr, sympy.Mul):
        coefficient, rest = expr.as_coeff_Mul()
        bound = upper_bound(rest, bounds) if rest != expr else None
        if bound is None or coefficient < 0:
            return None
        return int(coefficient) * bound
    if isinstance(expr, FloorDiv):
        bound = upper_bound(expr.args[0], bounds)
        return None if bound is None else bound // int(expr.args[1])
    if isinstance(expr, ModularIndexing):
        return int(expr.args[2]) - 1
    return None


def simplify_index(expr: Expr, bounds: dict[sympy.Symbol, int]) -> Expr:
    """Drops divisions and modulos that the symbols' ranges make trivial."""
    return _simplify_cached(expr, bounds_key(bounds))


def bounds_key(bounds: dict[sympy.Symbol, int]) -> tuple[tuple[sympy.Symbol, int], ...]:
    """`bounds` as a hashable key, the same whatever the dict's order."""
    return tuple(sorted(bounds.items(), key=lambda item: item[0].name))


# Large graphs repeat the same shapes, so the same expressions come back again and again (and
# the scheduler re-maps a whole group for each fusion it tries): simplify each one once.
@functools.lru_cache(maxsize=1 << 16)
def _simplify_cached(expr: Expr, bounds: tuple[tuple[sympy.Symbol, int], ...]) -> Expr:
    return _simplify(expr, dict(bounds))


def _simplify(expr: Expr, bounds: dict[sympy.Symbol, int]) -> Expr:
    return _rewrite(sympy.expand(expr), bounds)


def _rewrite(e: Expr, bounds: dict[sympy.Symbol, int]) -> Expr:
    # a module-level function, not a closure calling itself: such a closure is a reference cycle
    # that only the garbage collector frees, and this runs hundreds of thousands of times
    if not e.args or e.is_Integer or isinstance(e, sympy.Symbol):
        return e
    e = e.func(*[_rewrite(a, bounds) for a in e.args])
    if isinstance(e, FloorDiv):
        steps = _whole_steps(e.args[0], int(e.args[1]), bounds)
        if steps is not None:  # (r + c*q) // d with 0 <= r < c and c | d is q // (d/c)
            return _rewrite(FloorDiv(steps[1], int(e.args[1]) // steps[0]), bounds)
        bound = upper_bound(e.args[0], bounds)
        if bound is not None and bound < int(e.args[1]) and _non_negative(e.args[0]):
            return sympy.Integer(0)
    if isinstance(e, ModularIndexing):
        base, divisor, modulus = e.args
        steps = _whole_steps(base, int(divisor), bounds)
        if steps is not None:  # ((r + c*q) // d) % m with 0 <= r < c and c | d is (q // (d/c)) % m
            return _rewrite(ModularIndexing(steps[1], int(divisor) // steps[0], modulus), bounds)
        bound = upper_bound(base, bounds)
        if bound is not None and _non_negative(base) and bound // int(divisor) < int(modulus):
            simpler = FloorDiv(base, divisor)
            return _rewrite(simpler, bounds) if simpler != e else simpler  # its evaluation may expose more
        steps = _whole_steps(base, int(modulus), bounds) if divisor == 1 else None
        if steps is not None:  # (r + c*q) % (c*m) with 0 <= r < c is c*(q % m) + r: the pieces may join
            step, whole = steps
            return _rewrite(sympy.expand(base - step * whole) + step * ModularIndexing(whole, 1, int(modulus) // step),
                            bounds)
    if isinstance(e, sympy.Add):
        joined = _recombine(e)
        return _rewrite(joined, bounds) if joined != e else e  # a joined division may now be trivial
    return e


def _whole_steps(base: Expr, divisor: int, bounds: dict[sympy.Symbol, int]) -> tuple[int, Expr] | None:
    """(c, q) with base = r + c*q, c dividing `divisor`, c > 1 and 0 <= r < c by the symbols'
    ranges (the largest such c), else None."""
    terms = sympy.Add.make_args(base)
    if len(terms) < 2 or not _non_negative(base):
        return None
    steps = sorted({int(t.as_coeff_Mul()[0]) for t in terms if t.as_coeff_Mul()[0].is_Integer}, reverse=True)
    for step in steps:
        if step <= 1 or divisor % step:
            continue
        exact = [t for t in terms if _is_multiple(t, step)]
        rest = sympy.Add(*[t for t in terms if not _is_multiple(t, step)])
        bound = upper_bound(rest, bounds)
        if rest != 0 and bound is not None and bound < step:
            return step, sympy.expand(sympy.Add(*exact) / step)
    return None


def _non_negative(expr: Expr) -> bool:
    return all(t.as_coeff_Mul()[0] >= 0 for t in sympy.Add.make_args(expr))


def _recombine(expr: sympy.Add) -> Expr:
    """Joins the per-dimension pieces of one flat index back together (the inverse of unflatten):
    k*((e//d) % s1) + k*s1*((e//(d*s1)) % s2) -> k*((e//d) % (s1*s2)), and
    k*((e//d) % s1) + k*s1*(e//(d*s1))        -> k*(e//d), which is k*e when d is 1."""
    terms = list(expr.args)
    while (joined := _join_one_pair(terms)) is not None:
        terms = joined
    return sympy.Add(*terms)


def _join_one_pair(terms: list[Expr]) -> list[Expr] | None:
    for i, term in enumerate(terms):
        k, low = term.as_coeff_Mul()
        if not isinstance(low, ModularIndexing):
            continue
        base, divisor, size = low.args
        for j, other in enumerate(terms):
            coefficient, high = other.as_coeff_Mul()
            if j == i or coefficient != k * size or not high.args or high.args[0] != base:
                continue
            if isinstance(high, ModularIndexing) and high.args[1] == divisor * size:
                merged = k * ModularIndexing(base, divisor, size * high.args[2])
            elif isinstance(high, FloorDiv) and high.args[1] == divisor * size:
                merged = k * FloorDiv(base, divisor)
            else:
                continue
            return [t for n, t in enumerate(terms) if n not in (i, j)] + [merged]
    return None


def affine_coefficients(expr: Expr, symbols: list[sympy.Symbol]) -> tuple[dict[sympy.Symbol, int], int] | None:
    """(coefficient per symbol, constant) when `expr` is affine in `symbols` with integer coefficients."""
    expr = sympy.expand(expr)
    coefficients: dict[sympy.Symbol, int] = {}
    constant = 0
    for term in sympy.Add.make_args(expr):
        if term.is_Integer:
            constant += int(term)
            continue
        coefficient, rest = term.as_coeff_Mul()
        if rest not in symbols or not coefficient.is_Integer:
            return None
        coefficients[rest] = coefficients.get(rest, 0) + int(coefficient)
    return coefficients, constant
