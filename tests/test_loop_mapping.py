"""Inverting an access onto a kernel's loops (compiler/loop_mapping.py) only where it maps kernel
points one to one: a read that reaches one element from two points (a slice_backward's read,
masked to every other row) would map a node onto half its elements, twice each."""

from __future__ import annotations

import pytest

from compiler.indexing import XINDEX, FloorDiv, ModularIndexing
from compiler.loop_mapping import _one_to_one


@pytest.mark.parametrize("rows", [8, 4096])  # every point checked; sampled points one digit apart
def test_an_index_that_drops_a_digit_is_not_one_to_one(rows):
    numel = rows * 1024
    bounds = {XINDEX: numel}
    drops_a_digit = 1024 * FloorDiv(XINDEX, 2048) + ModularIndexing(XINDEX, 1, 1024)  # Mamba's scan backward
    assert not _one_to_one(drops_a_digit, bounds)
    reordered = rows * ModularIndexing(XINDEX, 1, 1024) + FloorDiv(XINDEX, 1024)
    assert _one_to_one(reordered, bounds) and _one_to_one(XINDEX + 3, bounds)
