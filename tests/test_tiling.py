"""2D tiling of pointwise kernels whose accesses disagree on the contiguous dim, and the
memory-order walk of kernels that do not need it."""

from __future__ import annotations

import pytest
import torch

from tests.test_scheduler import compile_and_check


@pytest.mark.parametrize("fn, shapes", [
    (lambda a, b: a.t() + b, [(70, 90), (90, 70)]),                        # transpose + add
    (lambda a: a.permute(0, 2, 1).contiguous() * 2, [(3, 50, 41)]),         # batched transpose copy
    (lambda a, b: torch.relu(a.t() + b) - 1, [(33, 129), (129, 33)]),       # sizes not divisible by the tile
])
def test_transposed_accesses_get_a_tiled_kernel(fn, shapes):
    artifact = compile_and_check(fn, *[torch.randn(*s) for s in shapes])
    kernels = artifact.manifest["kernels"]
    assert len(kernels) == 1 and kernels[0]["config"].get("tiled")
    step = next(s for s in artifact.plan["steps"] if s["op"] == "kernel")
    config, (rows, columns) = step["config"], (kernels[0]["numel"], kernels[0]["rnumel"])
    assert step["grid"] == [-(-rows // config["XBLOCK"]) * -(-columns // config["RBLOCK"]), 1, 1]  # every tile
    assert columns > 1 and rows > 1


def test_agreeing_accesses_stay_one_dimensional_and_walk_memory_order():
    artifact = compile_and_check(lambda a: a.permute(2, 0, 1) + 1, torch.randn(7, 9, 11))
    kernel = artifact.manifest["kernels"][0]
    assert not kernel["config"].get("tiled")
    source = artifact.kernel_source(kernel)
    # the output keeps the input's strides (as eager does), so both walk memory in order
    assert "tl.load(ptr_arg0 + xindex," in source and "tl.store(ptr_buf0 + xindex," in source


def test_small_kernels_are_not_tiled():
    artifact = compile_and_check(lambda a, b: a.t() + b, torch.randn(5, 6), torch.randn(6, 5))
    assert not artifact.manifest["kernels"][0]["config"].get("tiled")


@pytest.mark.parametrize("keep_nchw", [False, True])
def test_a_stride_two_pool_copied_channels_last_gets_a_tiled_kernel(keep_nchw):
    """A max pool over NCHW input whose output is copied channels-last (ResNet's stem under a
    layout change): its window loads step two elements along the width, which a tile's rows
    still read in whole lines, so the transposed store gets a 2D tile."""
    def fn(x):
        pooled, indices = torch.ops.aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1])
        copy = pooled.contiguous(memory_format=torch.channels_last)
        return (pooled, indices, copy) if keep_nchw else (copy,)

    artifact = compile_and_check(fn, torch.randn(2, 40, 23, 21))
    kernels = artifact.manifest["kernels"]
    assert len(kernels) == 1 and kernels[0]["config"].get("tiled")
    assert kernels[0]["numel"] > 1 and kernels[0]["rnumel"] > 1  # a tile with two real axes


def test_a_sum_over_a_dim_of_one_element_is_pointwise_and_tiled_when_transposed():
    """A sum over a size-1 dim reads one element: it lowers to that pointwise value, so a kernel
    whose accesses disagree on the contiguous dim is 2D-tiled instead of staying a 1D reduction
    kernel (Mamba-2's backward: heads innermost in one tensor, 256 x 256 blocks in another)."""
    def fn(a, b):
        product = (a.permute(0, 2, 1).unsqueeze(-1) * b).sum(-1)
        return product, torch.exp(a) * 2

    artifact = compile_and_check(fn, torch.randn(3, 17, 40), torch.randn(3, 40, 17, 1))
    kernels = artifact.manifest["kernels"]
    assert kernels and all(k["rnumel"] == 1 or k["config"].get("tiled") for k in kernels)
    assert any(k["config"].get("tiled") for k in kernels)


@pytest.mark.parametrize("narrow_rule", [True, False])
def test_a_permute_copy_with_a_short_last_dim_gets_tall_tiles(narrow_rule, monkeypatch):
    """A copy that moves a dim of 3 last (NesT's heads, an image's channels; fp32 in, bf16 out) is
    tiled 3 columns (4 with the mask) by 1024 rows, a tile of 64 x 64's elements, where 64 rows
    left a program 192 elements (heuristics.NARROW_TILE_RULE); the result is eager's either way."""
    from compiler.codegen import heuristics

    monkeypatch.setattr(heuristics, "NARROW_TILE_RULE", narrow_rule)
    x = torch.randn(4, 3, 5, 37, 19)
    artifact = compile_and_check(lambda a: a.to(torch.bfloat16).permute(0, 2, 3, 4, 1).contiguous(), x)
    kernel = artifact.manifest["kernels"][0]
    assert kernel["config"].get("tiled") and kernel["rnumel"] == 3
    assert (kernel["config"]["XBLOCK"], kernel["config"]["RBLOCK"]) == ((1024, 4) if narrow_rule else (64, 4))


def test_tile_rows_keep_wide_tiles_and_grow_narrow_ones():
    from compiler.codegen.heuristics import tile_rows

    assert [tile_rows(c) for c in (3, 4, 9, 16, 17, 64, 500)] == [1024, 1024, 256, 256, 64, 64, 64]
