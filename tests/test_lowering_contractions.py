"""Contractions spelled as a broadcast multiply and a sum (compiler/lowering/contractions.py) run
as one ATen bmm, against eager: Mamba-2's state products, several summed and kept dims, keepdim,
expanded and transposed operands, bf16, bf16 operands of a float32 result; and the sums that must
stay reductions (a mat-vec shape, a dim summed in one operand only, a product read twice, a sum into
float64)."""

from __future__ import annotations

import pytest
import torch

from tests.lowering_cases import BF16, check, rand

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on masked-off lanes

BMM = ["aten.bmm.default"]


def _as_matmul(fn, *inputs, **kwargs):
    result = check(fn, *inputs, expect_no_extern=False, reference64=True, **kwargs)
    assert result.externs == BMM, result.externs
    return result


def test_mamba_state_products():
    """out[b, c, l, h, p] = sum_s C[b, c, l, s, h] * states[b, c, s, h, p] (M=l, K=s, N=p, batch b, c, h)."""
    def fn(c, states):
        return (c.unsqueeze(-1) * states.unsqueeze(2)).sum(3)

    _as_matmul(fn, rand((2, 3, 20, 18, 3)), rand((2, 3, 18, 3, 16)))


@pytest.mark.parametrize("keepdim", [False, True])
def test_several_summed_and_kept_dims(keepdim):
    def fn(a, b):  # batch 2, K = 6 x 3, M = 4 x 5, N = 17
        return (a[..., None] * b[:, :, None, None]).sum((1, 4), keepdim=keepdim)

    def fn_moved(a, b):  # M's dims swapped, the summed dims counted from the end
        return (a.permute(0, 1, 3, 2, 4)[..., None] * b[:, :, None, None]).sum((-5, -2), keepdim=keepdim)

    a, b = rand((2, 6, 4, 5, 3)), rand((2, 6, 3, 17))
    _as_matmul(fn, a, b)
    _as_matmul(fn_moved, a, b)


def test_expanded_and_transposed_operands():
    """An operand expanded along the other's dim (stride 0) does not span it; a transposed one is
    copied into the bmm's layout."""
    def fn(a, b):
        wide = a.unsqueeze(-1).expand(2, 24, 20, 16)
        return (wide * b.transpose(1, 2).unsqueeze(1)).sum(2)

    _as_matmul(fn, rand((2, 24, 20)), rand((2, 16, 20)))


def test_bf16():
    _as_matmul(lambda a, b: (a.unsqueeze(-1) * b.unsqueeze(1)).sum(2), rand((3, 16, 32), BF16), rand((3, 32, 16), BF16))


def test_bf16_operands_of_a_float32_result():
    """A linear's bf16 output beside float32 states (eager's multiply promotes it, exactly), and a
    product of bf16 values summed into float32, as CUDA autocast sums: the bmm runs in float32."""
    _as_matmul(lambda a, b: (a.unsqueeze(-1) * b.unsqueeze(1)).sum(2), rand((3, 16, 32), BF16), rand((3, 32, 16)))
    _as_matmul(lambda a, b: (a.unsqueeze(-1) * b.unsqueeze(1)).sum(2, dtype=torch.float32),
               rand((3, 16, 32), BF16), rand((3, 32, 16), BF16))


@pytest.mark.parametrize("fn", [
    lambda a, b: (a * b.transpose(1, 2)[:, :1]).sum(-1),  # a mat-vec shape: N = 1
    lambda a, b: (a.unsqueeze(-1) * b[:, :1, :].unsqueeze(1)).sum(2),  # K spanned by one operand only
    lambda a, b: ((a.unsqueeze(-1) * b.unsqueeze(1)) + 0).sum(2),  # no product directly under the sum
    lambda a, b: (a.unsqueeze(-1) * b.unsqueeze(1)).sum(2, dtype=torch.float64),
], ids=["matvec", "one_sided", "not_a_product", "into_float64"])
def test_sums_that_stay_reductions(fn):
    result = check(fn, rand((4, 20, 18)), rand((4, 18, 20)), reference64=True)
    assert not result.externs


@pytest.mark.parametrize("other_reader", ["amax", "cat"])
def test_a_product_read_twice_stays_a_reduction(other_reader):
    """Read again directly, or as one of a cat's pieces (a reference inside the cat's list)."""
    def fn(a, b):
        product = a.unsqueeze(-1) * b.unsqueeze(1)
        again = product.amax(2) if other_reader == "amax" else torch.cat([product, a.unsqueeze(-1).expand(2, 16, 18, 16)], 2)
        return product.sum(2), again

    result = check(fn, rand((2, 16, 18)), rand((2, 18, 16)), reference64=True)
    assert not result.externs
