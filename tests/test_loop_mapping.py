"""Inverting an access onto a kernel's loops (compiler/loop_mapping.py) only where it maps kernel
points one to one: a read that reaches one element from two points (a slice_backward's read,
masked to every other row) would map a node onto half its elements, twice each. A node laid onto the
kernel by its shape alone yields to an access that inverts, where its own order is refused."""

from __future__ import annotations

import pytest
import torch

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


def _head_norm(x, scale):
    """xLSTM's multi-head norm statistics: a division over (batch, head, time, dim) rows, the rows moved
    to (batch, time, head) order, cast to float32, then each row's mean and inverse deviation."""
    divided = x / scale
    rows = divided.permute(0, 2, 1, 3).float()
    return divided, rows, rows.mean(-1, keepdim=True), torch.rsqrt(rows.var(-1, keepdim=True, correction=0) + 1e-6)


@pytest.mark.parametrize("accesses_first", [True, False])
def test_a_division_met_before_the_permute_it_feeds_fuses_into_the_row_statistics(accesses_first, monkeypatch):
    from compiler import loop_mapping
    from tests.test_scheduler import compile_and_check, kernel_count

    monkeypatch.setattr(loop_mapping, "ACCESSES_BEFORE_SHAPES", accesses_first)
    x, scale = torch.randn(2, 3, 7, 33).to(torch.bfloat16), torch.rand(2, 3, 7, 1).add(0.5).to(torch.bfloat16)
    artifact = compile_and_check(_head_norm, x, scale)
    assert kernel_count(artifact) == (1 if accesses_first else 2)
