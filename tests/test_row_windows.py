"""Row windows: a looped reduction over rows whose stride is no multiple of 16 elements walks each
row from the aligned element before it (compiler.codegen.kernel.ROW_ALIGN), with masked first and
last steps. Checked against eager on rows that leave the unmasked middle loop empty, one step
long, or long, with several rows per program (the CPU config's XBLOCK), in bf16 and float32."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.compare import reduction_passes
from tests.lowering_cases import kernel_sources
from tests.test_scheduler import compile_and_check, kernel_count

# CPU kernels loop over rows past 1024 in steps of 1024: 1100 leaves the middle loop empty, 2040
# needs a second tail step once shifted (2040 + 15 > 2048), 3001 and 5003 go through the middle
ODD_WIDTHS = (1100, 2040, 3001, 5003)


@pytest.mark.parametrize("width", ODD_WIDTHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_log_softmax_over_misaligned_rows(width, dtype):
    x = torch.randn(7, width).to(dtype)
    artifact = compile_and_check(lambda x: torch.log_softmax(x.float(), -1), x)
    source = kernel_sources(artifact)
    assert f"rshift = ({width}*xindex) % 16" in source
    assert len(reduction_passes(source)) == 2 and source.count("for roffset") == 6


@pytest.mark.parametrize("width", ODD_WIDTHS)
def test_welford_counts_each_lane_from_its_first_element(width):
    """Lanes before the row's start are empty in the first step: their Welford weight starts one
    step late (the loop's `rstep`)."""
    x = torch.randn(5, width) * 3 + 2
    artifact = compile_and_check(lambda x: torch.var_mean(x, -1, correction=0), x)
    assert "rshift" in kernel_sources(artifact)


@pytest.mark.parametrize("width", (2040, 3001))
def test_arg_reductions_and_positions_in_misaligned_rows(width):
    x = torch.randn(6, width)
    x[2, width - 1] = 100.0  # the last element of a row, in the masked tail
    x[3, 0] = 100.0  # the first element of a row, in the masked head
    compile_and_check(lambda x: (x.argmax(-1), x.argmin(-1)), x)
    compile_and_check(lambda x: x * torch.arange(width), x)


@pytest.mark.parametrize("width", ODD_WIDTHS)
def test_cross_entropy_forward_and_backward_over_an_odd_vocabulary(width):
    logits, target = torch.randn(6, width).to(torch.bfloat16), torch.randint(0, width, (6,))

    def forward_backward(x, t):  # the loss and its gradient, as a training graph computes them
        log_probs = torch.log_softmax(x.float(), -1)
        gradient = (log_probs.exp() - (torch.arange(width) == t[:, None]).float()) / x.shape[0]
        return F.nll_loss(log_probs, t), gradient.to(x.dtype)

    compile_and_check(forward_backward, logits, target)


def test_rows_of_a_multiple_of_16_keep_one_loop():
    artifact = compile_and_check(lambda x: torch.softmax(x, -1), torch.randn(3, 2048 + 16))
    source = kernel_sources(artifact)
    assert "rshift" not in source and source.count("for roffset") == len(reduction_passes(source)) == 2


def test_non_contiguous_rows_stay_correct():
    """A transposed input's reduced dim has stride != 1: its loads keep the plain index."""
    x = torch.randn(3001, 5).t()
    compile_and_check(lambda x: torch.softmax(x, -1) * 2, x)


def test_a_pointwise_consumer_over_the_rows_of_a_reduction_joins_its_kernel():
    """GPT-2's cross entropy backward: the reduction reads only per-row values (the target compared
    with the column index), its consumer reads the logits and the row sum; no access maps the
    consumer onto both loops, its shape does (rows on xindex, the row on rindex)."""
    width = 3001

    def fn(x, target):
        onehot = (torch.arange(width) == target[:, None]).float()
        total = onehot.sum(-1, keepdim=True)
        return x.float().exp() * total

    artifact = compile_and_check(fn, torch.randn(6, width).to(torch.bfloat16), torch.randint(0, width, (6,)))
    assert kernel_count(artifact) == 1
