"""Every corpus graph parses, round-trips through JSON unchanged, keys stably, and runs."""

from __future__ import annotations

import json

import pytest
import torch

from compiler.fx_import import run_eager, to_callable
from compiler.graph import contiguous_strides, graph_to_json, key, parse_graph
from tests.corpus import GRAPHS_DIR, _all_ranges, corpus_inputs, corpus_names, load_graph

NAMES = corpus_names()


def test_corpus_is_big_enough():
    assert len(NAMES) >= 25, f"only {len(NAMES)} corpus graphs; run tests/graphs/generate.py"


@pytest.mark.parametrize("name", NAMES)
def test_file_is_a_pure_wire_graph(name):
    text = (GRAPHS_DIR / f"{name}.json").read_text()
    graph = parse_graph(text)
    assert text == graph_to_json(graph) + "\n", "the file is not what graph_to_json writes"
    assert set(json.loads(text)) == {"version", "inputs", "nodes", "outputs"}


@pytest.mark.parametrize("name", NAMES)
def test_round_trip_is_equal_and_keys_are_stable(name):
    graph = load_graph(name)
    again = parse_graph(graph_to_json(graph))
    assert again == graph
    assert graph_to_json(again) == graph_to_json(graph)
    k = key(graph, "cpu")
    assert len(k) == 64 and int(k, 16) >= 0
    assert key(again, "cpu") == k == key(parse_graph(json.loads(graph_to_json(graph))), "cpu", {})
    assert key(graph, "cuda:sm_90") != k


@pytest.mark.parametrize("name", NAMES)
def test_runs_eagerly_with_finite_outputs(name):
    graph = load_graph(name)
    inputs = corpus_inputs(name, seed=0)
    before = [t.clone() for t in inputs]
    outputs = run_eager(graph, inputs)
    assert len(outputs) == len(graph.outputs)
    for i, out in enumerate(outputs):
        assert isinstance(out, torch.Tensor), f"output {i} is {type(out).__name__}"
        if out.is_floating_point():
            assert torch.isfinite(out).all(), f"output {i} has non-finite values"
    for i, (t, b) in enumerate(zip(inputs, before)):
        assert torch.equal(t, b), f"run_eager changed input {i}"
    again = to_callable(graph)(*inputs)
    for out, other in zip(outputs, again):
        torch.testing.assert_close(other, out, rtol=0, atol=0)


def test_inputs_are_laid_out_as_declared():
    for name in NAMES:
        graph = load_graph(name)
        for spec, tensor in zip(graph.inputs, corpus_inputs(name)):
            assert list(tensor.shape) == spec.shape and list(tensor.stride()) == spec.strides(), (name, spec.name)
            assert str(tensor.dtype) == f"torch.{spec.dtype}"


def test_value_ranges_name_real_inputs_and_hold():
    ranges = _all_ranges()
    assert ranges, "inputs.json is empty"
    for name, by_input in ranges.items():
        assert name in NAMES, f"inputs.json names unknown graph '{name}'"
        specs = {spec.name: i for i, spec in enumerate(load_graph(name).inputs)}
        inputs = corpus_inputs(name, seed=3)
        for input_name, (low, high) in by_input.items():
            assert input_name in specs, f"{name}: inputs.json names unknown input '{input_name}'"
            values = inputs[specs[input_name]]
            assert low <= values.min().item() and values.max().item() < high


def test_integer_inputs_all_have_ranges():
    """Integer inputs in the corpus are indices or targets: their valid range must be known."""
    for name in NAMES:
        for spec in load_graph(name).inputs:
            if spec.dtype.startswith("int"):
                assert spec.name in _all_ranges().get(name, {}), f"{name}: no value range for '{spec.name}'"


def test_corpus_covers_layouts_dtypes_and_distinct_keys():
    graphs = [load_graph(name) for name in NAMES]
    specs = [spec for g in graphs for spec in g.inputs]
    assert any(spec.strides() != contiguous_strides(spec.shape) for spec in specs), "no non-contiguous input"
    assert {"float32", "bfloat16", "int64", "bool"} <= {spec.dtype for spec in specs}
    keys = {key(g, "cpu") for g in graphs}
    assert len(keys) == len(graphs), "two corpus graphs are the same graph"
