"""Random ops drawn inside kernels (the default; compiler/lowering/random.py): dropout, rand, randn,
bernoulli and uniform become Philox numbers in the fused kernels, seeded by one ATen randint per
graph call. Their numbers differ from eager's, so these tests check what must hold anyway: the
distribution, dropout's scaling and mask agreeing element by element, repeatability under
torch.manual_seed, fresh numbers per call and per op, and no extra launch per random op.
tests/test_real_model_ops.py covers the eager-equal mode (`eager_random`)."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from client.runtime import load
from compiler import compile
from compiler.fx_import import from_fx

P = 0.3


def compiled(fn, *inputs, **options):
    graph = from_fx(make_fx(fn)(*inputs), list(inputs))
    artifact = compile(graph, "cpu", options)
    return artifact, load(artifact)


def externs(artifact) -> list[dict]:
    return [step for step in artifact.plan["steps"] if step["op"] == "extern"]


def seeded(run, inputs, seed):
    torch.manual_seed(seed)
    return run(*inputs)


def test_dropout_is_fused_and_its_mask_agrees_with_its_output():
    x, y = torch.randn(67, 129), torch.randn(67, 129)

    def fn(x, y):
        out, mask = torch.ops.aten.native_dropout(x * 2, P, True)
        return out + y, mask

    artifact, run = compiled(fn, x, y)
    (seeds,) = externs(artifact)
    assert seeds["target"] == "aten.randint.low" and seeds["args"][2] == [1]  # one seed, one ATen call
    assert len(artifact.manifest["kernels"]) == 1  # x * 2, the draw, the mask and + y: one kernel
    out, mask = seeded(run, (x, y), 7)
    assert mask.dtype == torch.bool and mask.shape == x.shape
    assert abs((~mask).float().mean().item() - P) < 0.015  # 8643 draws: > 5 standard deviations
    torch.testing.assert_close(out[mask], (x * 2 / (1 - P) + y)[mask])
    torch.testing.assert_close(out[~mask], y[~mask])
    again, again_mask = seeded(run, (x, y), 7)
    assert again_mask.equal(mask) and again.equal(out)  # the same seed, the same numbers
    assert not seeded(run, (x, y), 8)[1].equal(mask)
    assert not run(x, y)[1].equal(run(x, y)[1])  # each call draws anew


def test_each_random_op_of_a_graph_gets_its_own_seed():
    x = torch.randn(50, 70)

    def fn(x):
        first, first_mask = torch.ops.aten.native_dropout(x, 0.5, True)
        second, second_mask = torch.ops.aten.native_dropout(x, 0.5, True)
        return first_mask, second_mask, torch.rand_like(x)

    artifact, run = compiled(fn, x)
    (seeds,) = externs(artifact)
    assert seeds["args"][2] == [3]
    first, second, uniform = run(x)
    assert not first.equal(second)
    assert 0.4 < (first == second).float().mean().item() < 0.6  # independent draws agree half the time


def test_dropout_of_a_transposed_bf16_input_keeps_its_layout_and_scaling():
    x = torch.randn(40, 96).to(torch.bfloat16).t()

    def fn(x):
        return torch.ops.aten.native_dropout(x, P, True)

    artifact, run = compiled(fn, x)
    out, mask = run(x)
    assert out.dtype == torch.bfloat16 and out.shape == x.shape
    assert out.stride() == torch.empty_like(x).stride()
    expected = (x.float() * mask / (1 - P)).to(torch.bfloat16)
    assert out.equal(expected)


def test_dropout_backward_uses_the_forward_mask():
    x, grad = torch.randn(33, 65), torch.randn(33, 65)

    def fn(x, grad):
        out, mask = torch.ops.aten.native_dropout(x, P, True)
        return out, torch.ops.aten.native_dropout_backward(grad, mask, 1 / (1 - P))

    _, run = compiled(fn, x, grad)
    out, grad_x = run(x, grad)
    kept = out != 0
    torch.testing.assert_close(grad_x, torch.where(kept, grad / (1 - P), torch.zeros_like(grad)))


def test_dropout_not_training_draws_nothing():
    x = torch.randn(9, 31)

    def fn(x):
        return torch.ops.aten.native_dropout(x, P, False)

    artifact, run = compiled(fn, x)
    assert not externs(artifact)
    out, mask = run(x)
    assert out.equal(x) and mask.all()


@pytest.mark.parametrize("op", ["rand_like", "randn_like", "bernoulli_p", "bernoulli_tensor", "uniform", "rand"])
def test_drawn_numbers_have_the_distribution_asked_for(op):
    x = torch.rand(128, 160)  # 20480 draws

    def fn(x):
        if op == "rand_like":
            return torch.rand_like(x) + 0 * x
        if op == "randn_like":
            return torch.randn_like(x)
        if op == "bernoulli_p":
            return torch.ops.aten.bernoulli.p(x, 0.25)
        if op == "bernoulli_tensor":
            return torch.ops.aten.bernoulli.default(x)
        if op == "uniform":
            return torch.ops.aten.uniform.default(x, -2.0, 3.0)
        return torch.rand(128, 160, dtype=torch.float64)

    artifact, run = compiled(fn, x)
    assert [s["target"] for s in externs(artifact)] == ["aten.randint.low"]
    (got,) = run(x)
    if op in ("rand_like", "rand"):
        assert got.dtype == (torch.float64 if op == "rand" else torch.float32)
        assert 0 <= got.min() and got.max() < 1 and abs(got.mean().item() - 0.5) < 0.01
        assert abs(got.var().item() - 1 / 12) < 0.005
    elif op == "randn_like":
        assert abs(got.mean().item()) < 0.03 and abs(got.std().item() - 1) < 0.03
    elif op == "bernoulli_p":
        assert set(got.unique().tolist()) <= {0.0, 1.0} and abs(got.mean().item() - 0.25) < 0.015
    elif op == "bernoulli_tensor":  # ones where uniform < x: P(1) = x, so mean(got - x) ~ 0
        assert set(got.unique().tolist()) <= {0.0, 1.0} and abs((got - x).mean().item()) < 0.015
        assert got[x < 0.05].mean() < 0.1 and got[x > 0.95].mean() > 0.9
    else:
        assert -2 <= got.min() and got.max() < 3 and abs(got.mean().item() - 0.5) < 0.05


def test_eager_random_keeps_the_aten_calls():
    x = torch.randn(20, 30)

    def fn(x):
        return torch.ops.aten.native_dropout(x, P, True)

    artifact, _ = compiled(fn, x, eager_random=True)
    assert [s["target"] for s in externs(artifact)] == ["aten.native_dropout.default"]
