"""Ops the wire format cannot carry (a library's custom ops, as transformers' mixture-of-experts
layers call under torch.compile) run in the caller's process between compiled parts
(client/local_ops.py): nothing falls back to eager, and the results are eager's."""

from __future__ import annotations

import operator
import warnings

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from client.backend import FusewireWarning, backend
from client.local_ops import local_nodes, split_at_local_ops
from client_helpers import TOKEN

CALLS = {"forward": 0, "backward": 0}


@torch.library.custom_op("fusewire_test::row_scale", mutates_args=())
def row_scale(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x * scale[:, None], computed where the wire cannot see it."""
    CALLS["forward"] += 1
    return x * scale[:, None]


@row_scale.register_fake
def _(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("fusewire_test::row_scale_backward", mutates_args=())
def row_scale_backward(x: torch.Tensor, scale: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    CALLS["backward"] += 1
    return grad * scale[:, None], (grad * x).sum(1)


@row_scale_backward.register_fake
def _(x: torch.Tensor, scale: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), torch.empty_like(scale)


def _setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad):
    x, scale = ctx.saved_tensors
    return tuple(torch.ops.fusewire_test.row_scale_backward(x, scale, grad))


row_scale.register_autograd(_backward, setup_context=_setup)


def block(x: torch.Tensor, scale: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    hidden = torch.tanh(x @ weight) + 1.0
    mixed = torch.ops.fusewire_test.row_scale(hidden, scale.sigmoid())
    return torch.nn.functional.gelu(mixed).sum(1).square().mean()


def test_a_graph_of_aten_ops_alone_is_not_split():
    gm = make_fx(lambda x: (x.sin() * 2).sum(0))(torch.randn(5, 3))
    assert not local_nodes(gm) and split_at_local_ops(gm) is None


def test_a_local_op_gets_a_part_of_its_own_and_the_split_graph_computes_the_same():
    x, scale = torch.randn(7, 5), torch.randn(7)
    gm = make_fx(lambda x, s: (torch.ops.fusewire_test.row_scale(x.exp(), s) + 1).cos())(x, scale)
    split = split_at_local_ops(gm)
    assert split is not None and len(split.local_parts) == 1
    for name, part in split.named_children():
        calls = [n for n in part.graph.nodes if n.op == "call_function" and n.target is not operator.getitem]
        if name in split.local_parts:
            assert [str(n.target) for n in calls] == ["fusewire_test.row_scale.default"]
        else:
            assert calls and not local_nodes(part)
    torch.testing.assert_close(split(x, scale), gm(x, scale), rtol=0, atol=0)


def test_a_tuple_returning_local_op_keeps_its_items_in_its_part():
    x, scale, grad = torch.randn(4, 6), torch.randn(4), torch.randn(4, 6)

    def fn(x, s, g):
        dx, ds = torch.ops.fusewire_test.row_scale_backward(x.abs(), s, g)
        return dx * 2, ds + 1

    gm = make_fx(fn)(x, scale, grad)
    split = split_at_local_ops(gm)
    (local,) = split.local_parts
    items = [n for n in getattr(split, local).graph.nodes if n.target is operator.getitem]
    assert len(items) == 2
    for got, want in zip(split(x, scale, grad), gm(x, scale, grad)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("partitioner", ["min_cut", "save_all"])
def test_training_through_a_custom_op_compiles_the_rest_and_matches_eager(api_server, tmp_path, partitioner):
    torch._dynamo.reset()
    generator = torch.Generator().manual_seed(0)
    x, scale = torch.randn(9, 6, generator=generator), torch.randn(9, generator=generator)
    weight = torch.randn(6, 10, generator=generator)
    leaves = [t.clone().requires_grad_() for t in (x, scale, weight)]
    block(*leaves).backward()

    be = backend(url=api_server.url, token=TOKEN, cache_dir=tmp_path / "cache", on_error="raise",
                 partitioner=partitioner)
    compiled_leaves = [t.clone().requires_grad_() for t in (x, scale, weight)]
    before = dict(CALLS)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FusewireWarning)
        loss = torch.compile(block, backend=be)(*compiled_leaves)
        loss.backward()
    assert be.stats["fallbacks"] == 0 and be.stats["local_ops"] >= 2, be.stats
    assert be.stats["compiles"] + be.stats["remote_hits"] + be.stats["local_hits"] >= 3, be.stats  # parts compiled
    assert CALLS["forward"] > before["forward"] and CALLS["backward"] > before["backward"]
    torch.testing.assert_close(loss, block(*leaves), rtol=1e-5, atol=1e-6)
    for got, want in zip(compiled_leaves, leaves):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-5, atol=1e-6)
