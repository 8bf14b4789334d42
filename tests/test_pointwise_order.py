"""The walk order of pointwise kernels (compiler/pointwise_order.py): the buffers that reach
memory choose it, not an anchor whose value stays in registers."""

from __future__ import annotations

import pytest
import torch

from compiler import pointwise_order
from compiler.indexing import XINDEX, FloorDiv, ModularIndexing
from tests.test_scheduler import compile_and_check


def channels_last(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).to(memory_format=torch.channels_last)


def masked_scale(g, o, mask, s):
    # ConvNeXt-V2's GRN backward in small: the first op's value (an NCHW copy) never reaches memory
    return o + torch.where(mask, 0.0, g.contiguous()) * s


def _inputs(n: int, c: int, h: int, w: int) -> list[torch.Tensor]:
    return [channels_last(n, c, h, w), channels_last(n, c, h, w), torch.rand(n, c, 1, 1) > 0.5,
            torch.randn(n, c, 1, 1)]


def _memory_lines(artifact) -> list[str]:
    source = artifact.kernel_source(artifact.manifest["kernels"][0])
    return [line.strip() for line in source.splitlines() if "tl.load" in line or "tl.store" in line]


@pytest.mark.parametrize("shape", [(3, 20, 7, 9), (2, 33, 5, 13)])
def test_channels_last_buffers_walked_in_their_order_need_no_tile(shape):
    artifact = compile_and_check(masked_scale, *_inputs(*shape))
    kernels = artifact.manifest["kernels"]
    assert len(kernels) == 1 and not kernels[0]["config"].get("tiled")
    full = [line for line in _memory_lines(artifact) if "ptr_arg0" in line or "ptr_arg1" in line or "tl.store" in line]
    assert len(full) == 3 and all("+ xindex," in line for line in full), full


def test_without_the_rule_the_same_kernel_is_tiled(monkeypatch):
    monkeypatch.setattr(pointwise_order, "ORDER_BY_MEMORY", False)
    artifact = compile_and_check(masked_scale, *_inputs(3, 20, 7, 9))
    assert artifact.manifest["kernels"][0]["config"].get("tiled")


def test_a_sliced_channels_last_input_is_read_correctly():
    artifact = compile_and_check(lambda g, o, mask, s: masked_scale(g[:, :, 1:, 2:], o[:, :, 1:, 2:], mask, s),
                                 *_inputs(2, 12, 9, 11))
    assert len(artifact.manifest["kernels"]) == 1


def test_a_transpose_left_in_the_kernel_is_still_tiled():
    # channels-last in, NCHW out: no order makes both contiguous, so the kernel keeps a 2D tile
    artifact = compile_and_check(lambda g: torch.relu(g.contiguous() * 2) + 1, channels_last(4, 64, 9, 7))
    assert artifact.manifest["kernels"][0]["config"].get("tiled")


def test_dim_strides_reads_each_dims_step_from_a_flat_index():
    sizes = (4, 5, 6)  # the flat index walks (n, c, hw); the address is laid out (n, hw, c)
    n, c, hw = FloorDiv(XINDEX, 30), ModularIndexing(XINDEX, 6, 5), ModularIndexing(XINDEX, 1, 6)
    assert pointwise_order.dim_strides(30 * n + 5 * hw + c, sizes) == [30, 1, 5]
    assert pointwise_order.dim_strides(5 * n + c, sizes) == [5, 1, 0]  # a broadcast over hw
    assert pointwise_order.dim_strides(XINDEX, (0, 5)) is None  # no points: nothing to measure
