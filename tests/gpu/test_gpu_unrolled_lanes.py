"""On a GPU: pointwise kernels over cells of 2 x 2 outputs (compiler/unrolled_lanes.py) run from
their cubins under every candidate config autotuning tries and match eager: ResNet's 3x3 stride-2
max-pool backward with eager's int64 indices, NCHW with the ReLU's mask fused (its mask and its
stores vectors of 2) and channels-last, and an average pool's backward; and a stack of q/k/v
gradients walked as three lanes, one a piece (EVA-02's, a rotary backward on q and k first).

Skipped without CUDA (CPU CI); run on the device machine:
    python -m pytest -q tests/gpu
"""

from __future__ import annotations

import pytest
import torch

from tests.compare import assert_within_eager_error
from tests.gpu.forced_candidates import every_candidate
from tests.test_unrolled_lanes import qkv_gradient_stack

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def pool_backward_with_mask(grad, x, indices, relu_out):
    back = torch.ops.aten.max_pool2d_with_indices_backward(grad, x, [3, 3], [2, 2], [1, 1], [1, 1], False, indices)
    return torch.where(relu_out <= 0, torch.zeros((), dtype=back.dtype, device=back.device), back)


def average_pool_backward(grad, x):
    return torch.ops.aten.avg_pool2d_backward(grad, x, [3, 3], [2, 2], [1, 1], False, True, None)


def _inputs(case: str) -> list[torch.Tensor]:
    torch.manual_seed(0)
    if case == "stack":
        return [torch.randn(4, 3, 65, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    x = torch.randn(4, 8, 30, 56, device="cuda", dtype=torch.bfloat16)
    if case == "average":
        return [torch.randn(4, 8, 15, 28, device="cuda", dtype=torch.bfloat16), x]
    if case == "channels-last":
        x = x.contiguous(memory_format=torch.channels_last)
    out, indices = torch.ops.aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1])
    grad = torch.randn_like(out)
    return [grad, x, indices, torch.randn_like(x)]


@pytest.mark.parametrize("case", ["NCHW", "channels-last", "average", "stack"])
def test_every_unrolled_candidate_matches_eager(case):
    fn = {"average": average_pool_backward, "stack": qkv_gradient_stack}.get(case, pool_backward_with_mask)
    inputs = _inputs(case)
    eager = fn(*inputs)
    reference = fn(*[t.double() if t.is_floating_point() else t for t in inputs])
    for config, (got,) in every_candidate(fn, inputs, "unrolled"):
        assert_within_eager_error(got.float(), eager.float(), reference, f"{case} under {config}")
