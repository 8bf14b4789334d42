"""from_fx: ATen-level fx graphs to wire graphs (and back to eager), and its refusals."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.fx
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from compiler.fx_import import ConversionError, from_fx, random_inputs, run_eager, to_callable
from compiler.graph import DeviceArg, DtypeArg, FloatArg, Ref, graph_to_json, parse_graph


def capture(fn, *inputs):
    """fn traced at ATen level, converted, sent through JSON and checked against fn itself."""
    graph = parse_graph(graph_to_json(from_fx(make_fx(fn)(*inputs), inputs)))
    expected = fn(*inputs)
    expected = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    got = run_eager(graph, inputs)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=0, atol=0, equal_nan=True)
    return graph


def targets(graph) -> list[str]:
    return [node.target for node in graph.nodes]


def test_multi_output_op_becomes_index_refs():
    def fn(x, w, b):
        out, mean, rstd = torch.ops.aten.native_layer_norm(x, [17], w, b, 1e-5)
        return out * 2.0, mean, rstd

    graph = capture(fn, torch.randn(5, 17), torch.randn(17), torch.randn(17))
    ln = graph.nodes[0]
    assert ln.target == "aten.native_layer_norm.default"
    assert ln.args[1:] == [[17], Ref(ref="w_1"), Ref(ref="b_1"), 1e-5]
    assert graph.nodes[1].args[0] == Ref(ref=ln.name, index=0)
    assert graph.outputs[1:] == [Ref(ref=ln.name, index=1), Ref(ref=ln.name, index=2)]
    assert "getitem" not in graph_to_json(graph)


def test_list_output_op_becomes_index_refs():
    graph = capture(lambda x: [t * 2.0 for t in x.split(3, dim=1)], torch.randn(4, 8))
    split = graph.nodes[0]
    assert split.target == "aten.split.Tensor"
    assert [n.args[0] for n in graph.nodes[1:]] == [Ref(ref=split.name, index=i) for i in range(3)]


def test_non_finite_float_args():
    def fn(x, mask):
        return x.masked_fill(mask, float("-inf")), x.masked_fill(~mask, float("nan")), torch.clamp(x, max=float("inf"))

    graph = capture(fn, torch.randn(3, 5), torch.rand(3, 5) < 0.5)
    fills = [n.args[2] for n in graph.nodes if n.target == "aten.masked_fill.Scalar"]
    assert fills == [FloatArg(float="-inf"), FloatArg(float="nan")]
    text = graph_to_json(graph)
    assert '{"float":"-inf"}' in text and '{"float":"nan"}' in text and '{"float":"inf"}' in text
    assert "Infinity" not in text and "NaN" not in text


def test_dtype_args():
    graph = capture(lambda x: (x.to(torch.bfloat16) * 2).to(torch.float32), torch.randn(3, 5))
    casts = [n for n in graph.nodes if n.target == "aten._to_copy.default"]
    assert [n.kwargs["dtype"] for n in casts] == [DtypeArg(dtype="bfloat16"), DtypeArg(dtype="float32")]


def test_device_kwarg_runs_where_the_inputs_are():
    graph = capture(lambda x: x + torch.ones(x.shape, device=x.device), torch.randn(3, 5))
    ones = graph.nodes[0]
    assert ones.target == "aten.ones.default" and ones.kwargs["device"] == DeviceArg(device="cpu")
    data = json.loads(graph_to_json(graph))
    data["nodes"][0]["kwargs"]["device"] = {"device": "cuda"}  # captured on a GPU, checked on a CPU
    x = torch.randn(3, 5)
    torch.testing.assert_close(run_eager(parse_graph(data), [x])[0], x + 1)


def test_non_contiguous_input_keeps_its_strides():
    x = torch.randn(33, 7).t()
    graph = capture(lambda x: torch.softmax(x, dim=-1), x)
    assert graph.inputs[0].shape == [7, 33] and graph.inputs[0].stride == [1, 7]
    made = random_inputs(graph, seed=0)[0]
    assert made.stride() == (1, 7) and made.shape == (7, 33)


def test_backward_graph_holds_backward_ops():
    def fn(x, grad):
        return torch.autograd.grad(F.gelu(x, approximate="tanh"), x, grad)

    graph = capture(fn, torch.randn(4, 6, requires_grad=True), torch.randn(4, 6))
    backward = [n for n in graph.nodes if n.target == "aten.gelu_backward.default"]
    assert len(backward) == 1 and backward[0].kwargs == {"approximate": "tanh"}
    assert graph.outputs == [Ref(ref=backward[0].name)]


def test_names_are_wire_names_and_the_graph_validates():
    graph = capture(lambda x: torch.relu(x) + 1, torch.randn(3))
    assert [s.name for s in graph.inputs] == ["x_1"]
    assert all(n.name[0].isalpha() or n.name[0] == "_" for n in graph.nodes)


# --- refusals --------------------------------------------------------------------------


def test_non_tensor_output_is_refused():
    x = torch.randn(3)
    with pytest.raises(ConversionError, match=r"^output 1 is 3, not a tensor; wire format v1 outputs tensors only$"):
        from_fx(make_fx(lambda x: (x * 2, 3))(x), [x])
    with pytest.raises(ConversionError, match=r"^output 1 is None, not a tensor"):
        from_fx(make_fx(lambda x: (x * 2, None))(x), [x])


def test_non_aten_call_is_refused():
    gm = torch.fx.symbolic_trace(lambda x: torch.relu(x) + 1)  # torch-level, not ATen-level
    with pytest.raises(ConversionError) as exc:
        from_fx(gm, [torch.randn(3)])
    assert str(exc.value).startswith("node 'relu' (call_function <built-in method relu")
    assert str(exc.value).endswith("is not an ATen op call; capture the function with make_fx or aot_autograd "
                                   "so that it holds ATen ops only")


def test_input_count_and_kind_are_checked():
    gm = make_fx(lambda x, y: x + y)(torch.randn(3), torch.randn(3))
    with pytest.raises(ConversionError, match=r"^graph has 2 inputs, 1 example inputs given$"):
        from_fx(gm, [torch.randn(3)])
    with pytest.raises(ConversionError, match=r"^input 'y_1' is int, not a tensor$"):
        from_fx(gm, [torch.randn(3), 3])


def test_names_breaking_wire_rules_are_refused():
    gm = make_fx(lambda x: x * 2)(torch.randn(3))
    next(iter(gm.graph.nodes)).name = "x" * 300
    with pytest.raises(ConversionError, match=r"^the captured graph breaks a wire-format rule: inputs\[0\] 'x+'\.name: name is 300"):
        from_fx(gm, [torch.randn(3)])


# --- eager reference ---------------------------------------------------------------------


def test_run_eager_never_mutates_the_callers_inputs():
    x = torch.randn(3, 4)
    graph = from_fx(make_fx(lambda x: x.mul_(2.0).t())(x.clone()), [x])
    assert targets(graph) == ["aten.mul_.Tensor", "aten.t.default"]
    before = x.clone()
    out = run_eager(graph, [x])[0]
    assert torch.equal(x, before)
    torch.testing.assert_close(out, (before * 2).t())
    assert to_callable(graph)(x)[0].shape == (4, 3)


def test_run_eager_checks_the_input_count():
    graph = capture(lambda x: x * 2, torch.randn(3))
    with pytest.raises(ValueError, match=r"^the graph takes 1 inputs, 2 given$"):
        run_eager(graph, [torch.randn(3), torch.randn(3)])


def test_random_inputs_ranges_and_seeds():
    graph = parse_graph({
        "version": 1,
        "inputs": [{"name": "ids", "dtype": "int64", "shape": [50]}, {"name": "var", "dtype": "float32", "shape": [50]},
                   {"name": "x", "dtype": "bfloat16", "shape": [3, 4], "stride": [1, 3]}, {"name": "m", "dtype": "bool", "shape": [8]}],
        "nodes": [], "outputs": [{"ref": "x"}],
    })
    ids, var, x, m = random_inputs(graph, seed=1, int_ranges={"ids": (3, 7), "var": (0.5, 1.0)})
    assert ids.dtype == torch.int64 and 3 <= ids.min() and ids.max() < 7
    assert 0.5 <= var.min() and var.max() < 1.0
    assert x.dtype == torch.bfloat16 and x.stride() == (1, 3) and bool(x.ne(0).any())
    assert m.dtype == torch.bool
    again = random_inputs(graph, seed=1, int_ranges={"ids": (3, 7), "var": (0.5, 1.0)})
    assert all(torch.equal(a, b) for a, b in zip([ids, var, x, m], again))
    assert not torch.equal(random_inputs(graph, seed=2)[2], x)
    assert math.isfinite(float(x.float().abs().sum()))
