"""Linears that read the same input become one GEMM: a rewrite of dynamo's graph before aot_autograd
traces it, and the partition hint that keeps the concatenated weights out of the saved tensors.

A transformer block projects one activation three times (query, key, value) and a gated MLP twice
(gate, up). As separate linears that is, per block and step, three GEMMs in the forward and six in the
backward (each projection's input and weight gradient), plus the kernel that sums the three input
gradients. As one linear over the concatenated weights (`torch.cat([Wq, Wk, Wv])`, then a split of the
result) it is one GEMM in the forward and two in the backward: the split's gradient is one
concatenated output gradient, its product with the concatenated weights sums the three input
gradients inside the GEMM (in fp32, where the three separate bf16 results were rounded before their
sum), and the weight gradients are row blocks of one GEMM's result. Each GEMM launch costs tens of
microseconds of host time (cuBLAS's set-up), and the host issues a transformer's step slower than
the GPU runs it, so fewer GEMMs is a shorter step; one wide GEMM also fills the GPU better than three
narrow ones.

What is grouped: calls of `linear` that read the same input node, with weights of one dtype, device
and width (in_features), all with a bias or all without, static sizes, weights and biases made before
the first call, and no other linear and no grad-mode or autocast switch between them in the graph
(the next block's projections of the same input, as T5's cross-attention makes, stay separate:
grouping them would compute the later block's keys early and keep them alive across the block
between).

The pieces of the split are views of the grouped result, read in place: copying each into a
contiguous tensor of its own costs a kernel per piece and, in LLaMA's MLP, held the grouped result and
both copies at once (the forward's planned peak 140 -> 228 MiB). A piece is made contiguous only where
the graph could tell the difference: it is a graph output, a reader depends on strides (`as_strided`,
...), or a `view` of it, or of a view of it (a transpose, an unsqueeze, a slice...), is impossible
with the piece's strides. Readers are followed through views and through reshapes, which view where
the strides allow and copy elsewhere: Longformer reshapes its keys (a view of a contiguous projection,
a copy of a piece) and chunks the result with `as_strided` at the strides the view had. A piece that
the graph writes in place (OLMo clamps its q, k and v with `clamp_`), directly or through a view, is
cloned: autograd refuses in-place writes to a view made by `split`.

The concatenated weights are recomputed in the backward (`recompute_weight_concats`, run on the
joint graph before the min-cut partition) instead of saved: a copy of the weights costs a few
microseconds, saving it would hold a second copy of every grouped weight through the step.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
from torch.fx import Graph, GraphModule, Node
from torch.utils import _pytree as pytree

LINEARS = (torch._C._nn.linear, torch.nn.functional.linear)
# calls in dynamo's graphs that switch grad mode or autocast for the nodes after them
MODE_SWITCHES = {"_set_grad_enabled", "set_grad_enabled", "_enter_autocast", "_exit_autocast"}
# readers that return a view of their first argument: a view impossible with a piece's strides raises;
# `reshape` and its kin view where the strides allow and copy elsewhere (the module docstring's Longformer)
VIEWS = {"view", "transpose", "permute", "t", "unsqueeze", "squeeze", "expand", "unflatten", "narrow",
         "select", "getitem", "__getitem__", "split", "chunk", "unbind", "diagonal", "movedim", "swapaxes",
         "reshape", "flatten", "view_as", "reshape_as", "unfold"}
# readers whose result depends on their argument's strides, not only its values
STRIDE_SENSITIVE = {"as_strided", "as_strided_", "set_", "resize_", "resize_as_", "data_ptr", "stride",
                    "storage_offset", "untyped_storage", "is_contiguous"}
# writers into their first argument that a trailing underscore does not name (operator's and Python's)
IN_PLACE = {"setitem", "__setitem__", "iadd", "isub", "imul", "itruediv", "ifloordiv", "ipow", "iand", "ior",
            "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__ipow__", "__iand__", "__ior__"}


@dataclass
class _Linear:
    node: Node
    input: Node
    weight: Node
    bias: Node | None
    width: int  # the weight's rows: this linear's out_features

    def key(self) -> tuple:
        weight = self.weight.meta["example_value"]
        return self.input, weight.dtype, weight.device, weight.shape[1], self.bias is None


def group_linears(gm: GraphModule) -> int:
    """Rewrites each group of linears over one input (module docstring) as one linear and a split;
    returns the number of linear calls removed."""
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    removed = 0
    for group in _groups(gm.graph, order):
        _rewrite(gm.graph, group)
        removed += len(group) - 1
    if removed:
        gm.graph.lint()
        gm.recompile()
    return removed


def _groups(graph: Graph, order: dict[Node, int]) -> list[list[_Linear]]:
    """Runs of consecutive linears (in graph order) with equal keys, two or more long."""
    groups: list[list[_Linear]] = []
    run: list[_Linear] = []
    for node in graph.nodes:
        if node.op == "call_function" and getattr(node.target, "__name__", "") in MODE_SWITCHES:
            groups.append(run)  # linears on either side of a no_grad or autocast boundary stay apart
            run = []
        if not (node.op == "call_function" and node.target in LINEARS):
            continue
        linear = _as_linear(node)
        if run and (linear is None or linear.key() != run[0].key()):
            groups.append(run)
            run = []
        if linear is not None:
            run.append(linear)
    groups.append(run)
    return [g for g in groups if len(g) > 1 and _made_before(g, order)]


def _as_linear(node: Node) -> _Linear | None:
    """The call's input, weight and bias when it can be grouped: a 2-D weight, static sizes, known
    example values (dynamo's graphs carry them), no other keyword arguments."""
    args = list(node.args) + [None] * (3 - len(node.args))
    x, weight, bias = args[0], node.kwargs.get("weight", args[1]), node.kwargs.get("bias", args[2])
    if set(node.kwargs) - {"weight", "bias"} or not all(isinstance(n, Node) for n in (x, weight)):
        return None
    if bias is not None and not isinstance(bias, Node):
        return None
    values = [n.meta.get("example_value") for n in (x, weight, bias) if n is not None]
    if not all(isinstance(v, torch.Tensor) for v in values):
        return None
    if not all(isinstance(size, int) for v in values for size in v.shape):
        return None
    w = values[1]
    if w.dim() != 2 or (bias is not None and tuple(values[2].shape) != (w.shape[0],)):
        return None
    return _Linear(node, x, weight, bias, int(w.shape[0]))


def _made_before(group: list[_Linear], order: dict[Node, int]) -> bool:
    first = order[group[0].node]
    made = [g.weight for g in group] + [g.bias for g in group if g.bias is not None]
    return all(order[n] < first for n in made)


def _rewrite(graph: Graph, group: list[_Linear]) -> None:
    first = group[0]
    widths = [g.width for g in group]
    grouped = torch.empty([*first.input.meta["example_value"].shape[:-1], sum(widths)], device="meta")
    layouts = grouped.split(widths, -1)  # each piece's sizes and strides, as the graph's split makes them
    with graph.inserting_before(first.node):
        weight = graph.call_function(torch.cat, ([g.weight for g in group], 0))
        bias = graph.call_function(torch.cat, ([g.bias for g in group], 0)) if first.bias is not None else None
        result = graph.call_function(first.node.target, (first.input, weight, bias))
        pieces = graph.call_function(torch.split, (result, widths, -1))
        for i, linear in enumerate(group):
            piece = graph.call_function(operator.getitem, (pieces, i))
            if _written_in_place(linear.node):
                piece = graph.call_method("clone", (piece,), {"memory_format": torch.contiguous_format})
            elif not _strides_unobserved(linear.node, layouts[i]):
                piece = graph.call_method("contiguous", (piece,))
            linear.node.replace_all_uses_with(piece)
    for linear in group:
        graph.erase_node(linear.node)


def _strides_unobserved(node: Node, layout: torch.Tensor) -> bool:
    """Whether the graph computes the same when `node`'s result has `layout` instead of being
    contiguous: it is not a graph output, no reader depends on strides, and every view of it (VIEWS,
    followed through views of views on the meta layout) is still possible. Else its piece is made
    contiguous."""
    for user in node.users:
        name = _call_name(user)
        if user.op == "output" or name in STRIDE_SENSITIVE:
            return False
        if name in VIEWS and user.args and user.args[0] is node:
            viewed = _view_of(user, layout)
            if viewed is None or not _strides_unobserved(user, viewed):
                return False
    return True


def _written_in_place(node: Node) -> bool:
    """Whether some call writes into `node`'s result, or into a view of it (VIEWS, followed through
    views of views): an in-place method or function on it (a name ending in one underscore, IN_PLACE)
    or an `out=` argument."""
    for user in node.users:
        name = _call_name(user)
        first = bool(user.args) and user.args[0] is node
        if user.kwargs.get("out") is node:
            return True
        if first and (name in IN_PLACE or (name.endswith("_") and not name.endswith("__"))):
            return True
        if first and name in VIEWS and _written_in_place(user):
            return True
    return False


def _call_name(user: Node) -> str:
    """The method's or the function's name of a call node ("" for other nodes)."""
    return user.target if user.op == "call_method" else getattr(user.target, "__name__", "")


def _view_of(user: Node, layout: torch.Tensor) -> torch.Tensor | None:
    """`user`'s view applied to the meta `layout`; None when that view is impossible with the
    layout's strides, or when its arguments are graph values (not known here)."""
    arguments = (user.args[1:], user.kwargs)
    if any(isinstance(leaf, Node) for leaf in pytree.tree_leaves(arguments)):
        return None
    try:
        if user.op == "call_method":
            return getattr(layout, user.target)(*user.args[1:], **user.kwargs)
        return user.target(layout, *user.args[1:], **user.kwargs)
    except RuntimeError:
        return None


def recompute_weight_concats(joint: Graph) -> int:
    """Marks each concatenation of primal inputs alone (the grouped weights) to be recomputed by the
    backward, not saved by the forward; returns how many."""
    from torch.utils.checkpoint import CheckpointPolicy

    marked = 0
    for node in joint.find_nodes(op="call_function", target=torch.ops.aten.cat.default):
        tensors = node.args[0]
        if all(isinstance(t, Node) and t.op == "placeholder" and t.name.startswith("primals") for t in tensors):
            node.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
            marked += 1
    return marked
