"""Reduced dims walked in memory order (compiler.reduction_order): a sum over every dim of a
channels-last tensor walks (n, h, w, c), so that a row's neighbours, and a split's chunks, are
neighbours in memory. Checked on the IR (the order the stage picks) and against eager on the CPU
interpreter, split and whole, with odd sizes; argmax, column sums and the switch keep the logical order."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from compiler import reduction_order
from compiler.bounds import WorkLimits
from compiler.fx_import import from_fx
from compiler.ir import ComputeNode
from compiler.lowering import lower
from compiler.reduction_order import order_reduced_dims
from tests.test_scheduler import compile_and_check


def channels_last(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape).to(dtype).contiguous(memory_format=torch.channels_last)


def reduced_ranges(fn, *inputs) -> list[tuple[int, ...]]:
    """The reduction ranges of the program's reductions once this stage has run."""
    program = lower(from_fx(make_fx(fn)(*inputs), list(inputs)), WorkLimits())
    order_reduced_dims(program)
    return [n.reduction_ranges for n in program.nodes if isinstance(n, ComputeNode) and n.is_reduction]


def full_sum(x):
    return x.sum()


def per_sample_sum(x):
    return x.sum(dim=(1, 2, 3))


@pytest.mark.parametrize("fn, expected", [(full_sum, [(3, 33, 35, 7)]), (per_sample_sum, [(33, 35, 7)])])
def test_a_channels_last_sum_walks_its_channels_innermost(fn, expected):
    x = channels_last(3, 7, 33, 35)
    assert reduced_ranges(fn, x) == expected
    compile_and_check(fn, x)  # the full sum is split into chunks of the reordered row


def test_a_contiguous_sum_keeps_the_logical_order():
    assert reduced_ranges(full_sum, torch.randn(3, 7, 33, 35)) == [(3, 7, 33, 35)]


def test_a_permuted_bf16_sum_with_a_pad_is_correct():
    """HGNetV2's padded gradient: a negative pad (a slice) of a channels-last bf16 tensor, summed."""
    def pad_and_sum(x):
        padded = torch.constant_pad_nd(x, [0, -1, 0, -1])
        return padded, padded.sum(dim=(0, 1, 2, 3), keepdim=True)

    x = channels_last(2, 8, 41, 39, dtype=torch.bfloat16)
    assert reduced_ranges(pad_and_sum, x) == [(2, 40, 38, 8)]
    compile_and_check(pad_and_sum, x)


def test_variance_over_a_channels_last_tensor_is_reordered_and_correct():
    def var_mean(x):
        return torch.var_mean(x, dim=(1, 2, 3), correction=0)

    x = channels_last(2, 5, 17, 19)
    assert reduced_ranges(var_mean, x) == [(17, 19, 5)]
    compile_and_check(var_mean, x)


def test_reads_that_disagree_keep_the_logical_order_on_a_tie():
    """mse_loss decomposes into one sum reading both operands: as many bytes walk each order."""
    def mse(a, b):
        return torch.nn.functional.mse_loss(a, b)

    a = channels_last(2, 6, 9, 11)
    assert reduced_ranges(mse, a, torch.randn(2, 6, 9, 11)) == [(2, 6, 9, 11)]
    assert reduced_ranges(mse, a, channels_last(2, 6, 9, 11)) == [(2, 9, 11, 6)]
    compile_and_check(mse, a, torch.randn(2, 6, 9, 11))


def test_a_channels_last_amax_is_reordered_and_argmax_is_not_order_free():
    def amax(x):
        return x.amax(dim=(0, 2, 3), keepdim=True).sum() + x.amax()

    x = channels_last(3, 6, 5, 7)
    assert (3, 5, 7, 6) in reduced_ranges(amax, x)
    compile_and_check(amax, x)
    assert "argmax" not in reduction_order.ORDER_FREE  # on ties it reports the first in the logical order


def test_a_column_sum_keeps_its_rows_in_order():
    """BatchNorm's channel sum over (n, h, w) of a tensor laid out (h, n, w, c): a column reduction,
    left to the row order a mixed row kernel shares."""
    def channel_sum(x):
        return x.sum(dim=(0, 2, 3))

    x = torch.randn(5, 4, 3, 6).permute(1, 3, 0, 2)  # memory (h, n, w, c), logical (n, c, h, w)
    assert x.shape == (4, 6, 5, 3) and x.stride() == (18, 1, 72, 6)
    assert reduced_ranges(channel_sum, x) == [(4, 5, 3)]
    compile_and_check(channel_sum, x)


def test_the_switch_off_keeps_the_logical_order(monkeypatch):
    monkeypatch.setattr(reduction_order, "MEMORY_ORDER_REDUCTIONS", False)
    assert reduced_ranges(full_sum, channels_last(3, 7, 33, 35)) == [(3, 7, 33, 35)]
