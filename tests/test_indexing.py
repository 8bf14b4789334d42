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


def test_whole_periods_of_a_constant_leave_divisions_and_modulos():
    """The odd-row, odd-column lane of a pool backward's cell (compiler/unrolled_lanes.py) reads
    (2*j + 113) // 112 and % 112 over rows of 112: the constant's whole period leaves, and the rest
    stays under the divisor. Each form keeps its values over the index range."""
    j = ModularIndexing(XINDEX, 1, 56)
    bounds = {XINDEX: 112}
    assert simplify_index(ModularIndexing(2 * j + 113, 1, 112), bounds) == 2 * j + 1
    assert simplify_index(FloorDiv(2 * j + 113, 112), bounds) == 1
    for expr in (FloorDiv(j + 60, 7), ModularIndexing(j + 60, 1, 7), ModularIndexing(j + 60, 7, 3)):
        assert _values(simplify_index(expr, bounds), bounds) == _values(expr, bounds)


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


def test_a_group_norm_row_over_channels_and_pixels_is_a_plain_offset():
    """GroupNorm's statistics read each group's 8 channels x 56 x 56 pixels, contiguous in NCHW; the
    view chain gave a channel index (((448x + r//56) // 56) % 256) and a pixel index of nested
    modulos: 11 div/mods per element. They join into one offset, and the per-channel weight's index
    into r // 3136 plus a per-row term."""
    x, r = XINDEX, RINDEX
    bounds = {x: 1024, r: 25088}
    channel = ModularIndexing(448 * x + FloorDiv(r, 56), 56, 256)
    address = 802816 * FloorDiv(x, 32) + 3136 * channel + 56 * ModularIndexing(r, 56, 56) \
        + ModularIndexing(ModularIndexing(r, 1, 3136), 1, 56)
    assert simplify_index(address, bounds) == 25088 * x + r
    assert simplify_index(channel, bounds) == FloorDiv(r, 3136) + 8 * ModularIndexing(x, 1, 32)


def test_nested_divisions_and_modulos_take_one_canonical_form():
    x = XINDEX
    assert ModularIndexing(ModularIndexing(x, 1, 3136), 1, 56) == ModularIndexing(x, 1, 56)
    assert ModularIndexing(ModularIndexing(x, 2, 48), 3, 4) == ModularIndexing(x, 6, 4)
    assert ModularIndexing(ModularIndexing(x, 1, 12), 3, 8) == ModularIndexing(x, 3, 4)  # 4 <= 8: no-op
    assert ModularIndexing(FloorDiv(x, 50257), 1, 1024) == ModularIndexing(x, 50257, 1024)
    assert ModularIndexing(448 * x + FloorDiv(RINDEX, 56), 56, 256) == \
        ModularIndexing(8 * x + FloorDiv(RINDEX, 3136), 1, 256)


@settings(max_examples=80, deadline=None)
@given(c=st.integers(1, 6), d=st.integers(1, 6), m=st.integers(1, 8), n=st.integers(1, 8),
       e=st.integers(1, 4), f=st.integers(1, 5), data=st.data())
def test_compositions_of_divisions_and_modulos_keep_their_values(c, d, m, n, e, f, data):
    """Every rule at once, on small ranges: nested modulos, multiples pulled out of a modulo, a
    modulo split at a factor of its modulus, and the joins after them."""
    x, r = XINDEX, RINDEX
    bounds = {x: data.draw(st.integers(1, 12)), r: data.draw(st.integers(1, 12))}
    pieces = [ModularIndexing(c * e * x + FloorDiv(r, f), e, m * n), ModularIndexing(ModularIndexing(x, d, m * n), e, n),
              ModularIndexing(c * x + r, 1, c * m), FloorDiv(ModularIndexing(x + d * r, 1, m * n), n)]
    by_hand = [lambda i, j: ((c * e * i + j // f) // e) % (m * n), lambda i, j: ((i // d) % (m * n) // e) % n,
               lambda i, j: (c * i + j) % (c * m), lambda i, j: ((i + d * j) % (m * n)) // n]
    weights = [data.draw(st.integers(0, 7)) for _ in pieces]
    expr = sum((w * p for w, p in zip(weights, pieces)), sympy.Integer(0))
    direct = [sum(w * piece(i, j) for w, piece in zip(weights, by_hand))
              for j in range(bounds[r]) for i in range(bounds[x])]  # _values' order: by name, rindex first
    assert _values(expr, bounds) == direct  # the constructors' own rewrites keep the values
    assert _values(simplify_index(expr, bounds), bounds) == direct
