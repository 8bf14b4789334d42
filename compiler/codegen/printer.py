"""Prints sympy index expressions as Triton expressions."""

from __future__ import annotations

from typing import Callable

import sympy

from compiler.indexing import Expr, FloorDiv, ModularIndexing


def texpr(expr: Expr, name_of: Callable[[Expr], str | None] = lambda e: None) -> str:
    """Triton source for `expr`; `name_of` may map a subexpression to a variable already defined."""
    named = name_of(expr)
    if named is not None:
        return named
    if isinstance(expr, sympy.Integer):
        return str(int(expr))
    if isinstance(expr, sympy.Symbol):
        return expr.name
    if isinstance(expr, sympy.Add):
        terms = sorted(expr.args, key=sympy.default_sort_key)
        text = texpr(terms[0], name_of)
        for term in terms[1:]:
            coefficient, rest = term.as_coeff_Mul()
            if coefficient.is_negative:
                text += f" - {texpr(-term, name_of)}"
            else:
                text += f" + {texpr(term, name_of)}"
        return f"({text})"
    if isinstance(expr, sympy.Mul):
        coefficient, rest = expr.as_coeff_Mul()
        if coefficient == -1:
            return f"(-{texpr(rest, name_of)})"
        return "*".join(_factor(f, name_of) for f in expr.args)
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and int(expr.exp) > 0:
        return "*".join([_factor(expr.base, name_of)] * int(expr.exp))
    if isinstance(expr, FloorDiv):
        return f"({texpr(expr.args[0], name_of)} // {texpr(expr.args[1], name_of)})"
    if isinstance(expr, ModularIndexing):
        base, divisor, modulus = expr.args
        inner = texpr(base, name_of) if divisor == 1 else f"({texpr(base, name_of)} // {texpr(divisor, name_of)})"
        return f"({inner} % {texpr(modulus, name_of)})"
    raise NotImplementedError(f"cannot print index expression {expr!r} ({type(expr).__name__})")


def _factor(expr: Expr, name_of: Callable[[Expr], str | None]) -> str:
    text = texpr(expr, name_of)
    return text if not isinstance(expr, sympy.Add) else f"({text})"
