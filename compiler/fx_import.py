"""torch.fx <-> wire format: capture an ATen-level GraphModule as a wire Graph, and run
any wire Graph eagerly with ATen ops (the reference every compiled kernel is checked
against).

    graph = from_fx(make_fx(fn)(*inputs), inputs)
    outputs = run_eager(graph, inputs)          # list of tensors
    module = to_fx(graph, "cuda")                # the same ATen calls as an fx GraphModule (torch.compile-able)
    inputs = random_inputs(graph, seed=0)        # random data with the graph's layouts
"""

from __future__ import annotations

import base64
import math
import operator
from typing import Any, Callable, Sequence

import torch
import torch.fx

from compiler.graph import (
    DTYPES, NON_FINITE, ConstantSpec, DeviceArg, DtypeArg, FloatArg, Graph, GraphValidationError, LayoutArg,
    MemoryFormatArg, Node, Ref, TensorSpec, is_wire_op, validate_graph,
)
from compiler.options import Limits


class ConversionError(ValueError):
    """An fx graph holds something wire format v1 cannot express; says which node."""


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


# ---------------------------------------------------------------------------------
# fx -> wire
# ---------------------------------------------------------------------------------


def from_fx(gm: torch.fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> Graph:
    """Converts an ATen-level GraphModule (make_fx / aot_autograd output) to a wire Graph."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        raise ConversionError(f"graph has {len(placeholders)} inputs, {len(example_inputs)} example inputs given")
    inputs = [_tensor_spec(n, t) for n, t in zip(placeholders, example_inputs)]
    refs: dict[torch.fx.Node, Ref] = {n: Ref(ref=spec.name) for n, spec in zip(placeholders, inputs)}
    constants = _Constants()
    nodes: list[Node] = []
    outputs: list[Ref] = []
    for fx_node in gm.graph.nodes:
        if fx_node.op == "placeholder":
            continue
        if fx_node.op == "get_attr":
            refs[fx_node] = constants.add(_attribute(gm, fx_node), _wire_name(fx_node.name), fx_node)
        elif fx_node.op == "output":
            outputs = [_output_ref(value, i, refs) for i, value in enumerate(_flatten(fx_node.args[0]))]
        elif fx_node.op == "call_function" and fx_node.target is operator.getitem:
            source, index = fx_node.args
            refs[fx_node] = Ref(ref=refs[source].ref, index=index)
        elif fx_node.op == "call_function" and str(fx_node.target) in _SPELLED_OUT:
            nodes += _SPELLED_OUT[str(fx_node.target)](fx_node, refs, constants)
            refs[fx_node] = Ref(ref=nodes[-1].name)
        elif fx_node.op == "call_function" and isinstance(fx_node.target, torch._ops.OpOverload):
            name = _wire_name(fx_node.name)
            nodes.append(Node(
                name=name,
                target=str(fx_node.target),
                args=[_to_arg(a, fx_node, refs, constants) for a in fx_node.args],
                kwargs={k: _to_arg(v, fx_node, refs, constants) for k, v in fx_node.kwargs.items()},
            ))
            refs[fx_node] = Ref(ref=name)
        else:
            raise _not_an_op(fx_node)
    graph = Graph(version=1, inputs=inputs, nodes=nodes, outputs=outputs, constants=constants.specs)
    try:
        validate_graph(graph, Limits())
    except GraphValidationError as exc:
        raise ConversionError(f"the captured graph breaks a wire-format rule: {exc}") from None
    return graph


def travels(fx_node: torch.fx.Node) -> bool:
    """Whether from_fx can put this call_function node on the wire: an ATen or prims op the schema
    table knows, an op spelled out in those, or an item of a tuple result. Others (custom ops
    registered by the user's libraries, Python callables) can only run in the caller's process."""
    target = fx_node.target
    if target is operator.getitem or str(target) in _SPELLED_OUT:
        return True
    return isinstance(target, torch._ops.OpOverload) and is_wire_op(str(target))


def _fma(fx_node: torch.fx.Node, refs: dict, constants: "_Constants") -> list[Node]:
    """Inductor's `prims.fma(a, b, c)` = a * b + c, which dynamo writes for `addcmul_`/`addcdiv_` with a
    value (AdamW's update): no wire-format op, so it travels as ATen's mul and add."""
    a, b, c = (_to_arg(value, fx_node, refs, constants) for value in fx_node.args)
    name = _wire_name(fx_node.name)
    return [Node(name=f"{name}_product", target="aten.mul.Tensor", args=[a, b], kwargs={}),
            Node(name=name, target="aten.add.Tensor", args=[Ref(ref=f"{name}_product"), c], kwargs={})]


# ops outside ATen that dynamo puts into graphs, spelled out in ATen ops
_SPELLED_OUT = {"prims.fma.default": _fma}


class _Constants:
    """Tensors captured with the graph (get_attr nodes, tensors inside arguments), one spec each."""

    def __init__(self) -> None:
        self.specs: list[ConstantSpec] = []
        self._seen: dict[int, Ref] = {}

    def add(self, tensor: Any, name: str, owner: torch.fx.Node) -> Ref:
        if id(tensor) in self._seen:
            return self._seen[id(tensor)]
        self.specs.append(constant_spec(tensor, name, owner))
        self._seen[id(tensor)] = ref = Ref(ref=name)
        return ref


def _attribute(gm: torch.fx.GraphModule, fx_node: torch.fx.Node) -> Any:
    value: Any = gm
    for part in str(fx_node.target).split("."):
        value = getattr(value, part)
    return value


def constant_spec(tensor: Any, name: str, owner: torch.fx.Node | None = None) -> ConstantSpec:
    """A captured tensor as a wire constant: its values, contiguous, little-endian, base64."""
    where = f"node '{owner.name}'" if owner is not None else f"constant '{name}'"
    if not isinstance(tensor, torch.Tensor):
        raise ConversionError(f"{where} reads {type(tensor).__name__}, not a tensor; wire constants are tensors")
    dtype = dtype_name(tensor.dtype)
    if dtype not in DTYPES:
        raise ConversionError(f"{where} holds a constant tensor of dtype {dtype}, which wire format v1 has no name for")
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

    if isinstance(tensor, FakeTensor) or tensor.device.type == "meta":
        raise ConversionError(f"{where} holds a constant tensor with no data (fake or meta)")
    with unset_fake_temporarily():
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        raw = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
    return ConstantSpec(name=name, dtype=dtype, shape=list(tensor.shape), data=base64.b64encode(raw).decode())


def constant_tensor(spec: ConstantSpec, device: str | torch.device = "cpu") -> torch.Tensor:
    """The tensor a wire constant holds, with its strides, on `device`."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    dtype = torch_dtype(spec.dtype)
    raw = spec.raw_bytes()
    with unset_fake_temporarily():  # real data even when called while a fake mode traces (in-process compiles)
        flat = torch.frombuffer(bytearray(raw), dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        return torch.as_strided(flat, spec.shape, spec.strides()).to(device)


def _not_an_op(fx_node: torch.fx.Node) -> ConversionError:
    return ConversionError(
        f"node '{fx_node.name}' ({fx_node.op} {fx_node.target}) is not an ATen op call; "
        "capture the function with make_fx or aot_autograd so that it holds ATen ops only"
    )


def _wire_name(name: str) -> str:
    return name if name[:1].isalpha() or name[:1] == "_" else f"_{name}"


def _tensor_spec(node: torch.fx.Node, example: Any) -> TensorSpec:
    if not isinstance(example, torch.Tensor):
        raise ConversionError(f"input '{node.name}' is {type(example).__name__}, not a tensor")
    return TensorSpec(
        name=_wire_name(node.name),
        dtype=dtype_name(example.dtype),
        shape=list(example.shape),
        stride=list(example.stride()),
    )


def _flatten(value: Any) -> list:
    if isinstance(value, (list, tuple)):
        return [item for v in value for item in _flatten(v)]
    return [value]


def _output_ref(value: Any, position: int, refs: dict[torch.fx.Node, Ref]) -> Ref:
    if not isinstance(value, torch.fx.Node):
        raise ConversionError(f"output {position} is {value!r}, not a tensor; wire format v1 outputs tensors only")
    return refs[value]


def _to_arg(value: Any, owner: torch.fx.Node, refs: dict[torch.fx.Node, Ref], constants: _Constants) -> Any:
    if isinstance(value, torch.fx.Node):
        if value not in refs:
            raise ConversionError(f"node '{owner.name}' uses '{value.name}', which is not a tensor the wire format can name")
        return refs[value]
    if isinstance(value, (list, tuple)):
        return [_to_arg(v, owner, refs, constants) for v in value]
    if isinstance(value, torch.Tensor):
        return constants.add(value, f"_fw_const{len(constants.specs)}", owner)
    try:
        return scalar_arg(value)
    except TypeError:
        raise ConversionError(f"node '{owner.name}' has an argument of type {type(value).__name__} ({value!r}) "
                              "that wire format v1 cannot express") from None


def scalar_arg(value: Any) -> Any:
    """A non-tensor argument in wire form: numbers, strings, None, dtype/device/layout/memory_format."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return FloatArg(float="nan")
        if math.isinf(value):
            return FloatArg(float="inf" if value > 0 else "-inf")
        return value
    if isinstance(value, torch.dtype):
        return DtypeArg(dtype=dtype_name(value))
    if isinstance(value, torch.device):
        return DeviceArg(device=value.type)
    if isinstance(value, torch.layout):
        return LayoutArg(layout=str(value).removeprefix("torch."))
    if isinstance(value, torch.memory_format):
        return MemoryFormatArg(memory_format=str(value).removeprefix("torch."))
    raise TypeError(f"{type(value).__name__} ({value!r}) has no wire form")


# ---------------------------------------------------------------------------------
# wire -> eager
# ---------------------------------------------------------------------------------


def resolve_op(target: str) -> torch._ops.OpOverload:
    """'aten.add.Tensor' -> torch.ops.aten.add.Tensor."""
    namespace, op, overload = target.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), op), overload)


def from_arg(value: Any, env: dict[str, Any], device: torch.device) -> Any:
    """A wire argument back to the Python value an ATen op takes."""
    if isinstance(value, Ref):
        found = env[value.ref]
        return found if value.index is None else found[value.index]
    if isinstance(value, list):
        return [from_arg(v, env, device) for v in value]
    if isinstance(value, DtypeArg):
        return torch_dtype(value.dtype)
    if isinstance(value, DeviceArg):
        return device  # graphs run where their inputs are, whatever device they were captured on
    if isinstance(value, FloatArg):
        return NON_FINITE[value.float]
    if isinstance(value, LayoutArg):
        return getattr(torch, value.layout)
    if isinstance(value, MemoryFormatArg):
        return getattr(torch, value.memory_format)
    return value


def run_eager(graph: Graph, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Runs the graph op by op with ATen; the reference result for compiled code.

    The caller's tensors are never changed: a graph with in-place ops (mul_, copy_...) runs
    on copies of its inputs, as wire graphs have outputs only, no input mutation."""
    if len(inputs) != len(graph.inputs):
        raise ValueError(f"the graph takes {len(graph.inputs)} inputs, {len(inputs)} given")
    device = inputs[0].device if inputs else torch.device("cpu")
    ops = [resolve_op(node.target) for node in graph.nodes]
    if any(op._schema.is_mutable for op in ops):
        inputs = [_copy_strided(t) for t in inputs]
    env: dict[str, Any] = {spec.name: tensor for spec, tensor in zip(graph.inputs, inputs)}
    env.update({spec.name: constant_tensor(spec, device) for spec in graph.constants})
    for node, op in zip(graph.nodes, ops):
        args = [from_arg(a, env, device) for a in node.args]
        kwargs = {k: from_arg(v, env, device) for k, v in node.kwargs.items()}
        env[node.name] = op(*args, **kwargs)
    return [from_arg(ref, env, device) for ref in graph.outputs]


def _copy_strided(tensor: torch.Tensor) -> torch.Tensor:
    """A copy with the same sizes and strides, even overlapping ones (stride 0): the storage
    span the tensor reads is cloned and viewed again (clone() would make it contiguous)."""
    extent = 1 + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride())) if tensor.numel() else 0
    span = tensor.as_strided((extent,), (1,), tensor.storage_offset()).clone()
    return span.as_strided(tensor.shape, tensor.stride())


def to_callable(graph: Graph) -> Callable[..., list[torch.Tensor]]:
    return lambda *inputs: run_eager(graph, inputs)


def to_fx(graph: Graph, device: str | torch.device = "cpu") -> torch.fx.GraphModule:
    """The wire graph as an fx GraphModule of the same ATen calls, returning the list of outputs
    run_eager returns: a function torch.compile (Inductor) can compile. Constants become buffers
    on `device`, and device arguments name `device` (the inputs must live there). A graph with
    in-place ops works on strided copies of its inputs first, as run_eager does."""
    device = torch.device(device)
    root, fx_graph = torch.nn.Module(), torch.fx.Graph()
    mutates = any(resolve_op(node.target)._schema.is_mutable for node in graph.nodes)
    env: dict[str, torch.fx.Node] = {}
    for spec in graph.inputs:
        placeholder = fx_graph.placeholder(spec.name.replace(".", "_"))
        env[spec.name] = fx_graph.call_function(_copy_strided, (placeholder,)) if mutates else placeholder
    for i, spec in enumerate(graph.constants):
        root.register_buffer(f"constant{i}", constant_tensor(spec, device))
        env[spec.name] = fx_graph.get_attr(f"constant{i}")
    items: dict[tuple[str, int], torch.fx.Node] = {}

    def arg(value: Any) -> Any:
        if isinstance(value, Ref) and value.index is not None:
            key = (value.ref, value.index)
            if key not in items:
                items[key] = fx_graph.call_function(operator.getitem, (env[value.ref], value.index))
            return items[key]
        if isinstance(value, Ref):
            return env[value.ref]
        if isinstance(value, list):
            return [arg(item) for item in value]
        return from_arg(value, {}, device)

    for node in graph.nodes:
        env[node.name] = fx_graph.call_function(resolve_op(node.target), tuple(arg(a) for a in node.args),
                                                {k: arg(v) for k, v in node.kwargs.items()})
    fx_graph.output([arg(ref) for ref in graph.outputs])
    return torch.fx.GraphModule(root, fx_graph)


def random_tensor(spec: TensorSpec, generator: torch.Generator, device: str | torch.device = "cpu",
                  int_range: tuple[float, float] | None = None) -> torch.Tensor:
    """Random data (never all zeros) laid out with the spec's exact strides.

    `int_range` [low, high) bounds the values: integers are drawn uniformly from it (default
    [0, 16)), floats uniformly from it when given (e.g. a variance that must be > 0), else
    from a standard normal."""
    dtype = torch_dtype(spec.dtype)
    strides = spec.strides()
    storage = 1 + sum((size - 1) * stride for size, stride in zip(spec.shape, strides)) if all(spec.shape) else 0
    if dtype.is_floating_point and int_range is not None:
        low, high = int_range
        flat = torch.empty(storage, dtype=torch.float32).uniform_(low, high, generator=generator).to(dtype)
        inside = (flat >= low) & (flat < high)  # a bf16 draw just below `high` may round up to it
        flat = torch.where(inside, flat, torch.tensor((low + high) / 2, dtype=dtype))
    elif dtype.is_floating_point:
        flat = torch.randn(storage, generator=generator, dtype=torch.float32).to(dtype)
    elif dtype == torch.bool:
        flat = torch.rand(storage, generator=generator) < 0.5
    else:
        low, high = int_range or (0, 16)
        flat = torch.randint(int(low), int(high), (storage,), generator=generator).to(dtype)
    return torch.as_strided(flat.to(device), spec.shape, strides)


def random_inputs(graph: Graph, seed: int = 0, device: str | torch.device = "cpu",
                  int_ranges: dict[str, tuple[float, float]] | None = None) -> list[torch.Tensor]:
    """Random inputs for the graph, seeded; `int_ranges` maps input names to value ranges
    [low, high) (see random_tensor), as tests/graphs/inputs.json holds them."""
    generator = torch.Generator().manual_seed(seed)
    int_ranges = int_ranges or {}
    return [random_tensor(spec, generator, device, _range(int_ranges.get(spec.name))) for spec in graph.inputs]


def _range(value: Any) -> tuple[float, float] | None:
    return None if value is None else (value[0], value[1])
