"""Wire format v1: what clients POST, validated, put in canonical form and keyed.

This module is imported by the API process, so it must never import torch or triton.

    graph = parse_graph(raw_json_bytes)          # GraphValidationError on bad input
    k = key(graph, "cuda:sm_90", CompileOptions())

A `GraphValidationError` names where the problem is (`nodes[3] 'ln'.args[1]`) and what
it is, so the API can return it as a 4xx unchanged.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import re
from typing import Annotated, Any, Iterator, Literal, Union

from typing_extensions import TypeAliasType

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, ValidationError, field_validator,
                      model_serializer)

from compiler.aten_schemas import OpSchema, lookup_schema
from compiler.options import CompileOptions, Limits
from compiler.version import ABI_VERSION

DTYPES: dict[str, int] = {
    "float32": 4, "float16": 2, "bfloat16": 2, "float64": 8,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
    "uint16": 2, "uint32": 4, "uint64": 8,  # v1.1; ops on these run as ATen calls (e.g. flash attention's RNG state)
    "complex32": 4, "complex64": 8, "complex128": 16,  # v1.2; likewise (FFTs: docs/WIRE.md)
}
ITEMSIZES = DTYPES  # bytes per element of every dtype a buffer may hold
NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}
TARGET_PATTERN = re.compile(r"^(cpu|cuda:sm_[0-9]{2,3}a?)$")
_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
_TARGET_OP_PATTERN = re.compile(r"^(aten|prims)\.[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*$")
_DEVICE_PATTERN = re.compile(r"^(cpu|cuda)(:[0-9]{1,2})?$")
LAYOUTS = ("strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc", "_mkldnn", "jagged")
MEMORY_FORMATS = ("contiguous_format", "preserve_format", "channels_last", "channels_last_3d")
MAX_ARG_DEPTH = 4
_ARG_HINT = (
    "expected a number, boolean, string, null, a list of these, or one of "
    '{"ref": name[, "index": i]}, {"dtype": name}, {"device": name}, {"float": "inf"|"-inf"|"nan"}, '
    '{"layout": name}, {"memory_format": name}'
)
_ARG_TAGS = {"ref": "Ref", "dtype": "DtypeArg", "device": "DeviceArg", "float": "FloatArg",
             "layout": "LayoutArg", "memory_format": "MemoryFormatArg"}


class GraphValidationError(ValueError):
    """A graph broke a rule of the wire format; `where` locates it, `problem` says what."""

    def __init__(self, where: str, problem: str) -> None:
        self.where = where
        self.problem = problem
        super().__init__(f"{where}: {problem}" if where else problem)


def _json_integer(value: Any) -> Any:
    """A JSON number without a fraction is an integer, as JSON Schema's `integer` says: 3.0 -> 3.
    Booleans, strings and 3.5 stay invalid (StrictInt)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


JsonInt = Annotated[StrictInt, BeforeValidator(_json_integer)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Ref(_Strict):
    """A tensor: a graph input or node output; `index` picks one output of a multi-output node."""

    ref: str
    index: JsonInt | None = None

    @model_serializer
    def _omit_missing_index(self) -> dict:
        return {"ref": self.ref} if self.index is None else {"ref": self.ref, "index": self.index}


class DtypeArg(_Strict):
    dtype: str


class DeviceArg(_Strict):
    device: str


class FloatArg(_Strict):
    float: Literal["inf", "-inf", "nan"]


class LayoutArg(_Strict):
    layout: str


class MemoryFormatArg(_Strict):
    memory_format: str


Arg = TypeAliasType(
    "Arg",
    Union[Ref, DtypeArg, DeviceArg, FloatArg, LayoutArg, MemoryFormatArg, bool, int, float, str, None, list["Arg"]],
)


class TensorSpec(_Strict):
    """A graph input: dtype, static shape, and stride (contiguous when omitted)."""

    name: str
    dtype: str
    shape: list[JsonInt]
    stride: list[JsonInt] | None = None

    def strides(self) -> list[int]:
        return self.stride if self.stride is not None else contiguous_strides(self.shape)


class ConstantSpec(TensorSpec):
    """A tensor captured with the graph (wire format v1.1): a TensorSpec plus its storage's raw
    bytes, little-endian, base64. Referred to by name like an input; its bytes are part of the key."""

    data: str

    def raw_bytes(self) -> bytes:
        return base64.b64decode(self.data, validate=True)


class Node(_Strict):
    """One ATen op call; its outputs are named by `name`."""

    name: str
    target: str
    args: list[Arg] = Field(default_factory=list)
    kwargs: dict[str, Arg] = Field(default_factory=dict)

    @field_validator("args", "kwargs")
    @classmethod
    def _non_finite_as_float_arg(cls, value: Any) -> Any:
        return _wrap_non_finite(value)


def _wrap_non_finite(value: Any) -> Any:
    """Raw inf/nan floats (from Python callers, or JSON's non-standard Infinity/NaN) become
    FloatArg, the one spelling that `graph_to_json` writes and reads back unchanged."""
    if isinstance(value, float) and not math.isfinite(value):
        return FloatArg(float="nan" if math.isnan(value) else ("inf" if value > 0 else "-inf"))
    if isinstance(value, list):
        return [_wrap_non_finite(item) for item in value]
    if isinstance(value, dict):
        return {name: _wrap_non_finite(item) for name, item in value.items()}
    return value


class Graph(_Strict):
    version: Literal[1]
    inputs: list[TensorSpec]
    nodes: list[Node]
    outputs: list[Ref]
    constants: list[ConstantSpec] = Field(default_factory=list)  # v1.1; omitted when empty

    @field_validator("version", mode="before")
    @classmethod
    def _version_not_bool(cls, value: Any) -> Any:
        if isinstance(value, bool):  # Literal[1] alone takes true (== 1); JSON's true is no version
            raise ValueError("expected the number 1")
        return value

    @model_serializer(mode="wrap")
    def _omit_no_constants(self, handler: Any) -> dict:
        data = handler(self)
        if not self.constants:
            data.pop("constants", None)
        return data


def storage_numel(shape: list[int], stride: list[int]) -> int:
    """Elements a strided tensor's storage spans (0 for an empty tensor)."""
    return 1 + sum((size - 1) * step for size, step in zip(shape, stride)) if all(shape) else 0


def contiguous_strides(shape: list[int]) -> list[int]:
    strides, running = [], 1
    for size in reversed(shape):
        strides.append(running)
        running *= max(size, 1)
    return strides[::-1]


# ---------------------------------------------------------------------------------
# Parsing and validation
# ---------------------------------------------------------------------------------


def parse_graph(data: bytes | str | dict, limits: Limits | None = None) -> Graph:
    """Parses and validates a wire graph from JSON text or an already-decoded dict."""
    limits = limits or Limits()
    if isinstance(data, (bytes, str)):
        data = _decode_json(data, limits)
    if not isinstance(data, dict):
        raise GraphValidationError("graph", f"expected a JSON object, got {_json_type(data)}")
    try:
        graph = Graph.model_validate(data)
    except ValidationError as exc:
        raise _from_pydantic(exc, data) from None
    except RecursionError:
        raise GraphValidationError("graph", "the graph nests too deeply") from None
    validate_graph(graph, limits)
    return graph


def _decode_json(data: bytes | str, limits: Limits) -> Any:
    size = len(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data)
    if size > limits.max_json_bytes:
        raise GraphValidationError("graph", f"JSON is {size} bytes, over the limit of {limits.max_json_bytes}")
    try:
        return json.loads(data)
    except RecursionError:
        raise GraphValidationError("graph", "not valid JSON: nested too deeply") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise GraphValidationError("graph", f"not valid JSON: {exc}") from None
    except ValueError:  # Python refuses integer literals of over 4300 digits
        raise GraphValidationError("graph", "not valid JSON: a number literal is too long") from None


def _json_type(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _from_pydantic(exc: ValidationError, data: dict) -> GraphValidationError:
    """The first of pydantic's errors, said in wire-format terms ("nodes[3] 'ln'.args[1]: ...")."""
    errors = exc.errors()
    error = errors[0]
    loc = list(error["loc"])
    if _in_arg(loc):  # the Arg union reports one error per branch: look at all of this argument's
        return _arg_error([e for e in errors if list(e["loc"][:4]) == loc[:4]], data)
    if loc == ["version"] and error["type"] != "missing":
        return GraphValidationError("version", f"unsupported wire format version {error['input']!r}; this service reads version 1")
    return GraphValidationError(_describe_location(loc, data), _problem(error, loc[-1] if loc else "graph"))


def _problem(error: dict, field: Any) -> str:
    if error["type"] == "extra_forbidden":
        return f"unknown field '{field}' (not part of wire format v1)"
    if error["type"] == "missing":
        return f"required field '{field}' is missing"
    return error["msg"]


def _in_arg(loc: list) -> bool:
    """Whether pydantic's location is inside one argument: ('nodes', 3, 'args' | 'kwargs', 1 | 'eps', ...)."""
    return len(loc) > 4 and loc[0] == "nodes" and loc[2] in ("args", "kwargs")


def _arg_error(errors: list[dict], data: dict) -> GraphValidationError:
    """An argument matched no branch of the Arg union: locate the innermost bad list item and
    report the branch its keys ask for ({"ref": 3} -> the Ref error), else what an Arg may be."""
    def split(error: dict) -> tuple[list, list]:
        loc = list(error["loc"])
        path, rest = loc[:4], loc[4:]
        while len(rest) >= 2 and isinstance(rest[1], int):  # 'list[...]', index: one list level down
            path.append(rest[1])
            rest = rest[2:]
        return path, rest

    deepest = max((split(e)[0] for e in errors), key=len)
    value = _lookup(data, deepest)
    if isinstance(value, list) or len(deepest) > 5 + MAX_ARG_DEPTH:  # pydantic's recursion limit
        where = _describe_location(deepest[: 5 + MAX_ARG_DEPTH], data)
        return GraphValidationError(where, f"lists in arguments nest more than {MAX_ARG_DEPTH} deep")
    where = _describe_location(deepest, data)
    if isinstance(value, dict):
        tag = next((_ARG_TAGS[k] for k in value if k in _ARG_TAGS), None)
        for error in errors:
            path, rest = split(error)
            if path == deepest and tag is not None and rest[:1] == [tag] and len(rest) > 1:
                return GraphValidationError(f"{where}.{rest[1]}", _problem(error, rest[1]))
    shown = json.dumps(value, default=str)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return GraphValidationError(where, f"not a valid argument: {_ARG_HINT}; got {shown}")


def _lookup(data: Any, path: list) -> Any:
    for item in path:
        try:
            data = data[item]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def _describe_location(loc: list, data: dict) -> str:
    """Turns pydantic's ('nodes', 3, 'args', 1) into "nodes[3] 'ln'.args[1]"."""
    parts: list[str] = []
    for i, item in enumerate(loc):
        if isinstance(item, int) and parts:
            parts[-1] += f"[{item}]"
            if i == 1 and loc[0] in ("nodes", "inputs", "constants"):
                name = _lookup(data, [loc[0], item, "name"])
                if isinstance(name, str):
                    parts[-1] += f" '{name}'"
        else:
            parts.append(str(item))
    return ".".join(parts) or "graph"


def validate_graph(graph: Graph, limits: Limits) -> None:
    """Checks the rules pydantic's types cannot: limits, names, refs, order, op schemas."""
    for field, items in (("inputs", graph.inputs), ("nodes", graph.nodes)):
        if len(items) > limits.max_nodes:
            raise GraphValidationError(field, f"{len(items)} {field}, over the limit of {limits.max_nodes}")
    if not graph.outputs:
        raise GraphValidationError("outputs", "a graph needs at least one output")
    scope = _Scope(later={node.name: i for i, node in enumerate(graph.nodes)})
    for i, spec in enumerate(graph.inputs):
        where = f"inputs[{i}] '{spec.name}'"
        _check_name(spec.name, where, scope.outputs_of, limits)
        _check_tensor_spec(spec, where, limits)
        scope.outputs_of[spec.name] = 1
    _check_constants(graph.constants, scope, limits)
    for i, node in enumerate(graph.nodes):
        where = f"nodes[{i}] '{node.name}'"
        _check_name(node.name, where, scope.outputs_of, limits)
        schema = _check_target(node, where)
        for j, arg in enumerate(node.args):
            _check_arg(arg, f"{where}.args[{j}]", scope, limits)
        for name, arg in node.kwargs.items():
            _check_arg(arg, f"{where}.kwargs.{name}", scope, limits)
        _check_arity(node, schema, where)
        scope.outputs_of[node.name] = schema.returns
    for i, ref in enumerate(graph.outputs):
        _check_ref(ref, f"outputs[{i}]", scope)


class _Scope:
    """Names defined so far (name -> output count: 1 single, n > 1 a tuple, -1 a list of
    unknown length, 0 none) and the names of nodes not reached yet (name -> position)."""

    def __init__(self, later: dict[str, int]) -> None:
        self.outputs_of: dict[str, int] = {}
        self.later = later


def _check_name(name: str, where: str, seen: dict[str, int], limits: Limits) -> None:
    if len(name) > limits.max_name_length:
        raise GraphValidationError(f"{where}.name", f"name is {len(name)} characters, over the limit of {limits.max_name_length}")
    if not _NAME_PATTERN.fullmatch(name):
        raise GraphValidationError(f"{where}.name", f"{name!r} is not a valid name: a name must start with a letter or '_' and hold only letters, digits, '_' and '.'")
    if name in seen:
        raise GraphValidationError(f"{where}.name", f"duplicate name '{name}' (input and node names share one namespace)")


def _check_tensor_spec(spec: TensorSpec, where: str, limits: Limits) -> None:
    if spec.dtype not in DTYPES:
        raise GraphValidationError(f"{where}.dtype", f"unknown dtype '{spec.dtype}'; known: {', '.join(DTYPES)}")
    if len(spec.shape) > limits.max_rank:
        raise GraphValidationError(f"{where}.shape", f"rank {len(spec.shape)} is over the limit of {limits.max_rank}")
    if any(size < 0 for size in spec.shape):
        raise GraphValidationError(f"{where}.shape", f"sizes must be >= 0, got {spec.shape}")
    numel = math.prod(spec.shape)
    if numel > limits.max_numel:
        raise GraphValidationError(f"{where}.shape", f"{numel} elements, over the limit of {limits.max_numel}")
    if spec.stride is not None:
        _check_strides(spec, where, limits)


def _check_strides(spec: TensorSpec, where: str, limits: Limits) -> None:
    if len(spec.stride) != len(spec.shape):
        raise GraphValidationError(f"{where}.stride", f"stride has {len(spec.stride)} entries for a shape of rank {len(spec.shape)}")
    if any(s < 0 for s in spec.stride):
        raise GraphValidationError(f"{where}.stride", f"strides must be >= 0, got {spec.stride}")
    extent = storage_numel(spec.shape, spec.stride)
    if extent > limits.max_numel:
        raise GraphValidationError(f"{where}.stride", f"strides {spec.stride} span {extent} elements of storage, over the limit of {limits.max_numel}")


def _check_constants(constants: list[ConstantSpec], scope: "_Scope", limits: Limits) -> None:
    if len(constants) > limits.max_constants:
        raise GraphValidationError("constants", f"{len(constants)} constants, over the limit of {limits.max_constants}")
    total = 0
    for i, spec in enumerate(constants):
        where = f"constants[{i}] '{spec.name}'"
        _check_name(spec.name, where, scope.outputs_of, limits)
        _check_tensor_spec(spec, where, limits)
        expected = storage_numel(spec.shape, spec.strides()) * DTYPES[spec.dtype]
        if len(spec.data) > 4 * (-(-limits.max_constant_bytes // 3)):
            raise GraphValidationError(f"{where}.data", f"over the limit of {limits.max_constant_bytes} bytes per constant")
        try:
            raw = spec.raw_bytes()
        except (binascii.Error, ValueError):
            raise GraphValidationError(f"{where}.data", "not valid base64") from None
        if base64.b64encode(raw) != spec.data.encode():  # excess padding, stray low bits: one spelling per bytes
            raise GraphValidationError(f"{where}.data", "not canonical base64 (as base64.b64encode writes it)")
        if len(raw) != expected:
            raise GraphValidationError(f"{where}.data", f"holds {len(raw)} bytes; shape {spec.shape}, strides "
                                       f"{spec.strides()} and dtype {spec.dtype} need {expected}")
        total += len(raw)
        if total > limits.max_constants_bytes:
            raise GraphValidationError(f"{where}.data", f"constants hold {total} bytes so far, over the limit of "
                                       f"{limits.max_constants_bytes} per graph")
        scope.outputs_of[spec.name] = 1


def is_wire_op(target: str) -> bool:
    """Whether a node may name this op: an ATen or prims op whose schema the table knows."""
    return _TARGET_OP_PATTERN.fullmatch(target) is not None and lookup_schema(target) is not None


def _check_target(node: Node, where: str) -> OpSchema:
    if not _TARGET_OP_PATTERN.fullmatch(node.target):
        raise GraphValidationError(f"{where}.target", f"'{node.target}' is not an op name like 'aten.add.Tensor' (namespace aten or prims, op, overload)")
    schema = lookup_schema(node.target)
    if schema is None:
        kind = "ATen" if node.target.startswith("aten.") else "prims"
        raise GraphValidationError(f"{where}.target", f"unknown {kind} op '{node.target}'")
    return schema


def _check_arity(node: Node, schema: OpSchema, where: str) -> None:
    if len(node.args) > schema.max_positional:
        raise GraphValidationError(f"{where}.args", f"{node.target} takes at most {schema.max_positional} positional argument(s), got {len(node.args)}")
    positional = schema.arg_names[: len(node.args)]
    for name in node.kwargs:
        if name not in schema.arg_names:
            raise GraphValidationError(f"{where}.kwargs.{name}", f"{node.target} has no argument '{name}' (its arguments: {', '.join(schema.arg_names)})")
        if name in positional:
            raise GraphValidationError(f"{where}.kwargs.{name}", f"argument '{name}' of {node.target} is also given positionally")
    missing = [name for name in schema.required if name not in positional and name not in node.kwargs]
    if missing:
        raise GraphValidationError(f"{where}.args", f"{node.target} is missing required argument '{missing[0]}'")


def _check_arg(arg: Arg, where: str, scope: _Scope, limits: Limits, depth: int = 0) -> None:
    if depth > MAX_ARG_DEPTH:
        raise GraphValidationError(where, f"lists in arguments nest more than {MAX_ARG_DEPTH} deep")
    if isinstance(arg, Ref):
        _check_ref(arg, where, scope)
    elif isinstance(arg, list):
        if len(arg) > limits.max_list_length:
            raise GraphValidationError(where, f"list of {len(arg)} items, over the limit of {limits.max_list_length}")
        for i, item in enumerate(arg):
            _check_arg(item, f"{where}[{i}]", scope, limits, depth + 1)
    elif isinstance(arg, str) and len(arg) > limits.max_name_length:
        raise GraphValidationError(where, f"string of {len(arg)} characters, over the limit of {limits.max_name_length}")
    else:
        _check_enum_arg(arg, where)


def _check_enum_arg(arg: Arg, where: str) -> None:
    if isinstance(arg, DtypeArg) and arg.dtype not in DTYPES:
        raise GraphValidationError(f"{where}.dtype", f"unknown dtype '{arg.dtype}'; known: {', '.join(DTYPES)}")
    if isinstance(arg, DeviceArg) and not _DEVICE_PATTERN.fullmatch(arg.device):
        raise GraphValidationError(f"{where}.device", f"unknown device '{arg.device}'; expected 'cpu', 'cuda' or 'cuda:N'")
    if isinstance(arg, LayoutArg) and arg.layout not in LAYOUTS:
        raise GraphValidationError(f"{where}.layout", f"unknown layout '{arg.layout}'; known: {', '.join(LAYOUTS)}")
    if isinstance(arg, MemoryFormatArg) and arg.memory_format not in MEMORY_FORMATS:
        raise GraphValidationError(f"{where}.memory_format", f"unknown memory format '{arg.memory_format}'; known: {', '.join(MEMORY_FORMATS)}")


def _check_ref(ref: Ref, where: str, scope: _Scope) -> None:
    if ref.ref not in scope.outputs_of:
        if ref.ref in scope.later:
            raise GraphValidationError(where, f"ref '{ref.ref}' names nodes[{scope.later[ref.ref]}], not an input or earlier node; nodes must be in topological order (a cycle has none)")
        raise GraphValidationError(where, f"ref '{ref.ref}' names no input or node (dangling ref)")
    count = scope.outputs_of[ref.ref]
    if count == 0:
        raise GraphValidationError(where, f"'{ref.ref}' returns nothing; there is no tensor to refer to")
    if ref.index is None:
        if count > 1:
            raise GraphValidationError(where, f"'{ref.ref}' has {count} outputs; the ref needs an index (0..{count - 1})")
        if count == -1:
            raise GraphValidationError(where, f"'{ref.ref}' returns a list of tensors; the ref needs an index")
        return
    if count == 1:
        raise GraphValidationError(f"{where}.index", f"'{ref.ref}' has a single output; drop the index")
    if ref.index < 0 or (count > 0 and ref.index >= count):
        upper = f"0..{count - 1}" if count > 0 else ">= 0"
        raise GraphValidationError(f"{where}.index", f"index {ref.index} out of range for '{ref.ref}' (valid: {upper})")


def validate_target(target: str) -> str:
    if not isinstance(target, str) or not TARGET_PATTERN.fullmatch(target):
        raise GraphValidationError("target", f"unknown target {target!r}; expected 'cpu' or 'cuda:sm_XY' (e.g. cuda:sm_90)")
    return target


def validate_released_inputs(graph: Graph, options: CompileOptions) -> None:
    """Every position in `options.released_inputs` names one of the graph's inputs."""
    for position in options.released_inputs:
        if position >= len(graph.inputs):
            raise GraphValidationError("options.released_inputs",
                                       f"input {position} does not exist: the graph has {len(graph.inputs)} inputs")


def parse_options(options: CompileOptions | dict | None) -> CompileOptions:
    """CompileOptions from a request's `options` object; GraphValidationError when invalid."""
    if isinstance(options, CompileOptions):
        return options
    if options is not None and not isinstance(options, dict):
        raise GraphValidationError("options", f"expected a JSON object, got {_json_type(options)}")
    try:
        return CompileOptions.model_validate(options or {})
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = ".".join(str(item) for item in ("options", *error["loc"]))
        problem = "unknown option" if error["type"] == "extra_forbidden" else error["msg"]
        raise GraphValidationError(loc, problem) from None


def refs_in(value: Any) -> Iterator[str]:
    """The names a node argument refers to, through nested lists, once per reference."""
    if isinstance(value, Ref):
        yield value.ref
    elif isinstance(value, list):
        for item in value:
            yield from refs_in(item)


# ---------------------------------------------------------------------------------
# Canonical form and key
# ---------------------------------------------------------------------------------


def canonical_graph(graph: Graph) -> dict:
    """The graph with names replaced by position (i0.., n0..) and strides made explicit."""
    rename = {spec.name: f"i{i}" for i, spec in enumerate(graph.inputs)}
    rename.update({spec.name: f"c{i}" for i, spec in enumerate(graph.constants)})
    rename.update({node.name: f"n{i}" for i, node in enumerate(graph.nodes)})

    def arg(value: Any) -> Any:
        if isinstance(value, Ref):
            return Ref(ref=rename[value.ref], index=value.index).model_dump()
        if isinstance(value, BaseModel):
            return value.model_dump()
        if isinstance(value, list):
            return [arg(item) for item in value]
        if isinstance(value, float) and not math.isfinite(value):
            return {"float": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
        return value

    canonical = {
        "version": graph.version,
        "inputs": [{"dtype": s.dtype, "shape": s.shape, "stride": s.strides()} for s in graph.inputs],
        "nodes": [
            {"target": n.target, "args": arg(n.args), "kwargs": {k: arg(v) for k, v in n.kwargs.items()}}
            for n in graph.nodes
        ],
        "outputs": [arg(ref) for ref in graph.outputs],
    }
    if graph.constants:  # absent from v1.0 graphs, so their keys are unchanged
        canonical["constants"] = [
            {"dtype": c.dtype, "shape": c.shape, "stride": c.strides(),
             "sha256": hashlib.sha256(c.raw_bytes()).hexdigest()} for c in graph.constants]
    return canonical


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, floats in their shortest round-trip repr (Python's)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def key(graph: Graph, target: str, options: CompileOptions | dict | None = None) -> str:
    """The content address of a compile: sha256 of graph, target, options and compiler ABI."""
    validate_target(target)
    options = parse_options(options)
    dumped = options.model_dump(mode="json")
    if not dumped["released_inputs"]:  # keys from before the option existed stay valid
        del dumped["released_inputs"]
    payload = {
        "graph": canonical_graph(graph),
        "target": target,
        "options": dumped,
        "abi": ABI_VERSION,
    }
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


def graph_to_json(graph: Graph) -> str:
    return graph.model_dump_json()
