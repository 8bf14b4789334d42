"""The wire format's JSON Schema, for the OpenAPI document and for clients.

Generated from compiler.graph's pydantic models (`Graph.model_json_schema()`), then tightened
with every rule of `validate_graph` that JSON Schema can state: the default `Limits` (maxItems,
maxLength), name, op and device patterns, the dtype/layout/memory-format enums, refs to names,
non-negative sizes and indexes, canonical base64, and the nesting depth of arguments (unrolled
into WireArg, WireArg1..WireArg4). What JSON Schema cannot state is listed in SEMANTIC_RULES and
written into the schema's description; `parse_graph` checks everything, so a graph that is valid
against this schema and keeps those rules is accepted.

    document = graph_json_schema()                 # {"$defs": {...}, "$ref": "#/$defs/WireGraph"}
    defs = wire_definitions("#/components/schemas/")  # the same defs, refs for an OpenAPI document

Torch-free: the API process imports it.
"""

from __future__ import annotations

import copy
from typing import Any

from compiler.graph import (DTYPES, LAYOUTS, MAX_ARG_DEPTH, MEMORY_FORMATS, TARGET_PATTERN, Graph, _DEVICE_PATTERN,
                            _NAME_PATTERN, _TARGET_OP_PATTERN)
from compiler.options import Limits

PREFIX = "Wire"
# Canonical standard base64 (what base64.b64encode writes): groups of four, then an optional
# padded group whose unused low bits are zero.
BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/][AQgw]==|[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)?$"
ARG_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"

# The rules of wire format v1.1 that JSON Schema cannot state (they relate values across the
# graph, or need the service's op table). Breaking one is a 422 `invalid_graph` whose `where`
# names the place; rule -> what it says.
SEMANTIC_RULES: dict[str, str] = {
    "unique-names": "Input, constant and node names are unique: they share one namespace.",
    "refs-resolve": "Every `ref` names an input, a constant or an earlier node: nodes are listed in a "
                    "topological order (a cycle has none).",
    "ref-index": "A ref has an `index` exactly when the node it names has several outputs (or a list of "
                 "them), and the index is in range; a node that returns nothing cannot be referred to.",
    "known-op": "`target` is an op of the service's ATen/prims table (the overloads of the torch version "
                "the table was generated from).",
    "op-signature": "`args` and `kwargs` fit the op's schema: no more positional arguments than it takes, "
                    "only its keyword names, none given twice, every required argument present.",
    "tensor-size": "A tensor has at most {max_numel} elements, and its strides span at most that many "
                   "elements of storage. A service may set a lower limit per tensor, which it also applies to "
                   "the sizes arguments give (`full`, `expand`, `arange`, ...): 422 `over_limit`.",
    "stride-rank": "`stride`, when given, has one entry per dimension of `shape`.",
    "constant-bytes": "A constant's `data` holds exactly the bytes its shape, strides and dtype need "
                      "(storage elements x itemsize); all constants together hold at most "
                      "{max_constants_bytes} bytes.",
}


def semantic_rules(limits: Limits | None = None) -> dict[str, str]:
    """SEMANTIC_RULES with the limits filled in."""
    limits = limits or Limits()
    return {rule: text.format(**limits.model_dump()) for rule, text in SEMANTIC_RULES.items()}


def graph_json_schema(limits: Limits | None = None) -> dict[str, Any]:
    """A standalone JSON Schema (2020-12) of a wire graph."""
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$ref": f"#/$defs/{PREFIX}Graph",
            "$defs": wire_definitions("#/$defs/", limits)}


def wire_definitions(ref_prefix: str, limits: Limits | None = None) -> dict[str, dict[str, Any]]:
    """The wire format's schemas, named Wire*, their refs starting with `ref_prefix`."""
    limits = limits or Limits()
    generated = Graph.model_json_schema(ref_template=ref_prefix + PREFIX + "{model}")
    defs = {PREFIX + name: schema for name, schema in generated.pop("$defs").items()}
    defs[PREFIX + "Graph"] = generated
    arg = defs.pop(PREFIX + "Arg")
    _tighten_graph(defs[PREFIX + "Graph"], limits)
    for name in ("TensorSpec", "ConstantSpec"):
        _tighten_tensor(defs[PREFIX + name]["properties"], limits)
    _tighten_base64(defs[PREFIX + "ConstantSpec"], limits)
    _tighten_node(defs[PREFIX + "Node"], ref_prefix, limits)
    _tighten_ref(defs[PREFIX + "Ref"], limits)
    _tighten_enum_args(defs)
    defs.update(_unrolled_args(arg, ref_prefix, limits))
    return defs


def _name(limits: Limits, description: str) -> dict[str, Any]:
    return {"type": "string", "pattern": _NAME_PATTERN.pattern, "minLength": 1,
            "maxLength": limits.max_name_length, "description": description}


def _sizes(limits: Limits, description: str) -> dict[str, Any]:
    return {"type": "array", "items": {"type": "integer", "minimum": 0}, "maxItems": limits.max_rank,
            "description": description}


def _tighten_graph(graph: dict[str, Any], limits: Limits) -> None:
    props = graph["properties"]
    rules = "\n".join(f"- {rule}: {text}" for rule, text in semantic_rules(limits).items())
    graph["title"] = "Wire graph (format v1.1)"
    graph["description"] = (
        "A captured ATen graph, wire format v1.1 (docs/WIRE.md). This schema states every rule JSON Schema "
        "can; the service also checks these, and answers 422 `invalid_graph` naming the place when one "
        f"is broken:\n{rules}")
    props["version"] = {"const": 1, "type": "integer", "description": "wire format major version"}
    props["inputs"].update(maxItems=limits.max_nodes, description="the graph's tensor inputs, in call order")
    props["nodes"].update(maxItems=limits.max_nodes, description="op calls in a topological order")
    props["outputs"].update(minItems=1, description="the tensors the graph returns, in order")
    props["constants"].update(maxItems=limits.max_constants,
                              description="tensors captured with the graph (v1.1); omitted or [] when none")


def _tighten_tensor(props: dict[str, Any], limits: Limits) -> None:
    props["name"] = _name(limits, "input, constant and node names share one namespace")
    props["dtype"] = {"type": "string", "enum": list(DTYPES), "description": "torch's dtype name"}
    props["shape"] = _sizes(limits, "static sizes, one per dimension")
    props["stride"] = {"anyOf": [_sizes(limits, "one per dimension of shape"), {"type": "null"}], "default": None,
                       "description": "element strides; contiguous when omitted or null"}


def _tighten_base64(constant: dict[str, Any], limits: Limits) -> None:
    constant["properties"]["data"] = {
        "type": "string", "pattern": BASE64_PATTERN, "maxLength": 4 * -(-limits.max_constant_bytes // 3),
        "description": f"the storage's raw bytes, little-endian, canonical standard base64; at most "
                       f"{limits.max_constant_bytes} bytes"}


def _tighten_node(node: dict[str, Any], ref_prefix: str, limits: Limits) -> None:
    props = node["properties"]
    props["name"] = _name(limits, "names the node's output(s)")
    props["target"] = {"type": "string", "pattern": _TARGET_OP_PATTERN.pattern,
                       "description": "an ATen/prims overload, as str(torch.ops.aten.X.overload) prints it "
                                      "without 'torch.ops.', e.g. aten.add.Tensor"}
    arg = {"$ref": f"{ref_prefix}{PREFIX}Arg"}
    props["args"] = {"type": "array", "items": arg, "default": [], "description": "positional arguments"}
    props["kwargs"] = {"type": "object", "additionalProperties": arg, "default": {},
                       "propertyNames": {"pattern": ARG_NAME_PATTERN}, "description": "keyword arguments"}


def _tighten_ref(ref: dict[str, Any], limits: Limits) -> None:
    props = ref["properties"]
    props["ref"] = _name(limits, "an input, constant or earlier node")
    props["index"] = {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}], "default": None,
                      "description": "which output of a multi-output node"}


def _tighten_enum_args(defs: dict[str, dict[str, Any]]) -> None:
    enums = {"DtypeArg": ("dtype", {"enum": list(DTYPES)}), "LayoutArg": ("layout", {"enum": list(LAYOUTS)}),
             "MemoryFormatArg": ("memory_format", {"enum": list(MEMORY_FORMATS)}),
             "DeviceArg": ("device", {"pattern": _DEVICE_PATTERN.pattern})}
    for model, (field, rule) in enums.items():
        defs[PREFIX + model]["properties"][field].update(rule)


def _unrolled_args(arg: dict[str, Any], ref_prefix: str, limits: Limits) -> dict[str, dict[str, Any]]:
    """Arg is recursive (lists of Args); JSON Schema cannot bound a recursion's depth, so one
    definition per level: WireArg (an argument), WireArg1..WireArg4 (items of lists nested that
    deep); at the last level a list must be empty."""
    names = [PREFIX + "Arg"] + [f"{PREFIX}Arg{depth}" for depth in range(1, MAX_ARG_DEPTH + 1)]
    unrolled = {}
    for depth, name in enumerate(names):
        branches = []
        for branch in copy.deepcopy(arg["anyOf"]):
            if branch.get("type") == "string":
                branch["maxLength"] = limits.max_name_length
            elif branch.get("type") == "array":
                branch["maxItems"] = limits.max_list_length
                if depth + 1 < len(names):
                    branch["items"] = {"$ref": ref_prefix + names[depth + 1]}
                else:
                    branch.pop("items")
                    branch["maxItems"] = 0
            branches.append(branch)
        unrolled[name] = {"anyOf": branches, "description": (
            "an argument: a tensor ref, a number, boolean, string or null, a dtype/device/layout/memory "
            f"format, an inf/nan float, or a list of arguments (nested at most {MAX_ARG_DEPTH} deep)")}
    return unrolled


def target_schema(allowed: list[str] | None = None) -> dict[str, Any]:
    """The `target` of a compile request: any target the compiler knows, or the service's list."""
    if allowed:  # the request's default, "cpu", is then only valid when it is in the list
        return {"type": "string", "enum": list(allowed), **({"default": "cpu"} if "cpu" in allowed else {})}
    return {"type": "string", "pattern": TARGET_PATTERN.pattern, "default": "cpu"}
