"""Stage 2: wire graph -> loop-level IR (`Program`).

Each wire node is lowered by the first of these that applies:
1. a handwritten lowering registered in `registry.LOWERINGS` (pointwise math, views,
   reductions, softmax, layer_norm, ...);
2. PyTorch's decomposition of the op (`torch._decomp`), traced into ATen ops that are
   lowered in turn;
3. an Extern node: the ATen op runs as is at run time. An op is never a compile failure
   for lack of a lowering. A convolution's bias (and its gradient) is lowered apart from the
   ATen call (lowering/convolution_bias.py).
In-place ops (`add_`, `copy_`, ...) lower their functional twin and store the result
into the mutated tensor. A graph constant is a read-only buffer the artifact carries; a
0-d constant is folded into the kernels that read it. Every top-level node's output is
realized into a buffer (the scheduler fuses them later), in eager's layout or, where nobody
outside sees it, in the order its loads walk (lowering/layout_choice.py); values inside a
decomposition stay lazy when used once, except a cat stored by piece (lowering/concatenation.py),
realized wherever it is produced. A masked piece (a cat's input, a pad's inside) is read
with its index known to lie in the piece (lowering/masked_pieces.py).
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import torch

from compiler.bounds import LimitExceeded, WorkLimits, check_tensor
from compiler.fx_import import ConversionError, constant_tensor, from_arg, from_fx, resolve_op
from compiler.gc_pause import paused_gc
from compiler.graph import ConstantSpec, DeviceArg, Graph, Ref, refs_in
from compiler.ir import Buffer, GraphOutput, Layout, Program, Store
from compiler.lowering import contractions, convolution_bias, registry
from compiler.lowering.composite import outer_product
from compiler.lowering.concatenation import Concatenation, cat_pieces, cats_materialized
from compiler.lowering.context import LoweringContext, LoweringError, dense_layout
from compiler.lowering.extern_layouts import device_layouts
from compiler.lowering.layout_choice import follows_loads, layout_free_nodes, may_walk_otherwise, strides_differ
from compiler.lowering.memo import signature
from compiler.lowering.padding import MATMUL_OPS, matmul_operands, pad_matmul, padded_layout, viewed_by_outputs
from compiler.lowering.values import Lazy, StorageView, TensorValue, compute_dtype

# The modules below fill registry.LOWERINGS when imported.
from compiler.lowering import pointwise, reductions, shapes, composite, indexing, pooling, random, scans  # noqa: F401,E402

__all__ = ["lower", "LoweringError"]

_MAX_DECOMPOSITION_DEPTH = 6
_TRACING_LOCK = threading.Lock()


@paused_gc
def lower(graph: Graph, limits: WorkLimits | None = None, eager_random: bool = True) -> Program:
    """Lowers a validated wire graph to a Program of ComputeNodes and ExternNodes; raises
    LimitExceeded at the first op whose output is over `limits` (compiler/bounds.py).
    `eager_random`: random ops stay ATen calls (else drawn in kernels: lowering/random.py)."""
    program = Program(inputs=[], nodes=[], outputs=[], buffers={})
    ctx = LoweringContext(program, limits=limits or WorkLimits(), eager_random=eager_random)
    ctx.graph_outputs = viewed_by_outputs(graph)
    padded = matmul_operands(graph, ctx.graph_outputs)
    ctx.layout_free = layout_free_nodes(graph, ctx.graph_outputs) - set(padded)
    ctx.materialized_cats = cats_materialized(graph, ctx.graph_outputs)
    ctx.cat_pieces = cat_pieces(graph)
    ctx.contractions = contractions.contraction_sums(graph, _count_users(graph))
    ctx.writes_in_place = any(_mutated_arguments(resolve_op(node.target)) for node in graph.nodes)
    env: dict[str, Any] = {}
    for i, spec in enumerate(graph.inputs):
        layout = Layout(tuple(spec.shape), tuple(spec.strides()), 0, spec.dtype)
        buffer = Buffer(f"arg{i}", layout, "input")
        program.inputs.append(buffer)
        program.buffers[buffer.name] = buffer
        env[spec.name] = StorageView(buffer, layout)
    for i, spec in enumerate(graph.constants):
        env[spec.name] = _lower_constant(ctx, spec, i)
    _lower_nodes(ctx, graph, env, depth=0, padded=padded)
    ctx.finish_seeds()
    for i, ref in enumerate(graph.outputs):
        value = _resolve_ref(ref, env)
        ctx.origin = f"outputs[{i}]"
        if not isinstance(value, TensorValue):
            raise ctx.fail(f"'{ref.ref}' is {value!r} here, not a tensor; graph outputs are tensors")
        view = ctx.realize(value)
        if view.buffer.kind == "constant":  # callers may write to outputs: never hand out the shared constant
            view = ctx.realize(Lazy(view.size, view.dtype, view.load))
        program.outputs.append(GraphOutput(view.buffer, view.layout))
    return program


def _lower_constant(ctx: LoweringContext, spec: ConstantSpec, position: int) -> TensorValue:
    """A 0-d constant becomes its value in the kernels; any other, a read-only buffer."""
    if not spec.shape:
        value = constant_tensor(spec).tolist()  # a plain Python number: no tensor op a fake mode could see
        dtype = compute_dtype(spec.dtype)
        return Lazy((), spec.dtype, lambda ops, index: ops.constant(value, dtype))
    layout = Layout(tuple(spec.shape), tuple(spec.strides()), 0, spec.dtype)
    buffer = Buffer(f"const{position}", layout, "constant")
    ctx.program.buffers[buffer.name] = buffer
    ctx.program.constants[buffer.name] = position
    return StorageView(buffer, layout)


def _resolve_ref(ref: Ref, env: dict[str, Any]) -> Any:
    value = env[ref.ref]
    return value if ref.index is None else value[ref.index]


def _lower_nodes(ctx: LoweringContext, graph: Graph, env: dict[str, Any], depth: int,
                 padded: dict[str, list[int]] | None = None) -> None:
    """`padded`: nodes whose results may get padded row strides, with the last sizes their
    reshapes ask for (lowering.padding.matmul_operands)."""
    users = _count_users(graph)
    for node in graph.nodes:
        args = [_wire_arg(a, env) for a in node.args]
        kwargs = {k: _wire_arg(v, env) for k, v in node.kwargs.items()}
        eager_args = None
        if depth == 0:
            ctx.origin = node.name
            ctx.program.origin_ops[node.name] = node.target.split(".")[1]
            if _reads_any(node, ctx.eager_metas):
                eager_args = ([_eager_arg(ctx, a, env) for a in node.args],
                              {k: _eager_arg(ctx, v, env) for k, v in node.kwargs.items()})
        try:
            result = _contraction(ctx, node, args, kwargs, env) if depth == 0 and node.name in ctx.contractions else None
            if result is None:
                result = lower_call(ctx, node.target, args, kwargs, depth, eager_args)
        except (LoweringError, ConversionError, LimitExceeded):
            raise
        except Exception as exc:  # a lowering bug must name the node, not crash anonymously
            raise LoweringError(f"node '{ctx.origin}' ({node.target}): {type(exc).__name__}: {exc}") from exc
        choose_layout = depth == 0 and node.name in ctx.layout_free and may_walk_otherwise([*args, *kwargs.values()])
        env[node.name] = _finish(ctx, result, realize_all=depth == 0 or users.get(node.name, 0) > 1,
                                 pad=(padded or {}).get(node.name), choose_layout=choose_layout)
        if eager_args is not None or choose_layout:
            _note_eager_metas(ctx, node.name, env[node.name], every_buffer=eager_args is not None)
        first = node.args[0] if node.args else None
        if isinstance(first, Ref) and first.index is None and torch.Tag.inplace_view in resolve_op(node.target).tags:
            env[first.ref] = env[node.name]  # x.squeeze_() changed x itself: later reads of x see the new view


def _contraction(ctx: LoweringContext, node: Any, args: list, kwargs: dict, env: dict[str, Any]) -> Any:
    """A sum over a product as a batched matmul (lowering/contractions.py), or None."""
    ctx.out_meta = _meta_outputs(ctx, resolve_op(node.target), args, kwargs)
    out_meta = ctx.out_meta
    a, b = (_wire_arg(x, env) for x in ctx.contractions[node.name].args[:2])
    dims = args[1] if len(args) > 1 else kwargs.get("dim")
    result = contractions.as_matmul(a, b, dims, ctx.out_size, ctx.out_dtype,
                                    lambda target, call_args: lower_call(ctx, target, call_args, {}, 1))
    ctx.out_meta = out_meta  # the bmm's lowering set its own; _finish reads the sum's
    return result


def _count_users(graph: Graph) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in graph.nodes:
        _count_refs(node.args, counts)
        _count_refs(list(node.kwargs.values()), counts)
    _count_refs(graph.outputs, counts)
    return counts


def _count_refs(value: Any, counts: dict[str, int]) -> None:
    for name in refs_in(value):
        counts[name] = counts.get(name, 0) + 1


def _reads_any(node: Any, names: dict[str, Any]) -> bool:
    return any(name in names for name in refs_in([*node.args, *node.kwargs.values()]))


def _eager_arg(ctx: LoweringContext, value: Any, env: dict[str, Any]) -> Any:
    """A wire argument as eager sees it: meta tensors with eager's strides where our buffer lies otherwise."""
    if isinstance(value, Ref) and value.ref in ctx.eager_metas:
        meta = ctx.eager_metas[value.ref]
        return meta if value.index is None else meta[value.index]
    if isinstance(value, list):
        return [_eager_arg(ctx, v, env) for v in value]
    return to_meta(_wire_arg(value, env))


def _note_eager_metas(ctx: LoweringContext, name: str, value: Any, every_buffer: bool) -> None:
    """Keeps eager's meta tensors for node `name` when its result lies otherwise than they say:
    later nodes then see eager's strides (layout_choice.py). Where the node read no such result, only
    buffers laid out by their loads count: an extern result's device layout, or a bias added to it in
    that layout, is one eager gives too."""
    values = list(value) if isinstance(value, tuple) else [value]
    metas = ctx.out_meta
    if not any(isinstance(v, StorageView) and isinstance(m, torch.Tensor) and strides_differ(v.layout, m.stride())
               and (every_buffer or v.buffer.name in ctx.laid_out_by_loads) for v, m in zip(values, metas)):
        return
    ctx.eager_metas[name] = tuple(metas) if isinstance(value, tuple) else metas[0]


def _finish(ctx: LoweringContext, result: Any, realize_all: bool, pad: list[int] | None = None,
            choose_layout: bool = False) -> Any:
    """Realizes lazy results (with the layout eager would give, or the one their loads walk where
    `choose_layout`: layout_choice.py) when the caller asks for it; with padded rows when `pad` (the
    last sizes the result's reshapes ask for) keeps rows whole."""
    if isinstance(result, (list, tuple)):
        return tuple(_finish_one(ctx, r, m, realize_all, choose_layout=choose_layout)
                     for r, m in zip(result, ctx.out_meta))
    return _finish_one(ctx, result, ctx.out_meta[0] if ctx.out_meta else None, realize_all, pad, choose_layout)


def _finish_one(ctx: LoweringContext, value: Any, meta: torch.Tensor | None, realize_all: bool,
                pad: list[int] | None = None, choose_layout: bool = False) -> Any:
    if isinstance(value, TensorValue) and meta is not None and value.dtype != str(meta.dtype).removeprefix("torch."):
        value = Lazy(value.size, str(meta.dtype).removeprefix("torch."), value.load)  # e.g. a bf16 sum kept in fp32
    if isinstance(value, Concatenation) and value.by_piece:  # stored wherever produced (concatenation.py)
        realize_all = True
    if isinstance(value, Lazy) and realize_all:
        if meta is None or tuple(meta.shape) != value.size:
            return ctx.realize(value)
        layout = dense_layout(meta)
        chosen = follows_loads(value, layout) if choose_layout else None
        if chosen is not None:
            realized = ctx.realize(value, chosen)
            ctx.laid_out_by_loads.add(realized.buffer.name)
            return realized
        keeps_rows = pad is not None and value.size and all(last == value.size[-1] for last in pad)
        return ctx.realize(value, padded_layout(layout) if keeps_rows else layout)
    return value


def _wire_arg(value: Any, env: dict[str, Any]) -> Any:
    if isinstance(value, Ref):
        return _resolve_ref(value, env)
    if isinstance(value, list):
        return [_wire_arg(v, env) for v in value]
    if isinstance(value, DeviceArg):
        return torch.device("meta")
    return from_arg(value, env, torch.device("meta"))


# ---------------------------------------------------------------------------------
# One op call: lowering, decomposition, or extern
# ---------------------------------------------------------------------------------


# Dtypes kernels compute in; an op that reads or makes tensors of any other (complex, uint64...)
# runs as an ATen call.
_KERNEL_DTYPES = frozenset({"float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8",
                            "uint8", "bool"})


def lower_call(ctx: LoweringContext, target: str, args: list, kwargs: dict, depth: int = 0,
               eager_args: tuple[list, dict] | None = None) -> Any:
    """`eager_args`: the arguments as meta tensors with eager's strides, where some buffer lies
    otherwise (layout_choice.py); the op's meta outputs come from them."""
    op = resolve_op(target)
    ctx.out_meta = _meta_outputs(ctx, op, *(eager_args or (args, kwargs)))
    if torch.Tag.inplace_view in op.tags:
        return _lower_inplace_view(ctx, target, args, kwargs, depth)
    mutated_index = _mutated_argument(op)
    if mutated_index is not None:
        return _lower_inplace(ctx, op, target, args, kwargs, mutated_index, depth)
    if not ctx.eager_random and target in registry.RANDOM_LOWERINGS and ctx.out_meta \
            and not _touches_extern_dtypes(ctx, args, kwargs):
        try:
            return registry.RANDOM_LOWERINGS[target](ctx, *args, **kwargs)
        except NotImplementedError:
            return _extern(ctx, target, args, kwargs)
    if not kwargs and ctx.out_meta and (product := outer_product(ctx, target, args)) is not None:
        return product
    if target in convolution_bias.TARGETS and ctx.out_meta and not _touches_extern_dtypes(ctx, args, kwargs):
        out_meta = ctx.out_meta
        peeled = convolution_bias.peel_bias(target, args, kwargs, lambda t, a: lower_call(ctx, t, a, {}, depth + 1),
                                            ctx.realize)
        ctx.out_meta = out_meta  # the calls above set their own; the caller reads this op's
        if peeled is not None:
            return peeled
    if registry.always_extern(op) or not ctx.out_meta or _touches_extern_dtypes(ctx, args, kwargs) \
            or registry.long_scan(target, args, kwargs, ctx.out_meta):
        return _extern(ctx, target, args, kwargs)
    if target in registry.LOWERINGS:
        try:
            return registry.LOWERINGS[target](ctx, *args, **kwargs)
        except NotImplementedError:
            pass  # the lowering does not cover these arguments: decompose or run as extern
    if depth < _MAX_DECOMPOSITION_DEPTH:
        decomposed = _try_decomposition(ctx, op, target, args, kwargs, depth)
        if decomposed is not None:
            return decomposed
    return _extern(ctx, target, args, kwargs)


def _meta_outputs(ctx: LoweringContext, op: Any, args: list, kwargs: dict) -> list[torch.Tensor | None]:
    """The op's outputs on meta tensors, flattened; None where an optional output is not asked for
    (e.g. native_layer_norm_backward's weight gradient when output_mask says False)."""
    if not op._schema.returns:  # a check such as _linalg_check_errors: an ATen call for its side effect
        return []
    key = signature(op, args, kwargs)
    if key is not None and ("meta", key) in ctx.memo:
        out = ctx.memo["meta", key]
    else:
        meta_args = [to_meta(a) for a in args]
        meta_kwargs = {k: to_meta(v) for k, v in kwargs.items()}
        try:
            out = op(*meta_args, **meta_kwargs)
        except Exception as exc:
            raise ctx.fail(f"{op} rejects these arguments: {exc}") from None
        if key is not None:
            ctx.memo["meta", key] = out
    flat = flatten_outputs(out)
    for tensor in flat:
        if isinstance(tensor, torch.Tensor):
            check_tensor(tensor.shape, f"node '{ctx.origin}': the output of {op}", ctx.limits)
    # A plain number from a meta kernel depends on shapes only (meta tensors hold no data), as
    # flash attention's max_q does: it is a static value. A symbolic one is data-dependent.
    if not all(isinstance(t, (torch.Tensor, bool, int, float)) or t is None for t in flat) or \
            not any(isinstance(t, torch.Tensor) for t in flat):
        raise ctx.fail(f"{op} returns a non-tensor ({type(out).__name__}); data-dependent values are not supported in wire format v1")
    return flat


def _touches_extern_dtypes(ctx: LoweringContext, args: list, kwargs: dict) -> bool:
    tensors, _ = _split_tensors(args, kwargs)
    dtypes = {t.dtype for t in tensors} | {str(m.dtype).removeprefix("torch.") for m in ctx.out_meta
                                           if isinstance(m, torch.Tensor)}
    return not dtypes <= _KERNEL_DTYPES


def flatten_outputs(out: Any) -> list[Any]:
    return [out] if isinstance(out, torch.Tensor) else list(out) if isinstance(out, (list, tuple)) else [out]


def to_meta(value: Any) -> Any:
    if isinstance(value, TensorValue):
        dtype = getattr(torch, value.dtype)
        if isinstance(value, StorageView):
            return torch.empty_strided(value.size, value.layout.stride, dtype=dtype, device="meta")
        return torch.empty(value.size, dtype=dtype, device="meta")
    if isinstance(value, (list, tuple)):
        return [to_meta(v) for v in value]
    return value


def _mutated_argument(op: Any) -> int | None:
    found = _mutated_arguments(op)
    return found[0] if found else None


def _mutated_arguments(op: Any) -> list[int]:
    """Positions of the positional arguments the op writes into (`Tensor(a!)` in its schema)."""
    return [i for i, argument in enumerate(op._schema.arguments)
            if argument.alias_info is not None and argument.alias_info.is_write and not argument.kwarg_only]


def _lower_inplace(ctx: LoweringContext, op: Any, target: str, args: list, kwargs: dict, index: int, depth: int) -> Any:
    """`x.add_(y)`: lower `add(x, y)`, then store the result into x's storage. An op with no functional
    twin (`prims.copy_to`, `_native_batch_norm_legit` updating running statistics) runs as an ATen call
    that writes into every tensor its schema marks as written."""
    functional = functional_twin(target) or target
    written = [args[i] for i in _mutated_arguments(op) if i < len(args) and args[i] is not None]
    for destination in written:
        if not isinstance(destination, StorageView):
            raise ctx.fail(f"{target} writes into a tensor that is not a view of a buffer")
        if destination.buffer.kind == "constant":
            raise ctx.fail(f"{target} writes into a graph constant; constants are read-only (clone it first)")
    if functional == target or len(written) > 1 or registry.always_extern(op) or _touches_extern_dtypes(ctx, args, kwargs):
        return _extern(ctx, target, args, kwargs, mutated=written)
    destination = args[index]
    meta = ctx.out_meta
    value = lower_call(ctx, functional, args, kwargs, depth)
    ctx.out_meta = meta
    value = value[0] if isinstance(value, (list, tuple)) else value
    ctx.store(value, Store(destination.buffer, destination.layout))
    return destination


def _lower_inplace_view(ctx: LoweringContext, target: str, args: list, kwargs: dict, depth: int) -> Any:
    """`x.squeeze_(0)`, `x.t_()`, `x.resize_(n)`: x's sizes and strides change, its data does not. The
    result is the view the functional twin makes (`_lower_nodes` rebinds x's name to it, as eager
    changes x itself). resize_ is a contiguous view of x's storage when the storage holds it, and is
    refused otherwise: compiled code never grows a storage, so it never writes past one."""
    name = target.split(".")[1]
    if name in ("resize_", "resize_as_"):
        return _resize_view(ctx, target, args[0])
    functional = functional_twin(target)
    if functional is None:
        raise ctx.fail(f"{target} changes a tensor's shape in place and has no functional twin to lower")
    return lower_call(ctx, functional, args, kwargs, depth)


def functional_twin(target: str) -> str | None:
    """The out-of-place overload an in-place op mirrors: the overload of `name` without the trailing
    `_` whose arguments have the same types (`pow_.Scalar` -> `pow.Tensor_Scalar`, `transpose_.default`
    -> `transpose.int`); None if there is none."""
    namespace, name, overload = target.split(".")
    if not name.endswith("_") or name.endswith("__"):
        return None
    packet = getattr(getattr(torch.ops, namespace), name[:-1], None)
    if packet is None:
        return None
    want = [str(a.type) for a in resolve_op(target)._schema.arguments]
    names = [overload] + [o for o in packet.overloads() if o != overload]
    for candidate in names:
        schema = getattr(packet, candidate, None)
        if schema is not None and [str(a.type) for a in schema._schema.arguments] == want:
            return f"{namespace}.{name[:-1]}.{candidate}"
    return None


def _resize_view(ctx: LoweringContext, target: str, x: Any) -> StorageView:
    size = ctx.out_size
    layout = Layout.contiguous(size, x.dtype)
    if isinstance(x, StorageView):
        layout = Layout(layout.size, layout.stride, x.layout.offset, x.dtype)
        if layout.storage_numel() <= x.buffer.layout.storage_numel():
            return StorageView(x.buffer, layout)
    raise ctx.fail(f"{target} to {list(size)} needs more storage than the tensor has; compiled graphs never "
                   "grow a tensor's storage")


def _extern(ctx: LoweringContext, target: str, args: list, kwargs: dict, mutated: Sequence[StorageView] = ()) -> Any:
    sliced = None
    matrices = MATMUL_OPS.get(target.split(".")[1], ())
    if matrices and all(isinstance(args[i], TensorValue) for i in matrices):
        args, sliced = pad_matmul(ctx, target, args)
    tensor_meta = device_layouts(target, args, [m if isinstance(m, torch.Tensor) else None for m in ctx.out_meta])
    if sliced is not None:  # the product of zero-padded operands: computed whole, read as its corner
        return _padded_product(ctx, target, args, kwargs, tensor_meta[0], sliced)
    made = iter(ctx.extern(target, args, kwargs, tensor_meta, mutated))
    if mutated and _returns_its_input(target):
        return mutated[0]
    # None stays None (an output not asked for); a number stays the static value meta gave
    outputs = [next(made) if isinstance(meta, torch.Tensor) else meta for meta in ctx.out_meta]
    single = len(outputs) == 1 and not _returns_list(target)
    return outputs[0] if single else tuple(outputs)


def _padded_product(ctx: LoweringContext, target: str, args: list, kwargs: dict, meta: torch.Tensor,
                    corner: tuple[int, int]) -> TensorValue:
    """The product of zero-padded operands, read as its corner; copied densely when it is a graph output
    (the caller gets eager's strides), else a view of the padded buffer."""
    first, second = MATMUL_OPS[target.split(".")[1]]
    size = (*args[first].size[:-1], args[second].size[-1])
    (whole,) = ctx.extern(target, args, kwargs, [torch.empty(size, dtype=meta.dtype, device="meta")])
    layout = whole.layout
    view = StorageView(whole.buffer, Layout((*size[:-2], *corner), layout.stride, layout.offset, layout.dtype))
    if ctx.origin in ctx.graph_outputs:
        return Lazy(view.size, view.dtype, view.load)
    return view


def _returns_its_input(target: str) -> bool:
    """`x.add_(y)` returns x (`-> Tensor(a!)`); `_native_batch_norm_legit` writes its running statistics
    and returns new tensors."""
    returns = resolve_op(target)._schema.returns
    return bool(returns) and returns[0].alias_info is not None and returns[0].alias_info.is_write


def _returns_list(target: str) -> bool:
    returns = resolve_op(target)._schema.returns
    return len(returns) != 1 or str(returns[0].type).startswith("List")


def _try_decomposition(ctx: LoweringContext, op: Any, target: str, args: list, kwargs: dict, depth: int) -> Any:
    key = signature(op, args, kwargs)
    if key is not None and ("decomposition", key) in ctx.memo:
        traced = ctx.memo["decomposition", key]
    else:
        traced = _traced_decomposition(ctx, op, target, args, kwargs)
        if key is not None:
            ctx.memo["decomposition", key] = traced
    if traced is None:
        return None
    subgraph, present = traced
    tensors, _ = _split_tensors(args, kwargs)
    meta = ctx.out_meta
    sub_env = {spec.name: t for spec, t in zip(subgraph.inputs, tensors)}
    sub_env.update({spec.name: _lower_constant(ctx, spec, -1) for spec in subgraph.constants})
    _lower_nodes(ctx, subgraph, sub_env, depth + 1)
    ctx.out_meta = meta
    found = iter(_resolve_ref(ref, sub_env) for ref in subgraph.outputs)
    results = [next(found) if is_tensor else None for is_tensor in present]
    is_single = len(meta) == 1 and not _returns_list(target)
    return results[0] if is_single else tuple(results)


def _traced_decomposition(ctx: LoweringContext, op: Any, target: str, args: list,
                          kwargs: dict) -> tuple[Graph, list[bool]] | None:
    """The op's decomposition traced into a wire graph over its tensor arguments, with which of
    its outputs are tensors (not None); None when it has none usable."""
    decomposition = registry.decomposition_for(op)
    if decomposition is None:
        return None
    tensors, rebuild = _split_tensors(args, kwargs)
    metas = [to_meta(t) for t in tensors]
    present: list[bool] = []  # per output: False where the decomposition returns None

    def tensor_outputs(*ts: Any) -> list:
        flat = flatten_outputs(decomposition(*rebuild(ts)[0], **rebuild(ts)[1]))
        present[:] = [t is not None for t in flat]
        return [t for t in flat if t is not None]

    try:
        from torch.fx.experimental.proxy_tensor import make_fx

        with _TRACING_LOCK:  # make_fx's dispatch modes are process-global: one trace at a time
            traced = make_fx(tensor_outputs, decomposition_table=registry.decomposition_table())(*metas)
        subgraph = from_fx(_as_wire_traceable(traced), metas)
    except Exception:
        return None  # not traceable into wire ATen ops (constants, non-tensor outputs): run it as extern
    if any(n.target == target for n in subgraph.nodes) or len(present) != len(ctx.out_meta):
        return None
    if not _matches_meta(traced, [m for m in ctx.out_meta if isinstance(m, torch.Tensor)]):
        return None
    if any(c.shape for c in subgraph.constants):  # only the top-level graph's constants travel in the artifact
        return None
    return subgraph, present


def _matches_meta(traced: torch.fx.GraphModule, expected: list[torch.Tensor]) -> bool:
    """Whether a decomposition's outputs have the op's shapes and dtypes. Some of PyTorch's do not
    (the CPU flash attention one returns attention weights where the op returns a logsumexp):
    such a decomposition is not used."""
    output = traced.graph.find_nodes(op="output")[0]
    found = [node.meta.get("val") if isinstance(node, torch.fx.Node) else None for node in output.args[0]]
    return len(found) == len(expected) and all(
        isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype == want.dtype
        for got, want in zip(found, expected))


def _as_wire_traceable(traced: Any) -> Any:
    """Drops what tracing a decomposition on meta tensors leaves behind that wire graphs cannot
    hold: dead nodes (e.g. the namedtuple an out_wrapper builds) and `device=meta` arguments
    (lowering ignores devices: kernels run where their inputs are)."""
    traced.graph.eliminate_dead_code()
    for node in traced.graph.nodes:
        if isinstance(node.kwargs.get("device"), torch.device) and node.kwargs["device"].type == "meta":
            node.kwargs = {**node.kwargs, "device": torch.device("cpu")}
    return traced


def _split_tensors(args: list, kwargs: dict) -> tuple[list[TensorValue], Any]:
    """Pulls tensors out of (args, kwargs) and returns a function that puts replacements back."""
    tensors: list[TensorValue] = []
    template = ([_pull(a, tensors) for a in args], {k: _pull(v, tensors) for k, v in kwargs.items()})

    def rebuild(replacements: Sequence[Any]) -> tuple[list, dict]:
        return [_push(a, replacements) for a in template[0]], {k: _push(v, replacements) for k, v in template[1].items()}

    return tensors, rebuild


def _pull(value: Any, tensors: list[TensorValue]) -> Any:
    if isinstance(value, TensorValue):
        tensors.append(value)
        return ("__tensor__", len(tensors) - 1)
    if isinstance(value, (list, tuple)):
        return [_pull(v, tensors) for v in value]
    return value


def _push(value: Any, replacements: Sequence[Any]) -> Any:
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "__tensor__":
        return replacements[value[1]]
    if isinstance(value, list):
        return [_push(v, replacements) for v in value]
    return value
