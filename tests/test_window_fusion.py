"""A window's loads and reductions (compiler/window_fusion.py): untimed, a 3x3 window at stride 1
stays out of the reduction that reads it; a max-pool backward's 4-window gather still joins it."""

from __future__ import annotations

import pytest
import torch

from compiler import window_fusion
from tests.test_scheduler import compile_and_check

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on masked-off lanes


def pool_backward_then_sum(grad, x):  # PoolFormer's shape of work, small
    pooled = torch.ops.aten.avg_pool2d_backward(grad, x, [3, 3], [1, 1], [1, 1], False, False, None)
    return (pooled * x).sum([2, 3])


def max_pool_backward_then_sum(x, scale):  # ResNet's stem: a 3x3 max-pool at stride 2, then BatchNorm-like sums
    out, indices = torch.ops.aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1])
    grad = torch.ops.aten.max_pool2d_with_indices_backward(out * scale, x, [3, 3], [2, 2], [1, 1], [1, 1], False,
                                                           indices)
    return (grad * x).sum([0, 2, 3])


def _inputs():
    return torch.randn(2, 6, 11, 9), torch.randn(2, 6, 11, 9)


def test_an_untimed_3x3_window_stays_out_of_the_reduction():
    artifact = compile_and_check(pool_backward_then_sum, *_inputs())
    kernels = artifact.manifest["kernels"]
    assert len(kernels) == 2 and "avg_pool2d_backward" in kernels[0]["name"] and kernels[0]["rnumel"] == 1
    refused = artifact.manifest["fusion"]["refused"]
    assert any(window_fusion.REASON in r["reason"] for r in refused)


def test_without_the_rule_the_score_fuses_it(monkeypatch):
    monkeypatch.setattr(window_fusion, "REFUSE_UNTIMED", False)
    assert len(compile_and_check(pool_backward_then_sum, *_inputs()).manifest["kernels"]) == 1


def test_a_max_pool_backward_still_joins_the_reduction():
    artifact = compile_and_check(max_pool_backward_then_sum, torch.randn(2, 6, 12, 10), torch.randn(1, 6, 1, 1))
    names = [k["name"] for k in artifact.manifest["kernels"]]
    assert any("max_pool2d_with_indices_backward" in n and "_red_" in n for n in names), names
