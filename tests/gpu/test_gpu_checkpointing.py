"""On a GPU: activation checkpointing over dropout trains through the backend with no fallback. On
CUDA, aot_autograd would hand a recomputed random op generator-state inputs (graph-safe RNG
functionalization) that no wire graph can hold; client/partition.py saves the draws instead.
Skipped without CUDA (CPU CI covers the CPU's form in tests/client/test_client_partition.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from tests.gpu.test_gpu_cudagraphs import LocalBackend

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


class CheckpointedMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(48, 96), nn.Linear(96, 48)

    def block(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.dropout(self.down(F.dropout(F.gelu(self.up(x)), 0.25)), 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.block, x, use_reentrant=False).square().mean()


def _step(model: nn.Module, runner: nn.Module, seed: int = 5) -> list[torch.Tensor]:
    x = torch.randn(37, 48, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    torch.manual_seed(seed)
    loss = runner(x)
    loss.backward()
    return [loss.detach()] + [p.grad for p in model.parameters()]


@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_checkpointed_dropout_trains_with_eager_masks_and_no_fallback(signed, tmp_path, cuda_graphs):
    torch.manual_seed(1)
    eager_model = CheckpointedMLP().cuda()
    compiled_model = CheckpointedMLP().cuda()
    compiled_model.load_state_dict(eager_model.state_dict())
    expected = _step(eager_model, eager_model)
    torch._dynamo.reset()
    be = LocalBackend(signed, tmp_path, cuda_graphs=cuda_graphs, options={"eager_random": True})
    got = _step(compiled_model, torch.compile(compiled_model, backend=be))
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert be.stats["fallbacks"] == 0 and be.stats["graphs"] >= 2, be.stats


def test_checkpointed_dropout_drawn_in_kernels_keeps_forward_and_backward_masks_alike(signed, tmp_path):
    """Masks drawn by fusewire's kernels (the default): the backward must use the forward's mask.
    Every gradient element of a checkpointed dropout at p = 0.5 is 2 or 0, 2 exactly where the
    forward's output kept the element."""
    torch.manual_seed(2)
    be = LocalBackend(signed, tmp_path)
    step = torch.compile(lambda x: checkpoint(lambda t: F.dropout(t * 1.0, 0.5), x, use_reentrant=False), backend=be)
    x = torch.rand(4099, device="cuda") + 1.0
    x.requires_grad_(True)
    out = step(x)
    out.backward(torch.ones_like(out))
    kept = out != 0
    assert 0.4 < kept.float().mean().item() < 0.6
    torch.testing.assert_close(x.grad, kept.float() * 2.0)
    assert be.stats["fallbacks"] == 0, be.stats
