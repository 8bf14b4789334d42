"""Constants in the wire format (v1.1): captured tensors travel inside the graph, are validated
with limits, change the key with their bytes, and compile to kernels that read them (0-d ones
folded into the kernel) or to buffers the artifact carries."""

from __future__ import annotations

import base64
import copy
import json

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from client.runtime import load
from compiler import compile
from compiler.fx_import import constant_spec, from_fx, run_eager
from compiler.graph import GraphValidationError, canonical_graph, graph_to_json, key, parse_graph
from compiler.lowering import LoweringError
from compiler.options import Limits


def encode(tensor: torch.Tensor) -> str:
    return base64.b64encode(tensor.contiguous().view(torch.uint8).numpy().tobytes()).decode()


def wire(data: str | None = None, shape=(3,), dtype="float32", name="c") -> dict:
    """y = x + c, with c a constant."""
    data = encode(torch.tensor([1.0, 2.0, 3.0])) if data is None else data
    return {"version": 1,
            "inputs": [{"name": "x", "dtype": "float32", "shape": [3]}],
            "constants": [{"name": name, "dtype": dtype, "shape": list(shape), "data": data}],
            "nodes": [{"name": "y", "target": "aten.add.Tensor", "args": [{"ref": "x"}, {"ref": name}]}],
            "outputs": [{"ref": "y"}]}


def error(data: dict, limits: Limits | None = None) -> str:
    with pytest.raises(GraphValidationError) as exc:
        parse_graph(json.dumps(data), limits)
    return str(exc.value)


# -- validation and key -------------------------------------------------------------------


def test_a_constant_is_referred_to_like_an_input_and_survives_json():
    graph = parse_graph(json.dumps(wire()))
    assert parse_graph(graph_to_json(graph)) == graph
    assert graph.constants[0].raw_bytes() == torch.tensor([1.0, 2.0, 3.0]).numpy().tobytes()


def test_bad_constants_are_refused_naming_the_constant():
    assert error(wire(data="not base64!")) == "constants[0] 'c'.data: not valid base64"
    assert error(wire(data=encode(torch.ones(2)))) == (
        "constants[0] 'c'.data: holds 8 bytes; shape [3], strides [1] and dtype float32 need 12")
    assert error(wire(dtype="float8")).startswith("constants[0] 'c'.dtype: unknown dtype 'float8'")
    assert error(wire(name="x")) == "constants[0] 'x'.name: duplicate name 'x' (input and node names share one namespace)"


def test_constant_limits_per_constant_per_graph_and_count():
    small = Limits(max_constant_bytes=8, max_constants_bytes=20, max_constants=2)
    assert error(wire(), small) == "constants[0] 'c'.data: over the limit of 8 bytes per constant"
    graph = wire(data=encode(torch.ones(2)), shape=(2,))
    graph["constants"] += [dict(graph["constants"][0], name=f"c{i}") for i in range(2)]
    assert error(graph, Limits(max_constants_bytes=20)) == (
        "constants[2] 'c1'.data: constants hold 24 bytes so far, over the limit of 20 per graph")
    assert error(graph, small) == "constants: 3 constants, over the limit of 2"


def test_the_key_covers_the_constants_bytes_but_not_their_names():
    graph = parse_graph(json.dumps(wire()))
    renamed = parse_graph(json.dumps(wire(name="other")))
    changed = parse_graph(json.dumps(wire(data=encode(torch.tensor([1.0, 2.0, 3.5])))))
    assert key(graph, "cpu") == key(renamed, "cpu") != key(changed, "cpu")


def test_a_graph_without_constants_keeps_its_v1_0_form():
    data = wire()
    data.pop("constants")
    data["nodes"][0]["args"][1] = {"ref": "x"}
    graph = parse_graph(json.dumps(data))
    assert "constants" not in json.loads(graph_to_json(graph))
    assert "constants" not in canonical_graph(graph)


# -- capture ------------------------------------------------------------------------------


def test_captured_tensors_become_constants_and_run_eagerly():
    table = torch.randn(5, 3)
    low = torch.tensor(torch.finfo(torch.float32).min)

    def fn(x):
        return torch.where(x > 0, x + table, low)

    x = torch.randn(5, 3)
    graph = parse_graph(graph_to_json(from_fx(make_fx(fn)(x), [x])))
    assert sorted(tuple(c.shape) for c in graph.constants) == [(), (5, 3)]
    torch.testing.assert_close(run_eager(graph, [x])[0], fn(x), rtol=0, atol=0)


def test_constant_spec_keeps_dtype_and_values_of_strided_tensors():
    base = torch.randn(4, 6).to(torch.bfloat16)
    spec = constant_spec(base.t(), "c")
    assert (spec.dtype, spec.shape) == ("bfloat16", [6, 4])
    data = wire(spec.data, shape=(6, 4), dtype="bfloat16")
    data["inputs"][0]["shape"], data["inputs"][0]["dtype"] = [6, 4], "bfloat16"
    graph = parse_graph(json.dumps(data))
    x = torch.randn(6, 4).to(torch.bfloat16)
    assert run_eager(graph, [x])[0].equal(x + base.t())


# -- compile and run ----------------------------------------------------------------------


def test_compiled_graph_reads_constants_and_folds_0d_ones(signed):
    table, scale = torch.randn(7, 5), torch.tensor(0.25)

    def fn(x):
        return (x * scale + table).sum(-1), table * 2

    x = torch.randn(7, 5)
    graph = from_fx(make_fx(fn)(x), [x])
    artifact = compile(graph, "cpu")
    constants = artifact.plan["constants"]
    assert [c["size"] for c in constants] == [[7, 5]]  # the 0-d one is folded, not carried
    assert artifact.files[f"constants/{constants[0]['constant']}.bin"] == table.numpy().tobytes()
    run = load(signed(artifact))
    for got, want in zip(run(x), fn(x)):
        torch.testing.assert_close(got, want)
    first = run(x)[1]
    first.zero_()  # an output is the caller's: writing to it must not change the constant
    torch.testing.assert_close(run(x)[1], table * 2)


def test_an_output_that_is_a_constant_is_a_copy():
    table = torch.randn(4)
    x = torch.randn(4)
    graph = from_fx(make_fx(lambda x: (x + 1, torch.ops.aten.alias(table)))(x), [x])
    run = load(compile(graph, "cpu"))
    out = run(x)[1]
    out.fill_(7.0)
    torch.testing.assert_close(run(x)[1], table)


def test_writing_into_a_constant_is_refused_at_lowering():
    data = wire()
    data["nodes"][0]["target"] = "aten.add_.Tensor"
    data["nodes"][0]["args"] = [{"ref": "c"}, {"ref": "x"}]
    with pytest.raises(LoweringError, match="writes into a graph constant; constants are read-only"):
        compile(parse_graph(json.dumps(data)), "cpu")
