"""The model the client tests train: a small pre-norm transformer block (causal attention,
GELU MLP, two layer norms, residuals) under a linear head, and one SGD training step.

Also run as a script by the fresh-process test: `python client_models.py CACHE_DIR URL`
trains two steps with a backend that must not touch the network, and prints its stats."""

from __future__ import annotations

import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

D_MODEL, HEADS, SEQ, BATCH, VOCAB = 32, 2, 8, 2, 16


class Block(nn.Module):
    def __init__(self, d_model: int = D_MODEL, heads: int = HEADS) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv, self.proj = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
        self.fc1, self.fc2 = nn.Linear(d_model, 4 * d_model), nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d_model = x.shape
        head = d_model // self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d_model, dim=2)
        q, k, v = (t.view(batch, seq, self.heads, head).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(head)
        causal = torch.tril(torch.ones(seq, seq, dtype=torch.bool, device=x.device))
        attention = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        x = x + self.proj((attention @ v).transpose(1, 2).reshape(batch, seq, d_model))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Block()
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(x))


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Forward, cross-entropy, backward, optimizer step (gradients are left for the caller to check)."""
    loss = F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
    loss.backward()
    optimizer.step()
    return loss.detach()


def pair(seed: int = 0) -> tuple[nn.Module, nn.Module]:
    """Two identical models: one to compile, one eager reference."""
    torch.manual_seed(seed)
    model = TinyLM()
    return model, copy.deepcopy(model)


def batch(seed: int, seq: int = SEQ, batch_size: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(batch_size, seq, D_MODEL, generator=generator),
            torch.randint(0, VOCAB, (batch_size, seq), generator=generator))


def max_differences(compiled: nn.Module, reference: nn.Module) -> tuple[float, float]:
    """(largest parameter difference, largest gradient difference)."""
    params = max((a - b).abs().max().item() for a, b in zip(compiled.parameters(), reference.parameters()))
    grads = max((a.grad - b.grad).abs().max().item() for a, b in zip(compiled.parameters(), reference.parameters()))
    return params, grads


def train(backend, steps: int = 2, seq: int = SEQ, seed: int = 0) -> dict:
    """`steps` compiled training steps against eager; the largest differences seen."""
    compiled_model, reference = pair(seed)
    opt = torch.optim.SGD(compiled_model.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    step = torch.compile(train_step, backend=backend)
    worst = {"loss": 0.0, "params": 0.0, "grads": 0.0}
    for i in range(steps):
        x, y = batch(seed * 100 + i, seq)
        opt.zero_grad(set_to_none=False)
        ref_opt.zero_grad(set_to_none=False)
        loss = step(compiled_model, opt, x, y)
        ref_loss = train_step(reference, ref_opt, x, y)
        params, grads = max_differences(compiled_model, reference)
        worst = {"loss": max(worst["loss"], abs(loss.item() - ref_loss.item())),
                 "params": max(worst["params"], params), "grads": max(worst["grads"], grads)}
    return worst


if __name__ == "__main__":
    import json
    import sys
    import warnings

    from client.backend import backend

    from client.backend import FusewireWarning

    warnings.simplefilter("error", FusewireWarning)  # any fallback fails this process
    be = backend(url=sys.argv[2], token="tok-alpha", cache_dir=sys.argv[1], on_error="raise")
    worst = train(be)
    print(json.dumps({"worst": worst, "stats": dict(be.stats)}))
