"""Loads of a masked piece (a cat's input, the inside of a pad, the source of a slice_scatter) with
its index known to lie in the piece.

Such a piece is read at `x - offset` under the mask `offset <= x < offset + size`. Index
simplification knows no masks, so `x - offset` may be negative to it, and the divisions that views
put between the piece and its buffers cannot be joined: the gradient of CoaT's class-token cat read
a channels-last convolution's gradient through `((-64 + 200704*(x // 200768) + x % 200768) // 3584)
% 56` and two more such terms, where the buffer is walked at `-64 + 200704*n + m` (H100, 2026-11-27:
23.6 us, 0.84x Inductor; placed as below, 19.5 us against Inductor's 19.1).

Here the piece is loaded at a fresh symbol `p`, known to lie in [0, size). Every index its loads and
index values produce is simplified with that bound, then `p` is replaced by `x - offset`. Inside the
mask both name the same element; outside it the load is masked, so any address does. A handler that
inlines a producer into its reader (compiler/inline_gathers.py) takes the placement beneath it, so
that the producer's loads at the piece's coordinates are placed too.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import sympy

from compiler.indexing import Expr, simplify_index
from compiler.ops import load_selected

BOUNDED_PIECE_INDEX = True  # off: loads at `x - offset` as written (A/B runs, bench/switch_ab.py)
# A piece at offset 0 is read at the bare symbol of its dim, placed too: a kernel's rindex may stand
# where the piece's own loop variable stood at lowering, and its range is the whole cat's. Mamba-2's
# gate backward, 2D-tiled along a cat of 2048 + 64 + 64 channels, read its first piece back through a
# reshape as digits of a flat offset (`(r % 2048) + 2048 * ((r // 2048 + l) % 1024) + ...`).
BARE_SYMBOLS_PLACED = True  # off: a bare symbol is loaded as it is (A/B runs, bench/switch_ab.py)
_depth = threading.local()  # pieces of pieces get symbols of their own


def _load_piece(ops: Any, load: Callable[[Any, Expr], Any], position: Expr, size: int) -> Any:
    """`load(ops, i)` for the piece's index i = `position`, known to lie in [0, size) wherever the
    caller's mask holds."""
    position = sympy.sympify(position)
    if not BOUNDED_PIECE_INDEX or position.is_Integer or (isinstance(position, sympy.Symbol) and not BARE_SYMBOLS_PLACED):
        return load(ops, position)
    depth = getattr(_depth, "value", 0)
    symbol = sympy.Symbol(f"piece{depth}", integer=True, nonnegative=True)
    _depth.value = depth + 1
    try:
        def bounded(inner: Any) -> Any:
            return _BoundedIndexOps(inner, symbol, size, position)

        # a handler that inlines producers (inline_gathers) takes the placement beneath it, so that
        # the producers' own loads, evaluated at the piece's coordinates, are placed too
        return load(ops.rewrapped(bounded) if hasattr(type(ops), "rewrapped") else bounded(ops), symbol)
    finally:
        _depth.value = depth


def load_pieces(ops: Any, x: Any, index: list, dims: list[int]) -> Any:
    """`x.load(ops, index)` with the entries of `dims` known to lie in [0, x.size[d]) wherever the
    caller's mask holds: each placed by _load_piece, nested."""
    if not dims:
        return x.load(ops, index)
    d, rest = dims[0], dims[1:]

    def load(inner_ops: Any, position: Expr) -> Any:
        placed = list(index)
        placed[d] = position
        return load_pieces(inner_ops, x, placed, rest)

    return _load_piece(ops, load, index[d], x.size[d])


class _BoundedIndexOps:
    """`ops`, with the index of every load and index value simplified for `symbol` in [0, size), then
    `symbol` replaced by `position`."""

    def __init__(self, ops: Any, symbol: sympy.Symbol, size: int, position: Expr) -> None:
        self._ops, self._symbol, self._bounds, self._position = ops, symbol, {symbol: size}, position

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ops, name)

    def _placed(self, index: Expr) -> Expr:
        if not isinstance(index, sympy.Expr) or self._symbol not in index.free_symbols:
            return index
        return simplify_index(index, self._bounds).subs(self._symbol, self._position)

    def load(self, name: str, index: Expr, *args: Any, **kwargs: Any) -> Any:
        return self._ops.load(name, self._placed(index), *args, **kwargs)

    def load_selected(self, buffers: tuple[str, ...], selector: Expr, index: Expr) -> Any:
        return load_selected(self._ops, buffers, self._placed(selector), self._placed(index))

    def index_expr(self, expr: Expr, *args: Any, **kwargs: Any) -> Any:
        return self._ops.index_expr(self._placed(expr), *args, **kwargs)

    # no load_view: compiler.ops.load_view then reads a view's storage offset through `load`. The one
    # handler that reads views by coordinates (inline_gathers) sits above this one (`rewrapped`).
