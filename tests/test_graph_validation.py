"""One test per wire-format rule, each asserting the exact message a client gets back.

The API returns these strings unchanged in its 4xx bodies, so they are part of the
interface: each says what is wrong and where (node name and field).
"""

from __future__ import annotations

import copy
import json

import pytest

from compiler.graph import GraphValidationError, key, parse_graph
from compiler.options import Limits

X = {"ref": "x"}


def base() -> dict:
    """x -> ln = native_layer_norm(x) -> y = relu(ln[0]); outputs y."""
    return {
        "version": 1,
        "inputs": [{"name": "x", "dtype": "float32", "shape": [4, 8], "stride": [8, 1]},
                   {"name": "w", "dtype": "float32", "shape": [8]}],
        "nodes": [
            {"name": "ln", "target": "aten.native_layer_norm.default", "args": [X, [8], {"ref": "w"}, None, 1e-5], "kwargs": {}},
            {"name": "y", "target": "aten.relu.default", "args": [{"ref": "ln", "index": 0}], "kwargs": {}},
        ],
        "outputs": [{"ref": "y"}],
    }


def error(data, limits: Limits | None = None) -> str:
    with pytest.raises(GraphValidationError) as exc:
        parse_graph(data if isinstance(data, (bytes, str)) else json.dumps(data), limits)
    assert str(exc.value) == (f"{exc.value.where}: {exc.value.problem}" if exc.value.where else exc.value.problem)
    return str(exc.value)


def edited(change) -> dict:
    graph = copy.deepcopy(base())
    change(graph)
    return graph


def node(graph: dict, i: int) -> dict:
    return graph["nodes"][i]


def test_base_graph_is_valid():
    parse_graph(json.dumps(base()))
    parse_graph(base())


# --- the document ------------------------------------------------------------------


def test_json_too_large():
    text = json.dumps(base())
    assert error(text, Limits(max_json_bytes=100)) == f"graph: JSON is {len(text)} bytes, over the limit of 100"


def test_not_json():
    assert error(b'{"version": 1,') == "graph: not valid JSON: Expecting property name enclosed in double quotes: line 1 column 15 (char 14)"


def test_not_utf8():
    assert error(b'{"version": "\xff"}').startswith("graph: not valid JSON: 'utf-8' codec can't decode byte 0xff")


def test_json_nested_too_deeply():
    assert error("[" * 100_000 + "]" * 100_000) == "graph: not valid JSON: nested too deeply"


def test_number_literal_too_long():
    assert error('{"version": ' + "1" * 5000 + "}") == "graph: not valid JSON: a number literal is too long"


def test_not_an_object():
    assert error(b"[1, 2]") == "graph: expected a JSON object, got an array"
    assert error(b'"graph"') == "graph: expected a JSON object, got a string"


def test_wrong_version():
    assert error(edited(lambda g: g.update(version=2))) == "version: unsupported wire format version 2; this service reads version 1"


def test_missing_field():
    assert error(edited(lambda g: g.pop("outputs"))) == "outputs: required field 'outputs' is missing"
    assert error(edited(lambda g: node(g, 1).pop("target"))) == "nodes[1] 'y'.target: required field 'target' is missing"


def test_extra_field():
    assert error(edited(lambda g: g.update(comment="hi"))) == "comment: unknown field 'comment' (not part of wire format v1)"
    assert error(edited(lambda g: node(g, 0).update(meta={}))) == "nodes[0] 'ln'.meta: unknown field 'meta' (not part of wire format v1)"
    assert error(edited(lambda g: g["inputs"][1].update(device="cuda"))) == \
        "inputs[1] 'w'.device: unknown field 'device' (not part of wire format v1)"


def test_wrong_field_type():
    assert error(edited(lambda g: g.update(nodes={}))) == "nodes: Input should be a valid list"
    assert error(edited(lambda g: g["inputs"][0].update(shape=[4, "8"]))) == "inputs[0] 'x'.shape[1]: Input should be a valid integer"
    assert error(edited(lambda g: g["inputs"][0].update(shape=[4, 8.5]))) == "inputs[0] 'x'.shape[1]: Input should be a valid integer"
    assert error(edited(lambda g: g["inputs"][0].update(shape=[4, True]))) == "inputs[0] 'x'.shape[1]: Input should be a valid integer"


def test_integral_json_numbers_are_integers():
    """8.0 is the integer 8, as JSON Schema's `integer` (the OpenAPI document) says; same key."""
    graph = parse_graph(edited(lambda g: g["inputs"][0].update(shape=[4, 8.0])))
    assert graph.inputs[0].shape == [4, 8] and type(graph.inputs[0].shape[1]) is int
    assert key(graph, "cpu") == key(parse_graph(edited(lambda g: None)), "cpu")


def test_the_first_problem_in_document_order_is_reported():
    graph = edited(lambda g: (g["inputs"][1].update(shape="8"), node(g, 1)["args"].__setitem__(0, {"bad": 1})))
    assert error(graph) == "inputs[1] 'w'.shape: Input should be a valid list"


def test_no_outputs():
    assert error(edited(lambda g: g.update(outputs=[]))) == "outputs: a graph needs at least one output"


# --- limits --------------------------------------------------------------------------


def test_too_many_nodes():
    graph = {"version": 1, "inputs": [{"name": "x", "dtype": "float32", "shape": [3]}],
             "nodes": [{"name": f"r{i}", "target": "aten.relu.default", "args": [X]} for i in range(3)],
             "outputs": [{"ref": "r2"}]}
    assert error(graph, Limits(max_nodes=2)) == "nodes: 3 nodes, over the limit of 2"


def test_too_many_inputs():
    graph = edited(lambda g: g["inputs"].extend({"name": f"extra{i}", "dtype": "float32", "shape": [1]} for i in range(3)))
    assert error(graph, Limits(max_nodes=4)) == "inputs: 5 inputs, over the limit of 4"


def test_rank_over_limit():
    graph = edited(lambda g: g["inputs"][1].update(shape=[1] * 9))
    assert error(graph) == "inputs[1] 'w'.shape: rank 9 is over the limit of 8"


def test_negative_size():
    graph = edited(lambda g: g["inputs"][1].update(shape=[8, -1]))
    assert error(graph) == "inputs[1] 'w'.shape: sizes must be >= 0, got [8, -1]"


def test_numel_over_limit():
    graph = edited(lambda g: g["inputs"][1].update(shape=[2**20, 2**20]))
    assert error(graph) == "inputs[1] 'w'.shape: 1099511627776 elements, over the limit of 68719476736"


def test_stride_length_mismatch():
    graph = edited(lambda g: g["inputs"][0].update(stride=[1]))
    assert error(graph) == "inputs[0] 'x'.stride: stride has 1 entries for a shape of rank 2"


def test_negative_stride():
    graph = edited(lambda g: g["inputs"][0].update(stride=[8, -1]))
    assert error(graph) == "inputs[0] 'x'.stride: strides must be >= 0, got [8, -1]"


def test_strides_reaching_too_far():
    graph = edited(lambda g: g["inputs"][0].update(stride=[2**40, 1]))
    assert error(graph) == ("inputs[0] 'x'.stride: strides [1099511627776, 1] span 3298534883336 elements of storage, "
                            "over the limit of 68719476736")


def test_name_too_long():
    graph = edited(lambda g: node(g, 1).update(name="y" * 201))
    assert error(graph) == "nodes[1] 'yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy'.name: name is 201 characters, over the limit of 200"


def test_list_too_long():
    graph = edited(lambda g: node(g, 0)["args"].__setitem__(1, [8] * 4097))
    assert error(graph) == "nodes[0] 'ln'.args[1]: list of 4097 items, over the limit of 4096"


def test_lists_nested_too_deeply():
    graph = edited(lambda g: node(g, 0)["args"].__setitem__(1, [[[[[8]]]]]))
    assert error(graph) == "nodes[0] 'ln'.args[1][0][0][0][0][0]: lists in arguments nest more than 4 deep"


def test_lists_nested_past_the_validator():
    deep = 8
    for _ in range(1000):
        deep = [deep]
    graph = edited(lambda g: node(g, 0)["args"].__setitem__(1, deep))  # deeper than json.dumps goes: a dict
    with pytest.raises(GraphValidationError) as exc:
        parse_graph(graph)
    assert str(exc.value) == "nodes[0] 'ln'.args[1][0][0][0][0][0]: lists in arguments nest more than 4 deep"


def test_string_argument_too_long():
    graph = edited(lambda g: node(g, 1)["kwargs"].update(approximate="t" * 201))
    assert error(graph) == "nodes[1] 'y'.kwargs.approximate: string of 201 characters, over the limit of 200"


# --- names ---------------------------------------------------------------------------


def test_bad_name_characters():
    graph = edited(lambda g: node(g, 1).update(name="y-out"))
    assert error(graph) == ("nodes[1] 'y-out'.name: 'y-out' is not a valid name: a name must start with a letter or '_' "
                            "and hold only letters, digits, '_' and '.'")


def test_name_starting_with_a_digit():
    graph = edited(lambda g: g["inputs"][1].update(name="1w"))
    assert error(graph).startswith("inputs[1] '1w'.name: '1w' is not a valid name")


def test_duplicate_name():
    graph = edited(lambda g: node(g, 1).update(name="x"))
    assert error(graph) == "nodes[1] 'x'.name: duplicate name 'x' (input and node names share one namespace)"


# --- dtypes and other enumerations ---------------------------------------------------


def test_unknown_dtype_in_an_input():
    graph = edited(lambda g: g["inputs"][1].update(dtype="float8"))
    assert error(graph) == ("inputs[1] 'w'.dtype: unknown dtype 'float8'; known: float32, float16, bfloat16, float64, "
                            "int64, int32, int16, int8, uint8, bool, uint16, uint32, uint64, complex32, complex64, "
                            "complex128")


def test_unknown_dtype_in_an_argument():
    graph = edited(lambda g: g["nodes"].insert(1, {"name": "c", "target": "aten._to_copy.default", "args": [X],
                                                   "kwargs": {"dtype": {"dtype": "torch.float32"}}}))
    assert error(graph) == ("nodes[1] 'c'.kwargs.dtype.dtype: unknown dtype 'torch.float32'; known: float32, float16, "
                            "bfloat16, float64, int64, int32, int16, int8, uint8, bool, uint16, uint32, uint64, "
                            "complex32, complex64, complex128")


def test_unknown_device_layout_memory_format():
    def ones(**kwargs):
        return edited(lambda g: g["nodes"].insert(1, {"name": "o", "target": "aten.ones.default", "args": [[2]], "kwargs": kwargs}))

    assert error(ones(device={"device": "tpu"})) == "nodes[1] 'o'.kwargs.device.device: unknown device 'tpu'; expected 'cpu', 'cuda' or 'cuda:N'"
    assert error(ones(layout={"layout": "load"})).startswith("nodes[1] 'o'.kwargs.layout.layout: unknown layout 'load'; known: strided, ")
    graph = edited(lambda g: g["nodes"].insert(1, {"name": "c", "target": "aten.clone.default", "args": [X],
                                                   "kwargs": {"memory_format": {"memory_format": "channels_first"}}}))
    assert error(graph) == ("nodes[1] 'c'.kwargs.memory_format.memory_format: unknown memory format 'channels_first'; "
                            "known: contiguous_format, preserve_format, channels_last, channels_last_3d")


def test_bad_non_finite_float():
    graph = edited(lambda g: node(g, 0)["args"].__setitem__(4, {"float": "infinity"}))
    assert error(graph) == "nodes[0] 'ln'.args[4].float: Input should be 'inf', '-inf' or 'nan'"


def test_not_an_argument_value():
    graph = edited(lambda g: node(g, 0)["args"].__setitem__(3, {"tensor": [1, 2]}))
    assert error(graph) == (
        "nodes[0] 'ln'.args[3]: not a valid argument: expected a number, boolean, string, null, a list of these, or one of "
        '{"ref": name[, "index": i]}, {"dtype": name}, {"device": name}, {"float": "inf"|"-inf"|"nan"}, '
        '{"layout": name}, {"memory_format": name}; got {"tensor": [1, 2]}'
    )


def test_bad_value_inside_an_argument_list():
    graph = edited(lambda g: node(g, 0)["args"].__setitem__(1, [8, {"size": 3}]))
    assert error(graph).startswith("nodes[0] 'ln'.args[1][1]: not a valid argument: expected a number")


def test_ref_with_a_wrong_field():
    graph = edited(lambda g: node(g, 1)["args"].__setitem__(0, {"ref": "ln", "idx": 0}))
    assert error(graph) == "nodes[1] 'y'.args[0].idx: unknown field 'idx' (not part of wire format v1)"
    graph = edited(lambda g: node(g, 1)["args"].__setitem__(0, {"index": 0}))
    assert error(graph).startswith("nodes[1] 'y'.args[0]: not a valid argument: expected a number")
    graph = edited(lambda g: node(g, 1)["args"].__setitem__(0, {"ref": 3}))
    assert error(graph) == "nodes[1] 'y'.args[0].ref: Input should be a valid string"
    graph = edited(lambda g: node(g, 1)["args"].__setitem__(0, {"ref": "ln", "index": "0"}))
    assert error(graph) == "nodes[1] 'y'.args[0].index: Input should be a valid integer"


def test_non_standard_json_constants_become_float_args():
    text = json.dumps(base()).replace("1e-05", "Infinity")
    assert parse_graph(text).nodes[0].args[4].float == "inf"


# --- refs and order -------------------------------------------------------------------


def test_dangling_ref():
    graph = edited(lambda g: node(g, 1)["args"].__setitem__(0, {"ref": "nope"}))
    assert error(graph) == "nodes[1] 'y'.args[0]: ref 'nope' names no input or node (dangling ref)"


def test_dangling_output():
    graph = edited(lambda g: g.update(outputs=[{"ref": "z"}]))
    assert error(graph) == "outputs[0]: ref 'z' names no input or node (dangling ref)"


def test_ref_to_a_later_node():
    graph = edited(lambda g: g["nodes"].reverse())
    assert error(graph) == ("nodes[0] 'y'.args[0]: ref 'ln' names nodes[1], not an input or earlier node; "
                            "nodes must be in topological order (a cycle has none)")


def test_ref_to_itself():
    graph = edited(lambda g: node(g, 1)["args"].__setitem__(0, {"ref": "y"}))
    assert error(graph) == ("nodes[1] 'y'.args[0]: ref 'y' names nodes[1], not an input or earlier node; "
                            "nodes must be in topological order (a cycle has none)")


def test_ref_index_out_of_range():
    graph = edited(lambda g: node(g, 1)["args"].__setitem__(0, {"ref": "ln", "index": 3}))
    assert error(graph) == "nodes[1] 'y'.args[0].index: index 3 out of range for 'ln' (valid: 0..2)"
    graph = edited(lambda g: g.update(outputs=[{"ref": "ln", "index": -1}]))
    assert error(graph) == "outputs[0].index: index -1 out of range for 'ln' (valid: 0..2)"


def test_missing_index_on_a_multi_output_node():
    graph = edited(lambda g: node(g, 1)["args"].__setitem__(0, {"ref": "ln"}))
    assert error(graph) == "nodes[1] 'y'.args[0]: 'ln' has 3 outputs; the ref needs an index (0..2)"


def test_missing_index_on_a_list_output():
    graph = edited(lambda g: g["nodes"].append({"name": "parts", "target": "aten.split.Tensor", "args": [X, 2]}))
    graph["outputs"] = [{"ref": "parts"}]
    assert error(graph) == "outputs[0]: 'parts' returns a list of tensors; the ref needs an index"
    graph["outputs"] = [{"ref": "parts", "index": 1}]
    parse_graph(graph)


def test_index_on_a_single_output():
    graph = edited(lambda g: g.update(outputs=[{"ref": "y", "index": 0}]))
    assert error(graph) == "outputs[0].index: 'y' has a single output; drop the index"
    graph = edited(lambda g: g.update(outputs=[{"ref": "x", "index": 5}]))
    assert error(graph) == "outputs[0].index: 'x' has a single output; drop the index"


def test_ref_to_a_node_without_outputs():
    graph = edited(lambda g: g["nodes"].append({"name": "chk", "target": "aten._assert_async.default", "args": [X]}))
    graph["outputs"] = [{"ref": "chk"}]
    assert error(graph) == "outputs[0]: 'chk' returns nothing; there is no tensor to refer to"


# --- ops and their arguments --------------------------------------------------------------


def test_unknown_aten_op():
    graph = edited(lambda g: node(g, 1).update(target="aten.relu.fast"))
    assert error(graph) == "nodes[1] 'y'.target: unknown ATen op 'aten.relu.fast'"


def test_unknown_prims_op():
    graph = edited(lambda g: node(g, 1).update(target="prims.warp_drive.default"))
    assert error(graph) == "nodes[1] 'y'.target: unknown prims op 'prims.warp_drive.default'"


@pytest.mark.parametrize("target", ["torch.ops.aten.relu.default", "aten.relu", "relu", "aten.relu.default()", "os.system.default"])
def test_malformed_target(target):
    graph = edited(lambda g: node(g, 1).update(target=target))
    assert error(graph) == (f"nodes[1] 'y'.target: '{target}' is not an op name like 'aten.add.Tensor' "
                            "(namespace aten or prims, op, overload)")


def test_too_many_positional_args():
    graph = edited(lambda g: node(g, 1)["args"].append(1))
    assert error(graph) == "nodes[1] 'y'.args: aten.relu.default takes at most 1 positional argument(s), got 2"


def test_unknown_kwarg():
    graph = edited(lambda g: node(g, 0)["kwargs"].update(epsilon=1e-6))
    assert error(graph) == ("nodes[0] 'ln'.kwargs.epsilon: aten.native_layer_norm.default has no argument 'epsilon' "
                            "(its arguments: input, normalized_shape, weight, bias, eps)")


def test_kwarg_also_given_positionally():
    graph = edited(lambda g: node(g, 0)["kwargs"].update(eps=1e-6))
    assert error(graph) == "nodes[0] 'ln'.kwargs.eps: argument 'eps' of aten.native_layer_norm.default is also given positionally"


def test_missing_required_arg():
    graph = edited(lambda g: node(g, 0)["args"].pop())
    assert error(graph) == "nodes[0] 'ln'.args: aten.native_layer_norm.default is missing required argument 'eps'"


def test_required_arg_given_as_kwarg_is_fine():
    graph = edited(lambda g: (node(g, 0)["args"].pop(), node(g, 0)["kwargs"].update(eps=1e-6)))
    parse_graph(graph)


# --- key() ------------------------------------------------------------------------------


def test_bad_target_in_key():
    graph = parse_graph(base())
    with pytest.raises(GraphValidationError) as exc:
        key(graph, "cuda:sm90")
    assert str(exc.value) == "target: unknown target 'cuda:sm90'; expected 'cpu' or 'cuda:sm_XY' (e.g. cuda:sm_90)"


def test_bad_options_in_key():
    graph = parse_graph(base())
    with pytest.raises(GraphValidationError) as exc:
        key(graph, "cpu", {"fusion": "maybe"})
    assert str(exc.value) == "options.fusion: Input should be a valid boolean, unable to interpret input"
    with pytest.raises(GraphValidationError) as exc:
        key(graph, "cpu", {"fuse": True})
    assert str(exc.value) == "options.fuse: unknown option"
    with pytest.raises(GraphValidationError) as exc:
        key(graph, "cpu", {"max_fusion_size": 0})
    assert str(exc.value) == "options.max_fusion_size: Input should be greater than or equal to 1"
