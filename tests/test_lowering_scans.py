"""Scan kernels (compiler/lowering/scans.py): cumsum and cumprod past SCAN_KERNEL_MAX_LENGTH run
in reduction kernels that keep every running total, against eager: inner and outer dims, rows in
registers and rows walked in a loop (a carry between steps), odd sizes, non-contiguous inputs,
float, bf16, integer and bool inputs, and the pointwise work around a scan fused into its kernel."""

from __future__ import annotations

import pytest
import torch

from compiler.codegen.heuristics import CPU_PERSISTENT_LIMIT
from compiler.lowering.registry import SCAN_KERNEL_MAX_LENGTH
from tests.lowering_cases import BF16, INT64, check, expanded, rand, strided, transposed

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on masked-off lanes

LONG = SCAN_KERNEL_MAX_LENGTH + 1
LOOPED = CPU_PERSISTENT_LIMIT * 2 + 37  # past the interpreter's persistent rows: three steps of a loop


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("length", [LONG, 100])
def test_cumsum_along_each_dim(dim, length):
    shape = [5, 3, 7]
    shape[dim] = length
    result = check(lambda v: torch.cumsum(v, dim), rand(shape))
    assert "tl.cumsum" in result.kernel_sources and len(result.kernels) == 1


def test_a_looped_scan_carries_each_row_total_between_steps():
    result = check(lambda v: (torch.cumsum(v, -1), torch.cumprod(1 + v / 1000, -1)), rand((3, LOOPED)),
                   reference64=True)  # eager's own rounding differs over 2,000 terms
    assert "carry" in result.kernel_sources


def test_a_looped_scan_along_an_outer_dim():
    check(lambda v: torch.cumsum(v, 0) * 0.5, rand((LOOPED, 5)), reference64=True)


@pytest.mark.parametrize("make", [transposed, strided, expanded], ids=["transposed", "strided", "expanded"])
def test_non_contiguous_inputs(make):
    check(lambda v: torch.cumsum(v, 1), make((4, 40, 6)))


def test_cumprod():
    check(lambda v: torch.cumprod(v, -1), rand((6, 33), low=0.9, high=1.1))


def test_bf16_accumulates_in_float32():
    check(lambda v: torch.cumsum(v, -1), rand((4, 300), BF16), reference64=True)


@pytest.mark.parametrize("dtype", [INT64, torch.int32, torch.bool], ids=str)
def test_integer_and_bool_inputs_give_int64(dtype):
    x = rand((4, 50), dtype) if dtype != torch.bool else rand((4, 50)) > 0.5
    check(lambda v: (torch.cumsum(v, -1), torch.cumsum(v, 0, dtype=torch.float32)), x)


def test_segment_sums_fuse_into_one_kernel():
    """Mamba-2's segment sums: a masked fill of a broadcast, a cumsum along a non-innermost dim, a
    second masked fill and an exp: one kernel, the running sums never stored."""
    n = 40
    outside = ~torch.tril(torch.ones(n, n, dtype=torch.bool))

    def segsum(v, outside):
        spread = v[..., None].expand(*v.shape, n).masked_fill(outside, 0.0)
        return torch.exp(torch.cumsum(spread, -2).masked_fill(outside, float("-inf")))

    result = check(segsum, rand((2, 3, n)), outside)
    assert len(result.kernels) == 1 and "tl.cumsum" in result.kernel_sources


def test_work_around_a_scan_in_one_row():
    """A reduction before the scan (its row max) and after it (the row's sum of running totals),
    a read of the totals in reverse (which cannot share the scan's registers)."""
    def fn(v):
        scanned = torch.cumsum(v - v.amax(-1, keepdim=True), -1)
        return scanned.sum(-1), scanned.flip(-1) * 2, torch.cumsum(v, -1).exp()

    check(fn, rand((7, 50)))

