"""Whole wire graphs cut into benchmark cases: one case per kernel group that fusewire's scheduler
makes, holding the wire nodes the group was lowered from.

    for case in group_cases(graph, source="llama", graph_name="bw0"):
        case.name, case.graph, case.moved_bytes, case.input_ranges

How a group becomes a standalone wire graph: the graph is lowered and scheduled (target-free
stages, autotuning and benchmark-driven fusion off); each kernel group's IR nodes name the wire
nodes they came from (`origins`). Those nodes make the case, plus any view between two of them
(views lower to index remaps, so no IR node names them) and the views through which they read an
outside value, back to that value (slices of one buffer then read one input, as in the kernel the
scheduler made; such views are never case outputs). Every value the case reads from outside
becomes a graph input with the producing value's shape, strides and dtype (inferred on meta
tensors); every value used outside the case, or a graph output, becomes a case output. A copy_ into
a graph input (an optimizer's in-place update, BatchNorm's running statistics written in the graph)
is left out: the value it stores becomes a case output, so a case never overwrites its inputs.

Extern steps (matmuls, attention, embedding backward...) are not cases. A wire node that runs an
extern call and also a kernel (a matmul whose misaligned operand a kernel pads, then slices back)
is left out of the kernel's case, its result read as an input; a group with nothing else is no
case. Nor is a group that reads no tensor (a mask or an arange made from nothing: fusewire's
runtime runs a graph without inputs on the CPU).

Inputs that must hold valid values get ranges (`input_ranges`, as tests/graphs/inputs.json):
integer inputs that an index argument depends on stay below the size they index, and float inputs
that a square root, reciprocal square root, logarithm or fractional power depends on are drawn
from [0.01, 1) so that random data does not turn a case into NaNs.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch

from compiler.fx_import import constant_tensor, dtype_name, from_arg, resolve_op
from compiler.graph import (ITEMSIZES, Graph, Node, Ref, TensorSpec, canonical_graph, canonical_json,
                            storage_numel)
from compiler.lowering.extern_layouts import device_layouts
from compiler.options import CompileOptions

SCHEDULE_OPTIONS = CompileOptions(autotune=False, benchmark_fusion=False)
POSITIVE_RANGE = (0.01, 1.0)
SHORT_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64", "int64": "i64",
                "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "bool"}

ValueKey = tuple[str, int | None]  # (wire name, index among a node's outputs or None)


@dataclass
class Case:
    """One benchmark case: a standalone wire graph and where it came from."""

    name: str
    source: str  # the model or workload ("llama", "cnn_norm", "adamw")
    graph_name: str  # the captured graph it was cut from ("fw0", "bw0")
    group: str  # the kernel group's name in that graph's schedule ("fw_red_fused_native_layer_norm_3"), or "whole"
    graph: Graph
    moved_bytes: int  # each input read once, each output written once
    input_ranges: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return structure_key(self.graph)


def structure_key(graph: Graph) -> str:
    """Equal for graphs that are equal once values are renamed canonically (by position)."""
    return hashlib.sha256(canonical_json(canonical_graph(graph)).encode()).hexdigest()


# ---------------------------------------------------------------------------------
# value layouts, on meta tensors
# ---------------------------------------------------------------------------------


def value_layouts(graph: Graph) -> dict[ValueKey, TensorSpec]:
    """The shape, strides and dtype of every tensor value of the graph, inferred by running it on
    meta tensors (no data). Keys are (name, None) for single results, (name, i) for the i-th."""
    meta = torch.device("meta")
    env: dict[str, Any] = {spec.name: torch.empty_strided(spec.shape, spec.strides(), dtype=getattr(torch, spec.dtype),
                                                          device=meta) for spec in graph.inputs}
    env.update({spec.name: constant_tensor(spec, meta) for spec in graph.constants})
    for node in graph.nodes:
        args = [from_arg(a, env, meta) for a in node.args]
        env[node.name] = _device_layouts(node.target, args, resolve_op(node.target)(
            *args, **{k: from_arg(v, env, meta) for k, v in node.kwargs.items()}))
    layouts: dict[ValueKey, TensorSpec] = {}
    for name, value in env.items():
        if isinstance(value, torch.Tensor):
            layouts[(name, None)] = _spec(name, value)
        elif isinstance(value, (tuple, list)):
            layouts.update({(name, i): _spec(name, v) for i, v in enumerate(value) if isinstance(v, torch.Tensor)})
    return layouts


def _device_layouts(target: str, args: list[Any], result: Any) -> Any:
    """`result` laid out as the GPU's kernel returns it where the meta kernel says otherwise (a
    convolution of channels-last tensors, compiler/lowering/extern_layouts.py)."""
    if isinstance(result, torch.Tensor):
        return device_layouts(target, args, [result])[0]
    if isinstance(result, (tuple, list)):
        return type(result)(device_layouts(target, args, list(result)))
    return result


def _spec(name: str, tensor: torch.Tensor) -> TensorSpec:
    return TensorSpec(name=name, dtype=dtype_name(tensor.dtype), shape=list(tensor.shape), stride=list(tensor.stride()))


# ---------------------------------------------------------------------------------
# kernel groups
# ---------------------------------------------------------------------------------


@dataclass
class GroupOrigins:
    """A kernel group's name and the wire nodes its IR nodes came from."""

    name: str
    members: set[str]


def kernel_groups(graph: Graph) -> tuple[list[GroupOrigins], set[str], set[str]]:
    """(kernel groups in schedule order, wire nodes that ran an extern call, wire nodes that any
    scheduled step came from). Lowering and scheduling are target-free; nothing is compiled."""
    from compiler.lowering import lower
    from compiler.scheduler import ExternStep, KernelGroup, schedule

    scheduled = schedule(lower(graph), SCHEDULE_OPTIONS)
    wire_names = {node.name for node in graph.nodes}
    groups, extern_origins, lowered = [], set(), set()
    for step in scheduled.steps:
        if isinstance(step, ExternStep):
            extern_origins.update(o for o in step.node.origins if o in wire_names)
        elif isinstance(step, KernelGroup):
            members = {o for node in step.nodes for o in node.origins if o in wire_names}
            groups.append(GroupOrigins(step.name, members))
    for group in groups:
        lowered |= group.members
    return groups, extern_origins, lowered | extern_origins


# ---------------------------------------------------------------------------------
# cutting one group out of a graph
# ---------------------------------------------------------------------------------


def refs_in(value: Any) -> Iterable[Ref]:
    """Every Ref inside a wire argument (lists nest)."""
    if isinstance(value, Ref):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from refs_in(item)


def node_refs(node: Node) -> list[Ref]:
    return [r for a in [*node.args, *node.kwargs.values()] for r in refs_in(a)]


def with_views_between(graph: Graph, members: set[str], lowered: set[str]) -> set[str]:
    """`members` plus the nodes that made no IR (views) lying on a path from a member to a member."""
    reads_member: set[str] = set()
    for node in graph.nodes:
        if node.name not in lowered and any(r.ref in members or r.ref in reads_member for r in node_refs(node)):
            reads_member.add(node.name)
    kept = set(members)
    for node in reversed(graph.nodes):
        if node.name in kept:
            kept.update(r.ref for r in node_refs(node) if r.ref in reads_member)
    return kept


def with_views_read(graph: Graph, included: set[str], lowered: set[str]) -> tuple[set[str], set[str]]:
    """(`included` plus the views through which it reads outside values, back to the value they
    view; those views). Slices of one buffer then read one input, as the kernel does: DenseNet's
    backward adds each read a channel slice of one concatenated gradient, and with a slice per
    input they share nothing and make a kernel each."""
    by_name = {node.name: node for node in graph.nodes}
    views: set[str] = set()
    pending = [r.ref for name in included for r in node_refs(by_name[name])]
    while pending:
        node = by_name.get(pending.pop())
        if node is None or node.name in included or node.name in views or node.name in lowered or _op(node) not in VIEWS:
            continue
        views.add(node.name)
        pending.extend(r.ref for r in node_refs(node))
    return included | views, views


def _op(node: Node) -> str:
    return node.target.split(".")[1]


def cut(graph: Graph, included: set[str], layouts: dict[ValueKey, TensorSpec],
        views_read: set[str] = frozenset()) -> Graph | None:
    """The wire sub-graph of the `included` nodes: outside values read become inputs (with their
    layouts), values used outside or graph outputs become outputs, except `views_read` (views the
    case reads through: an output aliasing an input would be no kernel's work). None when nothing
    is used outside."""
    constants = {spec.name: spec for spec in graph.constants}
    inputs: dict[ValueKey, TensorSpec] = {}
    used_constants: dict[str, Any] = {}
    taken = set(included)

    def rename(value: Any) -> Any:
        if isinstance(value, list):
            return [rename(item) for item in value]
        if not isinstance(value, Ref) or value.ref in included:
            return value
        if value.ref in constants:
            used_constants[value.ref] = constants[value.ref]
            return value
        key = (value.ref, value.index)
        if key not in inputs:
            inputs[key] = layouts[key].model_copy(update={"name": _input_name(key, taken)})
        return Ref(ref=inputs[key].name)

    nodes = [Node(name=n.name, target=n.target, args=[rename(a) for a in n.args],
                  kwargs={k: rename(v) for k, v in n.kwargs.items()})
             for n in graph.nodes if n.name in included]
    outputs = [ref for ref in _outputs(graph, included) if ref.ref not in views_read]
    if not outputs:
        return None
    return Graph(version=1, inputs=list(inputs.values()), nodes=nodes, outputs=outputs,
                 constants=list(used_constants.values()))


def _input_name(key: ValueKey, taken: set[str]) -> str:
    base = key[0] if key[1] is None else f"{key[0]}_{key[1]}"
    name, n = base, 1
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    taken.add(name)
    return name


def _outputs(graph: Graph, included: set[str]) -> list[Ref]:
    """Values of included nodes that other nodes or the graph's outputs read, in program order."""
    used: set[tuple[str, int | None]] = set()
    for node in graph.nodes:
        if node.name not in included:
            used.update((r.ref, r.index) for r in node_refs(node) if r.ref in included)
    used.update((r.ref, r.index) for r in graph.outputs if r.ref in included)
    position = {node.name: i for i, node in enumerate(graph.nodes)}
    ordered = sorted(used, key=lambda key: (position[key[0]], -1 if key[1] is None else key[1]))
    return [Ref(ref=name, index=index) for name, index in ordered]


# ---------------------------------------------------------------------------------
# cases of a whole graph
# ---------------------------------------------------------------------------------


def group_cases(graph: Graph, source: str, graph_name: str, skipped: Counter | None = None) -> list[Case]:
    """One case per kernel group of `graph`, in schedule order (not deduplicated; `name` is the
    stem `case_stem` gives, not unique yet). `skipped` counts the groups left out, by reason."""
    skipped = Counter() if skipped is None else skipped
    layouts = value_layouts(graph)
    groups, extern_origins, lowered = kernel_groups(graph)
    input_writes = _input_writes(graph)
    cases = []
    for group in groups:
        # extern_origins: e.g. a matmul's operand padding, the extern's own work; input_writes: the
        # case writes the new values as an output instead (it would otherwise overwrite its inputs)
        members = group.members - extern_origins - input_writes
        if not members:
            skipped["only part of an extern call (a padded matmul operand) or an output copy"] += 1
        else:
            included, views_read = with_views_read(graph, with_views_between(graph, members, lowered), lowered)
            case_graph = cut(graph, included, layouts, views_read)
            if case_graph is None:
                skipped["nothing it writes is read"] += 1
            elif not case_graph.inputs:
                skipped["reads no tensor"] += 1
            else:
                cases.append(make_case(case_graph, source, graph_name, group.name))
    return cases


def _input_writes(graph: Graph) -> set[str]:
    """copy_ nodes that store into a graph input (an optimizer's in-place update, BatchNorm's running
    statistics kept in the graph)."""
    inputs = {spec.name for spec in graph.inputs}
    return {node.name for node in graph.nodes if node.target == "aten.copy_.default"
            and isinstance(node.args[0], Ref) and node.args[0].ref in inputs}


def whole_graph_case(graph: Graph, source: str, graph_name: str) -> Case:
    """The captured graph itself as one case (extern calls included)."""
    return make_case(graph, source, graph_name, "whole")


def make_case(graph: Graph, source: str, graph_name: str, group: str) -> Case:
    layouts = value_layouts(graph)
    case = Case("", source, graph_name, group, graph, moved_bytes(graph, layouts), input_ranges(graph, layouts))
    case.name = case_stem(case, layouts)
    return case


# Ops that make no kernel, only a new way to index their input (single results only).
VIEWS = frozenset({"view", "_unsafe_view", "reshape", "slice", "select", "narrow", "permute", "transpose", "t",
                   "expand", "unsqueeze", "squeeze", "as_strided", "alias", "diagonal", "unfold"})
GATHERS = frozenset({"embedding", "index_select", "gather", "index", "_unsafe_index"})  # argument 0 is the table


# Tensor arguments whose values an op never reads, only their shape: a pool's backward takes the
# pool's input for its size, `zeros_like` its argument. (op, argument positions).
SHAPE_ONLY_ARGUMENTS = {"max_pool2d_with_indices_backward": (1,), "avg_pool2d_backward": (1,),
                        "_adaptive_avg_pool2d_backward": (1,), "empty_like": (0,), "zeros_like": (0,),
                        "ones_like": (0,), "full_like": (0,), "rand_like": (0,), "randn_like": (0,),
                        "new_empty": (0,), "new_zeros": (0,), "new_ones": (0,), "new_full": (0,)}


def moved_bytes(graph: Graph, layouts: dict[ValueKey, TensorSpec]) -> int:
    """The fewest bytes the graph must move: each input and constant read once, each output
    written once. An input is read once however often it is used: the elements its strides reach,
    or fewer (a broadcast input is read once, not once per use); a table read only through
    gathers (an embedding's weight) at most once per element gathered; a value read only through
    views at most the elements its views reach; one whose shape alone is used, not at all."""
    gathered = _gathered_bytes(graph, layouts)
    viewed = _viewed_bytes(graph, layouts)
    unread = shape_only_inputs(graph)

    def read(spec: TensorSpec) -> int:
        if spec.name in unread:
            return 0
        whole = _reach(spec)
        return min(whole, gathered.get(spec.name, whole), viewed.get(spec.name, whole))

    written = sum(_nbytes(layouts[(r.ref, r.index)]) for r in dict.fromkeys(graph.outputs))
    return sum(read(s) for s in [*graph.inputs, *graph.constants]) + written


def shape_only_inputs(graph: Graph) -> set[str]:
    """Inputs that every use takes for their shape alone (SHAPE_ONLY_ARGUMENTS), never a graph output."""
    read: set[str] = {r.ref for r in graph.outputs}
    shaped: set[str] = set()
    for node in graph.nodes:
        positions = SHAPE_ONLY_ARGUMENTS.get(node.target.split(".")[1], ())
        for i, arg in enumerate(node.args):
            (shaped if i in positions else read).update(r.ref for r in refs_in(arg))
        for value in node.kwargs.values():
            read.update(r.ref for r in refs_in(value))
    return {spec.name for spec in graph.inputs if spec.name in shaped - read}


def _reach(spec: TensorSpec) -> int:
    """The bytes a tensor's strides reach: its elements, or fewer where it is broadcast."""
    return min(math.prod(spec.shape), storage_numel(spec.shape, spec.strides())) * ITEMSIZES[spec.dtype]


def _viewed_bytes(graph: Graph, layouts: dict[ValueKey, TensorSpec]) -> dict[str, int]:
    """For each value read only through views (the slices of a concatenated buffer that a case
    reads): the bytes those views reach, at most the value's own."""
    readers: dict[str, list[Node]] = {}
    for node in graph.nodes:
        for name in dict.fromkeys(r.ref for r in node_refs(node)):
            readers.setdefault(name, []).append(node)
    graph_outputs = {r.ref for r in graph.outputs}

    def reached(name: str) -> int:
        whole = _reach(layouts[(name, None)])
        users = readers.get(name, [])
        if name in graph_outputs or not users or any(_op(user) not in VIEWS for user in users):
            return whole
        return min(whole, sum(reached(user.name) for user in users))

    return {spec.name: reached(spec.name) for spec in graph.inputs if spec.name in readers}


def _nbytes(spec: TensorSpec) -> int:
    return math.prod(spec.shape) * ITEMSIZES[spec.dtype]


def _gathered_bytes(graph: Graph, layouts: dict[ValueKey, TensorSpec]) -> dict[str, int]:
    """For each value read only as the table of gathers: the bytes those gathers return."""
    gathered: dict[str, int] = {}
    other_use: set[str] = {r.ref for r in graph.outputs}
    for node in graph.nodes:
        refs = node_refs(node)
        table = node.args[0] if node.target.split(".")[1] in GATHERS and node.args else None
        for ref in refs:
            if ref is table:
                gathered[ref.ref] = gathered.get(ref.ref, 0) + _nbytes(layouts[(node.name, None)])
            else:
                other_use.add(ref.ref)
    return {name: count for name, count in gathered.items() if name not in other_use}


def case_stem(case: Case, layouts: dict[ValueKey, TensorSpec]) -> str:
    """`<source>_<fw|bw>_<ops>_<shape>_<dtype>`: the case's ATen ops as fusewire names kernels
    (program order, views left out, at most four), and the largest tensor it reads or writes
    ("llama_bw_mul_sum_4x1024x1024_bf16")."""
    ops = "whole" if case.group == "whole" else dominant_ops(case.graph)
    tensors = [*case.graph.inputs, *(layouts[(r.ref, r.index)] for r in case.graph.outputs)]
    largest = max(tensors, key=lambda spec: math.prod(spec.shape))
    shape = "x".join(str(s) for s in largest.shape) or "scalar"
    return f"{case.source}_{case.graph_name[:2]}_{ops}_{shape}_{SHORT_DTYPES.get(largest.dtype, largest.dtype)}"


def dominant_ops(graph: Graph) -> str:
    """The graph's ATen ops in program order without views ("to_copy_mul_sum"), at most four."""
    from compiler.scheduler import NAME_OPS, VIEW_OPS

    ops: list[str] = []
    for node in graph.nodes:
        op = node.target.split(".")[1]
        if op not in VIEW_OPS and op.strip("_") not in ops:
            ops.append(op.strip("_"))
    return "_".join(ops[:NAME_OPS]) or "copy"


# ---------------------------------------------------------------------------------
# value ranges of inputs
# ---------------------------------------------------------------------------------


def _dim_size(layouts: dict[ValueKey, TensorSpec], ref: Any, dim: Any) -> int | None:
    if not isinstance(ref, Ref) or not isinstance(dim, int):
        return None
    shape = layouts[(ref.ref, ref.index)].shape
    return shape[dim] if -len(shape) <= dim < len(shape) else None


def _class_dim(layouts: dict[ValueKey, TensorSpec], ref: Any) -> int | None:
    """The class count of a loss's input: dim 1, or dim 0 of a single sample."""
    if not isinstance(ref, Ref):
        return None
    shape = layouts[(ref.ref, ref.index)].shape
    return shape[1] if len(shape) >= 2 else (shape[0] if shape else None)


def index_bounds(node: Node, layouts: dict[ValueKey, TensorSpec]) -> list[tuple[Any, int]]:
    """(index argument, exclusive bound) pairs of one node; empty for ops that index nothing."""
    op, args = node.target.split(".")[1], node.args
    arg = lambda i: args[i] if len(args) > i else None  # noqa: E731
    if op == "embedding":
        return [(arg(1), _dim_size(layouts, arg(0), 0))]
    if op in ("nll_loss_forward", "nll_loss2d_forward"):
        return [(arg(1), _class_dim(layouts, arg(0)))]
    if op in ("nll_loss_backward", "nll_loss2d_backward"):
        return [(arg(2), _class_dim(layouts, arg(1)))]
    if op in ("gather", "index_select", "scatter", "scatter_add", "scatter_reduce", "index_add", "index_copy"):
        return [(arg(2), _dim_size(layouts, arg(0), arg(1)))]
    if op in ("index", "_unsafe_index", "index_put", "_unsafe_index_put") and isinstance(arg(1), list):
        return [(index, _dim_size(layouts, arg(0), i)) for i, index in enumerate(arg(1)) if index is not None]
    if op == "embedding_dense_backward":
        return [(arg(1), arg(2) if isinstance(arg(2), int) else None)]
    return []


POSITIVE_OPS = frozenset({"sqrt", "rsqrt", "log", "log2", "log10"})


def needs_positive(node: Node) -> Any:
    """The argument that must be positive for `node` to give a number, or None."""
    op = node.target.split(".")[1]
    if op in POSITIVE_OPS:
        return node.args[0] if node.args else None
    if node.target.startswith("aten.pow.Tensor_") and len(node.args) > 1:
        exponent = node.args[1]
        return node.args[0] if not (isinstance(exponent, (int, float)) and float(exponent).is_integer()) else None
    return None


def input_dependencies(graph: Graph) -> dict[str, set[str]]:
    """For every value name, the graph inputs it is computed from."""
    found: dict[str, set[str]] = {spec.name: {spec.name} for spec in graph.inputs}
    for node in graph.nodes:
        found[node.name] = set().union(*[found.get(r.ref, set()) for r in node_refs(node)])
    return found


def input_ranges(graph: Graph, layouts: dict[ValueKey, TensorSpec]) -> dict[str, tuple[float, float]]:
    """Value ranges [low, high) for the inputs that need them (see the module docstring)."""
    depends = input_dependencies(graph)
    dtypes = {spec.name: spec.dtype for spec in graph.inputs}
    ranges: dict[str, tuple[float, float]] = {}
    for node in graph.nodes:
        for index, bound in index_bounds(node, layouts):
            for ref in (r for r in refs_in(index) if bound):
                for name in depends.get(ref.ref, ()):
                    if dtypes[name] not in ("bool",) and not dtypes[name].startswith(("float", "bfloat")):
                        ranges[name] = (0, min(bound, ranges.get(name, (0, bound))[1]))
        positive = needs_positive(node)
        for ref in refs_in(positive):
            for name in depends.get(ref.ref, ()):
                if dtypes[name].startswith(("float", "bfloat")):
                    ranges[name] = POSITIVE_RANGE
    return ranges
