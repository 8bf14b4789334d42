"""Index expressions evaluated at many points at once, with numpy integer arrays.

`same_index` (loop_mapping) compares two expressions at up to a few thousand points of the
kernel's iteration space; substituting each point into the sympy expressions rebuilds and
re-simplifies them once per point, and that was most of the time the scheduler took on large
graphs. Here the expression is walked once and every operation is applied to whole columns.
The arithmetic is the same (integer floor division and modulo, as `FloorDiv` and
`ModularIndexing` evaluate on integers); an expression with anything else (a rational
coefficient, a function this module does not know) or whose values could overflow int64
gets None, and the caller substitutes points one by one as before.
"""

from __future__ import annotations

import numpy as np
import sympy

from compiler.indexing import Expr, FloorDiv, ModularIndexing

_LIMIT = 2**62  # magnitudes below this cannot overflow int64 in any one operation


class _Unsupported(Exception):
    pass


def evaluate(expr: Expr, columns: dict[sympy.Symbol, np.ndarray], bounds: dict[sympy.Symbol, int]) -> np.ndarray | None:
    """The values of `expr` at the points whose coordinates are `columns` (one array per symbol,
    values in [0, bounds[symbol])), or None when it cannot be evaluated here exactly."""
    try:
        if _magnitude(expr, bounds) >= _LIMIT:
            return None
        value = _evaluate(expr, columns)
    except _Unsupported:
        return None
    length = len(next(iter(columns.values()))) if columns else 1
    return np.broadcast_to(np.asarray(value, dtype=np.int64), (length,))


def _evaluate(expr: Expr, columns: dict[sympy.Symbol, np.ndarray]):
    if expr.is_Integer:
        return int(expr)
    if isinstance(expr, sympy.Symbol):
        if expr not in columns:
            raise _Unsupported
        return columns[expr]
    if isinstance(expr, sympy.Add):
        total = 0
        for term in expr.args:
            total = total + _evaluate(term, columns)
        return total
    if isinstance(expr, sympy.Mul):
        product = 1
        for factor in expr.args:
            product = product * _evaluate(factor, columns)
        return product
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and int(expr.exp) > 0:
        return _evaluate(expr.base, columns) ** int(expr.exp)
    if isinstance(expr, FloorDiv):
        return _evaluate(expr.args[0], columns) // _positive(expr.args[1])
    if isinstance(expr, ModularIndexing):
        return (_evaluate(expr.args[0], columns) // _positive(expr.args[1])) % _positive(expr.args[2])
    raise _Unsupported


def _positive(expr: Expr) -> int:
    if not expr.is_Integer or int(expr) <= 0:
        raise _Unsupported
    return int(expr)


def _magnitude(expr: Expr, bounds: dict[sympy.Symbol, int]) -> int:
    """An upper bound of |expr| (and of every intermediate value) over the points."""
    if expr.is_Integer:
        return abs(int(expr))
    if isinstance(expr, sympy.Symbol):
        if expr not in bounds:
            raise _Unsupported
        return bounds[expr]
    if isinstance(expr, sympy.Add):
        return sum(_magnitude(t, bounds) for t in expr.args)
    if isinstance(expr, sympy.Mul):
        product = 1
        for factor in expr.args:
            product *= _magnitude(factor, bounds)
        return product
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and int(expr.exp) > 0:
        return _magnitude(expr.base, bounds) ** int(expr.exp)
    if isinstance(expr, (FloorDiv, ModularIndexing)):
        return max(_magnitude(a, bounds) for a in expr.args)
    raise _Unsupported
