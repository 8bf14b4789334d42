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
