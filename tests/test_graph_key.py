"""The key: stable under renaming, changed by anything that can change the generated code."""

from __future__ import annotations

import copy
import hashlib
import math

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from compiler.graph import GraphValidationError, canonical_graph, canonical_json, key, parse_graph
from compiler.options import CompileOptions
from compiler.version import ABI_VERSION

TARGETS = ("cpu", "cuda:sm_90", "cuda:sm_80")
FLOAT_DTYPES = ("float32", "bfloat16", "float16", "float64")
UNARY = ("aten.relu.default", "aten.neg.default", "aten.exp.default", "aten.sigmoid.default")
BINARY = ("aten.add.Tensor", "aten.mul.Tensor", "aten.sub.Tensor", "aten.div.Tensor")
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------------------------
# Random valid wire graphs (as dicts); shapes need not agree, validation does not infer them
# ---------------------------------------------------------------------------------


@st.composite
def tensor_specs(draw, name: str) -> dict:
    shape = draw(st.lists(st.integers(1, 9), min_size=1, max_size=3))
    spec = {"name": name, "dtype": draw(st.sampled_from(FLOAT_DTYPES)), "shape": shape}
    if draw(st.booleans()):
        spec["stride"] = [math.prod(shape[i + 1:]) for i in range(len(shape))]
    return spec


@st.composite
def node_of(draw, name: str, tensors: list[str]) -> dict:
    ref = lambda: {"ref": draw(st.sampled_from(tensors))}  # noqa: E731
    kind = draw(st.sampled_from(["unary", "binary", "scalar", "sum", "layer_norm"]))
    if kind == "unary":
        return {"name": name, "target": draw(st.sampled_from(UNARY)), "args": [ref()], "kwargs": {}}
    if kind == "binary":
        kwargs = {"alpha": draw(st.integers(2, 5))} if draw(st.booleans()) else {}
        return {"name": name, "target": "aten.add.Tensor" if kwargs else draw(st.sampled_from(BINARY)),
                "args": [ref(), ref()], "kwargs": kwargs}
    if kind == "scalar":
        value = draw(st.one_of(st.integers(-5, 5), st.floats(-10, 10, allow_nan=False, width=64)))
        return {"name": name, "target": "aten.mul.Tensor", "args": [ref(), value], "kwargs": {}}
    if kind == "sum":
        return {"name": name, "target": "aten.sum.dim_IntList",
                "args": [ref(), [draw(st.integers(-1, 0))], draw(st.booleans())], "kwargs": {}}
    return {"name": name, "target": "aten.native_layer_norm.default",
            "args": [ref(), [draw(st.integers(1, 9))], ref(), None, draw(st.sampled_from([1e-5, 1e-6]))], "kwargs": {}}


@st.composite
def graphs(draw) -> dict:
    n_inputs = draw(st.integers(1, 3))
    inputs = [draw(tensor_specs(f"x{i}")) for i in range(n_inputs)]
    tensors = [spec["name"] for spec in inputs]
    nodes = []
    for i in range(draw(st.integers(1, 5))):
        node = draw(node_of(f"n{i}", tensors))
        nodes.append(node)
        if node["target"] != "aten.native_layer_norm.default":
            tensors.append(node["name"])
    outputs = [{"ref": nodes[-1]["name"]}] if nodes[-1]["target"] != "aten.native_layer_norm.default" \
        else [{"ref": nodes[-1]["name"], "index": 0}]
    graph = {"version": 1, "inputs": inputs, "nodes": nodes, "outputs": outputs}
    parse_graph(graph)  # the strategy only makes valid graphs
    return graph


def key_of(graph: dict, target: str = "cpu", options=None) -> str:
    return key(parse_graph(graph), target, options)


def rename(graph: dict, mapping: dict[str, str]) -> dict:
    def walk(value):
        if isinstance(value, dict) and "ref" in value:
            return {**value, "ref": mapping[value["ref"]]}
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        return value

    out = copy.deepcopy(graph)
    for entry in out["inputs"] + out["nodes"]:
        entry["name"] = mapping[entry["name"]]
    for node in out["nodes"]:
        node["args"], node["kwargs"] = walk(node["args"]), walk(node["kwargs"])
    out["outputs"] = walk(out["outputs"])
    return out


def scalar_positions(graph: dict) -> list[tuple[int, int]]:
    return [(i, j) for i, node in enumerate(graph["nodes"]) for j, arg in enumerate(node["args"])
            if isinstance(arg, (int, float, list)) and arg is not None]


def changed(value):
    """A different value of the same kind (bool flipped, number moved, list item changed)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return math.nextafter(value, math.inf)  # the smallest change must still change the key
    return [changed(value[0])] + value[1:]


# ---------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------


@SETTINGS
@given(graphs(), st.randoms(use_true_random=False))
def test_key_is_stable_under_renaming(graph, rnd):
    names = [e["name"] for e in graph["inputs"] + graph["nodes"]]
    fresh = [f"{rnd.choice('abcxyz_')}{i}_{rnd.randrange(10**6)}" for i in range(len(names))]
    rnd.shuffle(fresh)
    assert key_of(rename(graph, dict(zip(names, fresh)))) == key_of(graph)


@SETTINGS
@given(graphs(), st.data())
def test_key_changes_with_shape_stride_and_dtype(graph, data):
    i = data.draw(st.integers(0, len(graph["inputs"]) - 1))
    spec = graph["inputs"][i]
    j = data.draw(st.integers(0, len(spec["shape"]) - 1))
    base = key_of(graph)

    other = copy.deepcopy(graph)
    other["inputs"][i]["shape"][j] += 1
    assert key_of(other) != base

    other = copy.deepcopy(graph)
    strides = [math.prod(spec["shape"][k + 1:]) for k in range(len(spec["shape"]))]
    other["inputs"][i]["stride"] = strides[:j] + [strides[j] + 1] + strides[j + 1:]
    assert key_of(other) != base

    other = copy.deepcopy(graph)
    other["inputs"][i]["dtype"] = data.draw(st.sampled_from([d for d in FLOAT_DTYPES + ("int32",) if d != spec["dtype"]]))
    assert key_of(other) != base


@SETTINGS
@given(graphs())
def test_explicit_contiguous_stride_equals_omitted_stride(graph):
    other = copy.deepcopy(graph)
    for spec in other["inputs"]:
        spec["stride"] = [math.prod(spec["shape"][k + 1:]) for k in range(len(spec["shape"]))]
    plain = copy.deepcopy(graph)
    for spec in plain["inputs"]:
        spec.pop("stride", None)
    assert key_of(other) == key_of(plain)


@SETTINGS
@given(graphs())
def test_key_changes_with_target(graph):
    assert len({key_of(graph, target) for target in TARGETS}) == len(TARGETS)


def _option_changes() -> list[tuple[str, object]]:
    defaults = CompileOptions()
    out = []
    for field, value in defaults.model_dump().items():
        if isinstance(value, tuple):
            new = (*value, 0)
        else:
            new = not value if isinstance(value, bool) else value + 1 if isinstance(value, int) else value / 2 + 0.5
        out.append((field, new))
    return out


@pytest.mark.parametrize("field,value", _option_changes())
def test_key_changes_with_every_option_field(field, value):
    graph = {"version": 1, "inputs": [{"name": "x", "dtype": "float32", "shape": [3]}],
             "nodes": [{"name": "y", "target": "aten.relu.default", "args": [{"ref": "x"}]}], "outputs": [{"ref": "y"}]}
    assert key_of(graph, "cpu", {field: value}) != key_of(graph, "cpu")
    assert key_of(graph, "cpu", CompileOptions(**{field: value})) == key_of(graph, "cpu", {field: value})


def test_released_inputs_are_keyed_as_a_set_and_absent_when_empty():
    """The order of the positions does not matter; graphs compiled without the option keep the
    keys they had before it existed (the payload carries no empty field)."""
    graph = {"version": 1, "inputs": [{"name": "x", "dtype": "float32", "shape": [3]},
                                      {"name": "w", "dtype": "float32", "shape": [3]}],
             "nodes": [{"name": "y", "target": "aten.mul.Tensor", "args": [{"ref": "x"}, {"ref": "w"}]}],
             "outputs": [{"ref": "y"}]}
    assert key_of(graph, "cpu", {"released_inputs": [1, 0]}) == key_of(graph, "cpu", {"released_inputs": [0, 1, 1]})
    assert key_of(graph, "cpu", {"released_inputs": []}) == key_of(graph, "cpu")
    options = {k: v for k, v in CompileOptions().model_dump(mode="json").items() if k != "released_inputs"}
    payload = {"graph": canonical_graph(parse_graph(graph)), "target": "cpu", "options": options, "abi": ABI_VERSION}
    assert key_of(graph, "cpu") == hashlib.sha256(canonical_json(payload).encode()).hexdigest()


def test_every_option_field_is_covered():
    assert {f for f, _ in _option_changes()} == set(CompileOptions.model_fields)


@SETTINGS
@given(graphs(), st.data())
def test_key_changes_with_any_argument_value(graph, data):
    positions = scalar_positions(graph)
    if not positions:
        return
    i, j = data.draw(st.sampled_from(positions))
    other = copy.deepcopy(graph)
    other["nodes"][i]["args"][j] = changed(other["nodes"][i]["args"][j])
    assert key_of(other) != key_of(graph)


@SETTINGS
@given(graphs(), st.data())
def test_key_changes_with_the_op(graph, data):
    i = data.draw(st.integers(0, len(graph["nodes"]) - 1))
    node = graph["nodes"][i]
    family = next((f for f in (UNARY, BINARY) if node["target"] in f), None)
    if family is None or node["kwargs"]:
        return
    other = copy.deepcopy(graph)
    other["nodes"][i]["target"] = data.draw(st.sampled_from([t for t in family if t != node["target"]]))
    assert key_of(other) != key_of(graph)


@SETTINGS
@given(graphs())
def test_key_changes_with_a_kwarg_and_with_a_ref(graph):
    other = copy.deepcopy(graph)
    first = other["inputs"][0]["name"]
    other["nodes"].append({"name": "extra", "target": "aten.add.Tensor", "args": [{"ref": first}, {"ref": first}], "kwargs": {}})
    other["outputs"] = [{"ref": "extra"}]
    with_alpha = copy.deepcopy(other)
    with_alpha["nodes"][-1]["kwargs"] = {"alpha": 2}
    assert key_of(with_alpha) != key_of(other)
    if len(graph["inputs"]) > 1:
        second = copy.deepcopy(other)
        second["nodes"][-1]["args"][1] = {"ref": other["inputs"][1]["name"]}
        assert key_of(second) != key_of(other)


@SETTINGS
@given(graphs())
def test_default_options_in_every_spelling_share_a_key(graph):
    explicit = CompileOptions().model_dump()
    keys = {key_of(graph, "cpu", o) for o in (None, {}, CompileOptions(), explicit, {"fusion": True})}
    assert len(keys) == 1


def test_int_and_float_scalars_differ_and_nonfinite_spellings_agree():
    def graph(value):
        return {"version": 1, "inputs": [{"name": "x", "dtype": "float32", "shape": [3]}],
                "nodes": [{"name": "y", "target": "aten.mul.Tensor", "args": [{"ref": "x"}, value]}], "outputs": [{"ref": "y"}]}

    assert key_of(graph(2)) != key_of(graph(2.0))
    assert key_of(graph(True)) != key_of(graph(1))
    assert key_of(graph(float("inf"))) == key_of(graph({"float": "inf"}))
    assert key_of(graph(float("-inf"))) != key_of(graph({"float": "inf"}))


def test_canonical_form_is_exactly_this():
    """Clients compute keys locally: the canonical JSON is a contract, changing it re-keys the world."""
    graph = parse_graph({
        "version": 1,
        "inputs": [{"name": "act", "dtype": "bfloat16", "shape": [2, 3]}],
        "nodes": [{"name": "ln", "target": "aten.native_layer_norm.default",
                   "args": [{"ref": "act"}, [3], None, None, 1e-05], "kwargs": {}},
                  {"name": "m", "target": "aten.masked_fill.Scalar",
                   "args": [{"ref": "ln", "index": 0}, {"ref": "act"}, {"float": "-inf"}]}],
        "outputs": [{"ref": "m"}, {"ref": "ln", "index": 2}],
    })
    assert canonical_json(canonical_graph(graph)) == (
        '{"inputs":[{"dtype":"bfloat16","shape":[2,3],"stride":[3,1]}],"nodes":['
        '{"args":[{"ref":"i0"},[3],null,null,1e-05],"kwargs":{},"target":"aten.native_layer_norm.default"},'
        '{"args":[{"index":0,"ref":"n0"},{"ref":"i0"},{"float":"-inf"}],"kwargs":{},"target":"aten.masked_fill.Scalar"}],'
        '"outputs":[{"ref":"n1"},{"index":2,"ref":"n0"}],"version":1}'
    )


@pytest.mark.parametrize("target", ["gpu", "cuda", "cuda:sm_9", "cuda:90", "CPU", "cuda:sm_90 ", ""])
def test_key_refuses_a_bad_target(target):
    graph = parse_graph({"version": 1, "inputs": [{"name": "x", "dtype": "float32", "shape": [3]}],
                         "nodes": [], "outputs": [{"ref": "x"}]})
    with pytest.raises(GraphValidationError) as exc:
        key(graph, target)
    assert str(exc.value) == f"target: unknown target {target!r}; expected 'cpu' or 'cuda:sm_XY' (e.g. cuda:sm_90)"
