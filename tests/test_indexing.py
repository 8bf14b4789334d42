"""Index simplification (compiler/indexing.py): simplified expressions equal the originals at
every point of the index ranges, and the pieces of a flat index join back into one."""

from __future__ import annotations

import math

import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.indexing import RINDEX, XINDEX, FloorDiv, ModularIndexing, flatten, simplify_index, unflatten

sizes_strategy = st.lists(st.integers(1, 6), min_size=1, max_size=4)


def _values(expr, bounds):
    symbols = sorted(bounds, key=str)
    points = [dict(zip(symbols, p)) for p in _grid([bounds[s] for s in symbols])]
    return [int(expr.subs(point)) for point in points]


def _grid(limits):
    if not limits:
        return [()]
    return [(i,) + rest for i in range(limits[0]) for rest in _grid(limits[1:])]


def test_the_pieces_of_a_flat_index_join_back_into_it():
    sizes = [16, 16, 1024]
    pieces = unflatten(XINDEX, sizes)
    strided = 1024 * flatten(pieces, sizes)  # 16777216*(x//16384) + 1048576*((x//1024)%16) + 1024*(x%1024)
    assert simplify_index(sympy.expand(strided), {XINDEX: 262144}) == 1024 * XINDEX


def test_a_row_offset_below_the_divisor_drops_out_of_divisions():
    bounds = {XINDEX: 4096, RINDEX: 1024}
    flat = RINDEX + 1024 * XINDEX
    assert simplify_index(ModularIndexing(flat, 1024, 1024), bounds) == ModularIndexing(XINDEX, 1, 1024)
    assert simplify_index(FloorDiv(flat, 1048576), bounds) == FloorDiv(XINDEX, 1024)
    overlapping = {XINDEX: 10, RINDEX: 5}  # rindex reaches the divisor: it must stay
    for expr in (ModularIndexing(RINDEX + 4 * XINDEX, 4, 8), FloorDiv(RINDEX + 4 * XINDEX, 8)):
        assert _values(simplify_index(expr, overlapping), overlapping) == _values(expr, overlapping)


@settings(max_examples=60, deadline=None)
@given(sizes=sizes_strategy, data=st.data())
def test_any_strided_view_of_a_flat_index_simplifies_to_an_equal_expression(sizes, data):
    strides = [data.draw(st.integers(0, 40)) for _ in sizes]
    numel = math.prod(sizes)
    expr = sum((s * p for s, p in zip(strides, unflatten(XINDEX, sizes))), sympy.Integer(0))
    bounds = {XINDEX: numel}
    simplified = simplify_index(expr, bounds)
    assert _values(simplified, bounds) == _values(expr, bounds)


@settings(max_examples=40, deadline=None)
@given(sizes=sizes_strategy, rows=st.integers(1, 5), data=st.data())
def test_indices_over_rows_and_reduction_elements_keep_their_values(sizes, rows, data):
    rnumel = data.draw(st.sampled_from([d for d in range(1, math.prod(sizes) + 1) if math.prod(sizes) % d == 0]))
    dims = [rows] + sizes
    strides = [data.draw(st.integers(0, 30)) for _ in dims]
    xnumel = math.prod(dims) // rnumel
    flat = RINDEX + rnumel * XINDEX
    expr = sum((s * p for s, p in zip(strides, unflatten(flat, dims))), sympy.Integer(0))
    bounds = {XINDEX: xnumel, RINDEX: rnumel}
    assert _values(simplify_index(expr, bounds), bounds) == _values(expr, bounds)


def test_multiples_stay_inside_when_the_rest_could_be_negative():
    """Triton's // and % truncate toward zero: (x - 8 + 9y) % 9 printed as (x - 8) % 9 is negative
    for x < 8 (it was, for a padded gradient whose producer was evaluated in its reader)."""
    from compiler.indexing import FloorDiv, ModularIndexing, index_symbol

    x, y = index_symbol("x", 0), index_symbol("x", 1)
    assert ModularIndexing(x - 8 + 9 * y, 1, 9).args[0] == x - 8 + 9 * y
    assert isinstance(FloorDiv(x - 8 + 9 * y, 9), FloorDiv)
    assert ModularIndexing(x + 8 + 9 * y, 1, 9) == ModularIndexing(x + 8, 1, 9)  # non-negative rest: simplified
    assert FloorDiv(x + 8 + 9 * y, 9) == y + FloorDiv(x + 8, 9)


def test_a_division_of_a_modulo_by_a_factor_of_its_modulus_is_one_modulo():
    # ((r % 12544) // 112) is (r // 112) % 112: then 112 * that + r % 112 joins into r % 12544,
    # the per-image index of an NCHW BatchNorm reduction over N, H, W (two div/mods per element, not four)
    bounds = {RINDEX: 50176}
    assert FloorDiv(ModularIndexing(RINDEX, 1, 12544), 112) == ModularIndexing(RINDEX, 112, 112)
    nchw = 802816 * FloorDiv(RINDEX, 12544) + 112 * FloorDiv(ModularIndexing(RINDEX, 1, 12544), 112) \
        + ModularIndexing(RINDEX, 1, 112)
    assert simplify_index(nchw, bounds) == 802816 * FloorDiv(RINDEX, 12544) + ModularIndexing(RINDEX, 1, 12544)
    small = {RINDEX: 360}
    for step, modulus, factor in ((3, 12, 4), (1, 36, 6), (5, 8, 8)):
        expr = FloorDiv(ModularIndexing(RINDEX, step, modulus), factor)
        assert _values(expr, small) == [((r // step) % modulus) // factor for r in range(360)]
