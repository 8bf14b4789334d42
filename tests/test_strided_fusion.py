"""Pointwise producers kept out of a reduction kernel that would walk their buffers strided
(compiler.strided_fusion): PoolFormer's GroupNorm over whole images reads an NCHW copy of a
channels-last tensor, and the copy, fused into the statistics, would read and write its
channels-last buffers C elements apart along the row. Checked on the schedule, and against eager
(the CPU interpreter runs the kernels)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from compiler.bounds import WorkLimits
from compiler.lowering import lower
from compiler.options import CompileOptions
from compiler.scheduler import KernelGroup, schedule
from tests.test_row_order import _reduction_groups
from tests.test_scheduler import compile_and_check

STRIDED = "would be strided in the reduction"


def layer_scale_group_norm(x, residual, scale, weight, bias):
    """PoolFormer's block tail on channels-last tensors: a residual add of a per-channel-scaled
    branch, then GroupNorm over whole images (one group) of its contiguous copy."""
    summed = residual + x * scale.view(-1, 1, 1)
    return summed, F.group_norm(summed.contiguous(), 1, weight, bias)


def copy_group_norm(x, weight, bias):
    return F.group_norm(x.contiguous(), 1, weight, bias)


def _channels_last(*shape):
    return torch.randn(*shape).to(memory_format=torch.channels_last)


def _schedule(fn, *inputs):
    return _reduction_groups(fn, *inputs)[1]


def _refusals(planned) -> list[str]:
    return [r["reason"] for r in planned.fusion_log["refused"] if STRIDED in r["reason"]]


def _reductions_reading(planned, buffer: str) -> list[KernelGroup]:
    return [s for s in planned.steps if isinstance(s, KernelGroup) and s.is_reduction
            and any(buffer in planned.read_writes[n].read_buffers() for n in s.node_names)]


@pytest.mark.parametrize("shape", [(2, 8, 5, 7), (3, 16, 4, 4)])
def test_a_channels_last_copy_stays_out_of_the_statistics(shape):
    inputs = (_channels_last(*shape), torch.randn(shape[1]) + 1, torch.randn(shape[1]))
    planned = _schedule(copy_group_norm, *inputs)
    assert _refusals(planned)
    assert not _reductions_reading(planned, planned.program.inputs[0].name)
    compile_and_check(copy_group_norm, *inputs)


def test_the_refusal_is_what_keeps_them_apart(monkeypatch):
    monkeypatch.setattr("compiler.strided_fusion.REFUSE_STRIDED", False)
    inputs = (_channels_last(2, 8, 5, 7), torch.randn(8) + 1, torch.randn(8))
    planned = _schedule(copy_group_norm, *inputs)
    assert not _refusals(planned)
    assert _reductions_reading(planned, planned.program.inputs[0].name)


def test_poolformer_layer_scale_and_group_norm_match_eager():
    shape = (2, 12, 6, 5)
    inputs = (_channels_last(*shape), _channels_last(*shape), torch.randn(12), torch.randn(12) + 1, torch.randn(12))
    planned = _schedule(layer_scale_group_norm, *inputs)
    assert _refusals(planned)
    compile_and_check(layer_scale_group_norm, *inputs)


def test_a_non_contiguous_channels_last_input_stays_correct():
    every_other_row = lambda x, w, b: copy_group_norm(x[:, :, ::2], w, b)  # noqa: E731 (strides of neither layout)
    compile_and_check(every_other_row, _channels_last(2, 8, 10, 7), torch.randn(8) + 1, torch.randn(8))


def test_a_producer_in_the_row_order_still_fuses():
    """A ReLU on a contiguous NCHW tensor walks its buffers as the statistics do: one kernel reads it."""
    inputs = (torch.randn(2, 8, 5, 7), torch.randn(8) + 1, torch.randn(8))
    fn = lambda x, w, b: F.group_norm(torch.relu(x), 1, w, b)  # noqa: E731
    planned = _schedule(fn, *inputs)
    assert not _refusals(planned)
    assert _reductions_reading(planned, planned.program.inputs[0].name)
    compile_and_check(fn, *inputs)


def test_accesses_a_few_elements_apart_share_sectors_and_stay_fused():
    """CaiT's talking-heads softmax: scores stored (batch, query, key, head) with 4 heads, a
    softmax over keys of each head. Its producer reads 4 elements apart along the keys (16 bytes of
    float32, within a sector): fused, as it ran faster."""
    def talking_heads_softmax(scores, head_bias):
        return torch.softmax((scores + head_bias).permute(0, 3, 1, 2).contiguous(), -1)

    inputs = (torch.randn(2, 9, 40, 4), torch.randn(4))
    planned = _schedule(talking_heads_softmax, *inputs)
    assert not _refusals(planned)
    assert _reductions_reading(planned, planned.program.inputs[0].name)
    compile_and_check(talking_heads_softmax, *inputs)


def test_one_channels_last_input_of_three_keeps_the_producer_apart():
    """PoolFormer's token mixer: (pooled - normed) * scale added to a channels-last convolution, an
    NCHW copy of that normalized over whole images. A third of the producer's bytes are strided."""
    def token_mixer_group_norm(pooled, normed, conv, scale, weight, bias):
        mixed = conv + (pooled - normed) * scale.view(-1, 1, 1)
        return mixed, F.group_norm(mixed.contiguous(), 1, weight, bias)

    shape = (2, 8, 5, 7)
    inputs = (torch.randn(shape), torch.randn(shape), _channels_last(*shape), torch.randn(8), torch.randn(8) + 1,
              torch.randn(8))
    planned = _schedule(token_mixer_group_norm, *inputs)
    assert _refusals(planned)
    assert not _reductions_reading(planned, planned.program.inputs[0].name)  # the pooled input, NCHW
    compile_and_check(token_mixer_group_norm, *inputs)


@pytest.mark.parametrize("share, apart", [(None, True), (0.5, False)])
def test_poolformers_token_mixer_stays_apart_at_a_third_strided(monkeypatch, share, apart):
    """The case cut from PoolFormer's forward (bench/held_out_3_images, scheduled for the GPU
    target): 38.5 of its producer's 102.8 MB would be strided, under half, over a quarter."""
    from bench.model_cases import load_cases
    from tests.test_model_cases import CASES_DIR

    if share is not None:
        monkeypatch.setattr("compiler.strided_fusion.STRIDED_SHARE", share)
    name = "poolformer_fw_sub_mul_add_native_group_norm_32x64x56x56_bf16"
    (case,) = [c for c in load_cases(CASES_DIR.parent / "held_out_3_images", wanted=[name]) if c.name == name]
    planned = schedule(lower(case.graph, WorkLimits()), CompileOptions(autotune=False, benchmark_fusion=False), None)
    convolution = [spec.name for spec in case.graph.inputs].index("convolution")  # the channels-last input
    assert bool(_refusals(planned)) == apart
    assert bool(_reductions_reading(planned, planned.program.inputs[convolution].name)) != apart


def copy_batch_norm_relu(x, weight, bias):
    """BoTNet's: BatchNorm statistics over an NCHW copy of a channels-last tensor, the ReLU stored
    channels-last again; the copy is an output too (a training graph saves it for the backward)."""
    copy = x.contiguous()
    normed = F.batch_norm(copy, None, None, weight, bias, training=True)
    return copy, normed.relu().contiguous(memory_format=torch.channels_last)


def test_few_long_rows_count_only_the_row_axis(monkeypatch):
    """8 rows of 4 x 16 x 16 = 1024 (strided_fusion.LONG_ROW, fewer than FEW_ROWS): the copy reads
    the input 8 channels apart along the row, contiguous only across rows, which a program of one row
    does not share. With the rule off, or rows as many as FEW_ROWS, both axes decide and the copy
    joins the reduction."""
    inputs = (_channels_last(4, 8, 16, 16), torch.randn(8) + 1, torch.randn(8))
    planned = _schedule(copy_batch_norm_relu, *inputs)
    assert _refusals(planned)
    assert not _reductions_reading(planned, planned.program.inputs[0].name)
    compile_and_check(copy_batch_norm_relu, *inputs)
    monkeypatch.setattr("compiler.strided_fusion.FEW_ROWS", 8)
    assert _reductions_reading(_schedule(copy_batch_norm_relu, *inputs), planned.program.inputs[0].name)
    monkeypatch.setattr("compiler.strided_fusion.FEW_ROWS", 9)
    monkeypatch.setattr("compiler.strided_fusion.LONG_ROWS_BY_ROW_AXIS", False)
    assert _reductions_reading(_schedule(copy_batch_norm_relu, *inputs), planned.program.inputs[0].name)
