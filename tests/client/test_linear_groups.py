"""Linears over one input become one GEMM (client/linear_groups.py): which calls are grouped, that the
forward and every gradient stay as eager computes them, that the concatenated weights are recomputed
by the backward rather than saved, and that a piece the graph could tell from a contiguous tensor is
made contiguous. (LLaMA, BERT and T5 train through the whole stack with grouping on in
tests/models/test_model_zoo.py.)"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._dynamo.backends.common import aot_autograd

from client.linear_groups import LINEARS, group_linears
from client.partition import aot_options

TOKENS, WIDTH = 7, 24  # odd sizes


class Attention(nn.Module):
    """q/k/v projections of one input (with or without bias), an output projection between them and
    the next group, and a gated MLP (gate/up of one input)."""

    def __init__(self, bias: bool) -> None:
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(WIDTH, WIDTH, bias=bias) for _ in range(3))
        self.out = nn.Linear(WIDTH, WIDTH, bias=bias)
        self.gate, self.up = nn.Linear(WIDTH, 40, bias=False), nn.Linear(WIDTH, 40, bias=False)
        self.down = nn.Linear(40, WIDTH, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, _ = x.shape
        q, k, v = (p(x).view(batch, tokens, 3, WIDTH // 3).transpose(1, 2) for p in (self.q, self.k, self.v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(batch, tokens, WIDTH)
        h = x + self.out(attended)
        return h + self.down(F.silu(self.gate(h)) * self.up(h))


def linear_calls(gm: torch.fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target in LINEARS)


def compile_grouped(fn, seen: dict):
    """torch.compile with group_linears before aot_autograd and the backend's min-cut partition;
    `seen` gets the linear calls before/after and the forward's and backward's graphs."""

    def backend(gm, example_inputs):
        seen["before"] = linear_calls(gm)
        seen["removed"] = group_linears(gm)
        seen["after"] = linear_calls(gm)

        def forward(graph, _):
            seen["forward"] = graph
            return graph

        def backward(graph, _):
            seen["backward"] = graph
            return graph

        return aot_autograd(fw_compiler=forward, bw_compiler=backward, **aot_options("min_cut"))(gm, example_inputs)

    torch._dynamo.reset()
    return torch.compile(fn, backend=backend)


def run_both(model: nn.Module, x: torch.Tensor, compiled) -> None:
    """The compiled step's output and every gradient against eager's, on the same weights."""
    eager_x, compiled_x = x.clone().requires_grad_(), x.clone().requires_grad_()
    expected = model(eager_x)
    expected.square().sum().backward()
    eager_grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    got = compiled(compiled_x)
    got.square().sum().backward()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(compiled_x.grad, eager_x.grad, rtol=1e-4, atol=1e-5)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, eager_grads[name], rtol=1e-4, atol=1e-5, msg=name)


def mm_count(gm: torch.fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target in
               (torch.ops.aten.mm.default, torch.ops.aten.addmm.default))


def test_qkv_and_gate_up_become_one_linear_each_and_compute_what_eager_does():
    for bias in (False, True):
        torch.manual_seed(0)
        model, seen = Attention(bias), {}
        x = torch.randn(2, TOKENS, WIDTH)
        run_both(model, x, compile_grouped(model, seen))
        assert (seen["before"], seen["removed"], seen["after"]) == (7, 3, 4)
        # forward: qkv, out, gate/up, down; backward: two GEMMs per linear (the input's needs a gradient)
        assert mm_count(seen["forward"]) == 4
        assert mm_count(seen["backward"]) == 8


def test_the_concatenated_weights_are_recomputed_in_the_backward_not_saved():
    torch.manual_seed(0)
    model, seen = Attention(bias=False), {}
    run_both(model, torch.randn(2, TOKENS, WIDTH), compile_grouped(model, seen))
    weight_shapes = {(3 * WIDTH, WIDTH), (80, WIDTH)}
    backward_inputs = [n.meta["val"] for n in seen["backward"].graph.find_nodes(op="placeholder")
                       if isinstance(n.meta.get("val"), torch.Tensor)]
    assert not [t for t in backward_inputs if tuple(t.shape) in weight_shapes]
    cats = seen["backward"].graph.find_nodes(op="call_function", target=torch.ops.aten.cat.default)
    assert {tuple(n.meta["val"].shape) for n in cats} >= weight_shapes


def test_linears_that_differ_or_are_separated_stay_apart():
    a, b = nn.Linear(WIDTH, 8), nn.Linear(WIDTH, 8, bias=False)  # a bias and no bias
    c, d = nn.Linear(WIDTH, 8), nn.Linear(8, 8)  # d reads c's result
    e, f = nn.Linear(WIDTH, 8), nn.Linear(WIDTH, 8)  # one input, but `d` runs between them

    def fn(x, y):
        first = a(x) + b(x)
        second = d(c(x))
        third = e(y) + d(first) + f(y)  # e and f share y with a linear of another input between
        return first + second + third

    seen = {}
    x, y = torch.randn(TOKENS, WIDTH), torch.randn(TOKENS, WIDTH)
    got = compile_grouped(fn, seen)(x, y)
    torch.testing.assert_close(got, fn(x, y))
    assert seen["removed"] == 0 and seen["after"] == seen["before"] == 7


def test_a_piece_whose_strides_the_graph_could_see_is_made_contiguous():
    p, q = nn.Linear(WIDTH, 10), nn.Linear(WIDTH, 6)

    def fn(x):
        flat = p(x).view(-1)  # impossible on a strided piece of the grouped result
        return flat.sum() + flat[3], q(x)  # q's piece is a graph output: its caller sees its strides

    def through_a_view(x):
        return p(x).unsqueeze(0).view(-1) * 2 + q(x).sum()  # the impossible view after another view

    seen = {}
    x = torch.randn(TOKENS, WIDTH)
    (total, out), (expected_total, expected_out) = compile_grouped(fn, seen)(x), fn(x)
    torch.testing.assert_close(total, expected_total)
    torch.testing.assert_close(out, expected_out)
    assert seen["removed"] == 1 and out.is_contiguous()
    seen = {}
    torch.testing.assert_close(compile_grouped(through_a_view, seen)(x), through_a_view(x))
    assert seen["removed"] == 1


def test_pieces_read_in_place_when_nothing_observes_their_strides():
    p, q = nn.Linear(WIDTH, 12), nn.Linear(WIDTH, 12)

    def fn(x):
        return (p(x).view(TOKENS, 3, 4).relu() * q(x).view(TOKENS, 3, 4)).sum(-1)

    torch._dynamo.reset()
    graphs = []

    def backend(gm, _):
        group_linears(gm)
        graphs.append(gm)
        return gm.forward

    x = torch.randn(TOKENS, WIDTH)
    torch.testing.assert_close(torch.compile(fn, backend=backend)(x), fn(x))
    assert not [n for n in graphs[0].graph.nodes if n.op == "call_method" and n.target == "contiguous"]


class ChunkedThroughAReshape(nn.Module):
    """Longformer's sliding chunks: keys reshaped per head (a view of a contiguous projection, a copy of
    a piece of the grouped result), then read as overlapping chunks through `as_strided` with the
    strides the reshape gave (dynamo bakes them in as it traces)."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k = nn.Linear(WIDTH, 12), nn.Linear(WIDTH, 12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens, batch, _ = x.shape
        keys = self.k(x).view(tokens, batch, 3, 4).transpose(0, 1).transpose(1, 2).reshape(batch * 3, tokens, 4)
        step = list(keys.stride())
        chunks = keys.as_strided((batch * 3, tokens // 2 - 1, 4, 4), (step[0], 2 * step[1], step[1], step[2]))
        return chunks.sum((1, 2)).view(batch, 3, 4) * self.q(x)[0].view(batch, 3, 4)


def test_a_piece_reshaped_then_read_through_as_strided_is_made_contiguous():
    model, seen = ChunkedThroughAReshape(), {}
    run_both(model, torch.randn(8, 2, WIDTH), compile_grouped(model, seen))
    assert seen["removed"] == 1


class WrittenInPlace(nn.Module):
    """q, k, v of one input, q clamped in place as OLMo clamps (`clamp_`), k written through a view."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(WIDTH, WIDTH) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        query, key, value = self.q(x), self.k(x), self.v(x)
        query.clamp_(min=-0.5, max=0.5)
        key.view(TOKENS, 4, WIDTH // 4)[:, 0] += 1.0
        return query * key + value


def test_pieces_written_in_place_are_cloned_and_train_as_eager_does():
    """Autograd refuses an in-place write to a piece of a split: such a piece is cloned first."""
    model, seen = WrittenInPlace(), {}
    run_both(model, torch.randn(TOKENS, WIDTH), compile_grouped(model, seen))
    assert seen["removed"] == 2


def test_linears_on_either_side_of_no_grad_stay_apart():
    p, q = nn.Linear(WIDTH, 8), nn.Linear(WIDTH, 8)

    def fn(x):
        first = p(x)
        with torch.no_grad():
            second = q(x)
        return first * second

    seen = {}
    x = torch.randn(TOKENS, WIDTH)
    out = compile_grouped(fn, seen)(x)
    out.sum().backward()
    torch.testing.assert_close(out, fn(x))
    assert seen["removed"] == 0 and q.weight.grad is None and p.weight.grad is not None


def test_grouping_is_on_by_default_and_the_environment_or_an_argument_turns_it_off(monkeypatch):
    from client.backend import BackendSettings

    monkeypatch.delenv("FUSEWIRE_GROUP_LINEARS", raising=False)
    assert BackendSettings.from_env().group_linears is True
    monkeypatch.setenv("FUSEWIRE_GROUP_LINEARS", "0")
    assert BackendSettings.from_env().group_linears is False
    assert BackendSettings.from_env(group_linears=True).group_linears is True
    monkeypatch.setenv("FUSEWIRE_GROUP_LINEARS", "yes")
    assert BackendSettings.from_env().group_linears is True


def test_a_graph_grouping_cannot_analyse_is_left_as_it_is_with_a_warning(monkeypatch, tmp_path):
    import pytest

    import client.backend as backend_module
    from client.backend import Backend, BackendSettings, FusewireWarning

    def broken(gm):
        raise KeyError("example_value")

    monkeypatch.setattr(backend_module, "group_linears", broken)
    gm = torch.fx.symbolic_trace(nn.Linear(4, 4))
    before = str(gm.graph)
    lenient = Backend(BackendSettings(url="http://unused", cache_dir=tmp_path))
    with pytest.warns(FusewireWarning, match="linears not grouped: KeyError"):
        lenient._rewrite("grouped_linears", "linears not grouped", backend_module.group_linears, gm)
    assert str(gm.graph) == before
    strict = Backend(BackendSettings(url="http://unused", cache_dir=tmp_path, on_error="raise"))
    with pytest.raises(KeyError):
        strict._rewrite("grouped_linears", "linears not grouped", backend_module.group_linears, gm)
