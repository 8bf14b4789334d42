"""How the backend splits a training graph into a forward and a backward: the partitioners it hands
aot_autograd, and the rewrites of the joint graph that run before a min-cut partition so that the
forward saves fewer bytes for the backward.

    aot_autograd(fw_compiler=..., bw_compiler=..., **aot_options("min_cut"))

Rewrites (each keeps the graph's results bit for bit):
- An argument that a backward op reads only for its shape and strides (the input of
  max_pool2d_with_indices_backward, avg_pool2d_backward, _adaptive_avg_pool2d_backward) becomes an
  empty tensor of that layout made in the backward, so the forward need not save the pool's input.
- A concatenation of parameters alone (client/linear_groups.py's grouped weights) is recomputed by the
  backward, not saved.
- max_pool2d's indices (int64, a flat position in the input plane) are handed to the backward as the
  position inside the window (int8, 8x fewer bytes): the forward encodes, the backward decodes, both
  pointwise work that fuses into the pool's kernels.
- A concatenation of one tensor with itself (rotary embeddings' `cat((freqs, freqs), -1)`) becomes
  a copy of a broadcast view, which the partitioner may recompute (it never recomputes `cat`): LLaMA's
  forward then saves no rotary angles, the backward recomputes them from the positions.
- An `mm`/`bmm` whose contraction has length 1 (LLaMA's rotary `inv_freq @ positions` on some
  versions of transformers) becomes the broadcast multiply it is, recomputable for the same reason.
  The compiler lowers such a product to the same multiply either way
  (compiler/lowering/composite.py `outer_product`).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import Graph, GraphModule, Node

from client.linear_groups import recompute_weight_concats

aten = torch.ops.aten

# "min_cut" (the default): the min-cut rematerialization partitioner Inductor uses (cheap pointwise
# work recomputed in the backward instead of saved and re-read); "save_all": aot_autograd's default
# partition (the backward reads every intermediate it needs, saved by the forward). min_cut is the
# default since the H100 run of 2026-11-23 (docs/PERF.md): GPT-2's step 12.7 -> 11.1 ms and peak
# 4.8 -> 3.0 GiB, LLaMA's peak 1.7 -> 1.3 GiB, BERT's step 12.5 -> 9.2 ms.
PARTITIONERS = ("min_cut", "save_all")
# Decomposed (torch._decomp) before a min-cut partition, so the partitioner sees their pointwise
# parts and can recompute them: a cross-entropy then hands the backward its bf16 logits and two
# numbers per row instead of fp32 log-probabilities (bench/partition_bytes.py measures it).
# `transpose` becomes `permute`, a view the partitioner recomputes (it never recomputes a transpose,
# so everything computed before one, such as LLaMA's rotary angles, had to be saved).
MIN_CUT_DECOMPOSED = ("_log_softmax", "_log_softmax_backward_data", "_softmax", "_softmax_backward_data",
                      "nll_loss_forward", "nll_loss_backward", "detach", "threshold_backward", "transpose")
# op -> position of an argument whose values the op never reads (ATen's kernels and fusewire's
# lowerings both take only its sizes and strides)
SHAPE_ONLY_ARGUMENTS = {
    aten.max_pool2d_with_indices_backward.default: 1,
    aten.avg_pool2d_backward.default: 1,
    aten._adaptive_avg_pool2d_backward.default: 1,
}
MAX_OFFSET_WINDOW = 127  # window positions an int8 offset can name


def aot_options(partitioner: str) -> dict[str, Any]:
    """aot_autograd's keyword arguments for a partitioner of PARTITIONERS. Always
    keep_inference_input_mutations: in-place updates of inputs that need no gradient (BatchNorm's
    running statistics) stay in the graph and are stored by the kernel that computes them, where
    aot_autograd would otherwise copy each one back after the graph (60 copies per ResNet step)."""
    options: dict[str, Any] = {"keep_inference_input_mutations": True}
    if partitioner == "save_all":
        return {**options, "partition_fn": save_all_partition}
    from torch._decomp import get_decompositions

    table = get_decompositions([getattr(aten, name) for name in MIN_CUT_DECOMPOSED])
    return {**options, "partition_fn": min_cut_partition, "decompositions": table}


def min_cut_partition(joint: GraphModule, joint_inputs: Any, **kwargs: Any):
    """The joint graph rewritten (module docstring), then split by the min-cut partitioner."""
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    _rewrite(joint, (saved_random_draws, shape_only_arguments, max_pool_offsets, recompute_weight_concats,
                     repeated_concats, outer_products_as_multiplies))
    return min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)


def save_all_partition(joint: GraphModule, joint_inputs: Any, **kwargs: Any):
    """aot_autograd's default partition, after the one rewrite it needs (saved_random_draws)."""
    from torch._functorch.partitioners import default_partition

    _rewrite(joint, (saved_random_draws,))
    return default_partition(joint, joint_inputs, **kwargs)


def _rewrite(joint: GraphModule, rewrites: tuple) -> None:
    """Runs each rewrite on the joint graph; recompiles it if any changed something."""
    if sum(rewrite(joint.graph) for rewrite in rewrites):
        joint.graph.lint()
        joint.recompile()


# -- rewrites ---------------------------------------------------------------------------


def saved_random_draws(graph: Graph) -> int:
    """Random ops inside activation-checkpointed regions (`torch.utils.checkpoint`, transformers'
    gradient_checkpointing_enable) are saved for the backward, not recomputed; returns how many.
    Recomputed, the partitioner would wrap each in an RNG-state op (`run_and_save_rng_state` /
    `run_with_rng_state`, or generator inputs on CUDA) that no wire graph can hold, and every graph
    of a checkpointed model with dropout would fall back. Saving costs the dropout mask (one byte an
    element) where eager keeps a generator state; the values match eager's recomputation exactly."""
    from torch.utils.checkpoint import CheckpointPolicy

    recomputed = (CheckpointPolicy.MUST_RECOMPUTE, CheckpointPolicy.PREFER_RECOMPUTE)
    changed = 0
    for node in graph.nodes:
        if (node.op == "call_function" and node.meta.get("recompute") in recomputed
                and torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ())):
            for drawn in (node, *(user for user in node.users if user.target is operator.getitem)):
                drawn.meta["recompute"] = CheckpointPolicy.PREFER_SAVE  # a tuple is saved by its items
            changed += 1
    return changed


def shape_only_arguments(graph: Graph) -> int:
    """Replaces each shape-only argument (SHAPE_ONLY_ARGUMENTS) with an empty tensor of its layout,
    made where it is used; returns how many. Skipped for symbolic sizes."""
    replaced = 0
    for node in list(graph.nodes):
        position = SHAPE_ONLY_ARGUMENTS.get(node.target) if node.op == "call_function" else None
        if position is None or not isinstance(node.args[position], Node):
            continue
        value = node.args[position].meta.get("val")
        if not _static(value):
            continue
        with graph.inserting_before(node):
            empty = _call(graph, aten.empty_strided.default, tuple(value.shape), tuple(value.stride()),
                          dtype=value.dtype, device=value.device)
        node.update_arg(position, empty)
        replaced += 1
    return replaced


def max_pool_offsets(graph: Graph) -> int:
    """Hands each max_pool2d's indices to its backward as int8 offsets inside the window; returns how
    many pools changed. A pool whose indices anything else reads stays as it is."""
    changed = 0
    for pool in list(graph.nodes):
        if pool.op != "call_function" or pool.target is not aten.max_pool2d_with_indices.default:
            continue
        window = _pool_window(pool)
        indices = [user for user in pool.users if user.target is operator.getitem and user.args[1] == 1]
        if window is None or len(indices) != 1:
            continue
        index_node = indices[0]
        users = list(index_node.users)
        if not users or any(u.target is not aten.max_pool2d_with_indices_backward.default or
                            len(u.args) != 8 or u.args[7] is not index_node for u in users):
            continue
        with graph.inserting_before(index_node.next):
            offsets = _encode(graph, index_node, window)
        for user in users:
            with graph.inserting_before(user):
                user.update_arg(7, _decode(graph, offsets, window))
        changed += 1
    return changed


def repeated_concats(graph: Graph) -> int:
    """Replaces each `cat` of static sizes whose inputs are all one tensor with
    view(clone(expand(unsqueeze(x, dim)))), the same elements in the same layout; returns how many."""
    replaced = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten.cat.default or not node.args[0]:
            continue
        parts = node.args[0]
        source, result = parts[0], node.meta.get("val")
        if len(parts) < 2 or any(part is not source for part in parts) or not isinstance(source, Node):
            continue
        value = source.meta.get("val")
        if not (_static(value) and _static(result)) or value.dim() == 0:
            continue
        dim = (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % value.dim()
        with graph.inserting_before(node):
            spread = _call(graph, aten.unsqueeze.default, source, dim)
            sizes = list(spread.meta["val"].shape)
            sizes[dim] = len(parts)
            copied = _call(graph, aten.clone.default,
                           _call(graph, aten.expand.default, spread, sizes), memory_format=torch.contiguous_format)
            repeated = _call(graph, aten.view.default, copied, list(result.shape))
        if _same_layout(repeated.meta["val"], result):
            node.replace_all_uses_with(repeated)
            graph.erase_node(node)
            replaced += 1
        else:  # a cat of channels-last inputs keeps their layout; the copy would not
            for new in (repeated, copied, copied.args[0], spread):
                graph.erase_node(new)
    return replaced


def outer_products_as_multiplies(graph: Graph) -> int:
    """Replaces each `mm`/`bmm` of static sizes whose contraction has length 1 with the broadcast
    multiply of its operands; returns how many. The product of one pair rounded once is what the
    GEMM computes too. Kept as a GEMM where the multiply's layout would differ from the GEMM's
    (later views were traced against the GEMM's contiguous result)."""
    replaced = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in (aten.mm.default, aten.bmm.default):
            continue
        left, right = node.args
        values = (left.meta.get("val"), right.meta.get("val"), node.meta.get("val"))
        if not all(_static(v) for v in values) or values[0].shape[-1] != 1:
            continue
        with graph.inserting_before(node):
            product = _call(graph, aten.mul.Tensor, left, right)
        if not _same_layout(product.meta["val"], values[2]):
            graph.erase_node(product)
            continue
        node.replace_all_uses_with(product)
        graph.erase_node(node)
        replaced += 1
    return replaced


@dataclass(frozen=True)
class _Window:
    """A 2d pool's geometry, for turning a flat input-plane index into a window offset and back."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    width: int  # of the input plane
    out_hw: tuple[int, int]
    device: torch.device


def _pool_window(pool: Node) -> _Window | None:
    """The pool's window; None where it cannot be read off positional arguments and static sizes."""
    if pool.kwargs:
        return None
    args = list(pool.args) + [None] * (6 - len(pool.args))
    x, kernel, stride, padding, dilation = args[0], args[1], args[2], args[3], args[4]
    x_val, out_val = x.meta.get("val"), pool.meta.get("val")
    if not _static(x_val) or not isinstance(out_val, (tuple, list)) or not _static(out_val[1]):
        return None
    kernel = _pair(kernel, None)
    stride = _pair(stride, kernel)
    padding, dilation = _pair(padding, (0, 0)), _pair(dilation, (1, 1))
    if kernel is None or kernel[0] * kernel[1] > MAX_OFFSET_WINDOW:
        return None
    out_shape = tuple(out_val[1].shape)
    return _Window(kernel, stride, padding, dilation, int(x_val.shape[-1]), out_shape[-2:], x_val.device)


def _pair(value: Any, default: tuple[int, int] | None) -> tuple[int, int] | None:
    if value is None or (isinstance(value, (list, tuple)) and len(value) == 0):
        return default
    if isinstance(value, int):
        return value, value
    return (int(value[0]), int(value[0])) if len(value) == 1 else (int(value[0]), int(value[1]))


def _window_starts(graph: Graph, window: _Window) -> tuple[Node, Node]:
    """Each output row's and column's first window position in the input (may be negative),
    shaped [OH, 1] and [OW] to broadcast against [..., OH, OW]."""
    starts = []
    for dim, shape in ((0, (window.out_hw[0], 1)), (1, (window.out_hw[1],))):
        positions = _call(graph, aten.arange.start_step, 0, window.out_hw[dim], 1, dtype=torch.int64,
                          device=window.device)
        scaled = _call(graph, aten.mul.Tensor, positions, window.stride[dim])
        shifted = _call(graph, aten.sub.Tensor, scaled, window.padding[dim])
        starts.append(_call(graph, aten.view.default, shifted, list(shape)))
    return starts[0], starts[1]


def _encode(graph: Graph, indices: Node, window: _Window) -> Node:
    """offset = ((h - h0) / dh) * kw + (w - w0) / dw, with h, w the input position `indices` names."""
    row, column = _window_starts(graph, window)
    h = _call(graph, aten.div.Tensor_mode, indices, window.width, rounding_mode="floor")
    w = _call(graph, aten.remainder.Scalar, indices, window.width)
    i = _call(graph, aten.div.Tensor_mode, _call(graph, aten.sub.Tensor, h, row), window.dilation[0],
              rounding_mode="floor")
    j = _call(graph, aten.div.Tensor_mode, _call(graph, aten.sub.Tensor, w, column), window.dilation[1],
              rounding_mode="floor")
    flat = _call(graph, aten.add.Tensor, _call(graph, aten.mul.Tensor, i, window.kernel[1]), j)
    return _call(graph, aten._to_copy.default, flat, dtype=torch.int8)


def _decode(graph: Graph, offsets: Node, window: _Window) -> Node:
    """The flat input-plane index back: (h0 + (offset // kw) * dh) * W + w0 + (offset % kw) * dw."""
    row, column = _window_starts(graph, window)
    wide = _call(graph, aten._to_copy.default, offsets, dtype=torch.int64)
    i = _call(graph, aten.div.Tensor_mode, wide, window.kernel[1], rounding_mode="floor")
    j = _call(graph, aten.remainder.Scalar, wide, window.kernel[1])
    h = _call(graph, aten.add.Tensor, row, _call(graph, aten.mul.Tensor, i, window.dilation[0]))
    w = _call(graph, aten.add.Tensor, column, _call(graph, aten.mul.Tensor, j, window.dilation[1]))
    return _call(graph, aten.add.Tensor, _call(graph, aten.mul.Tensor, h, window.width), w)


def _call(graph: Graph, target: Any, *args: Any, **kwargs: Any) -> Node:
    """A new node at the graph's insertion point, its meta["val"] computed on the fake tensors of
    its arguments, as aot_autograd's tracer would have recorded it."""
    from torch._guards import detect_fake_mode

    node = graph.call_function(target, args, kwargs)
    values = [a.meta["val"] for a in args if isinstance(a, Node)]
    fake_mode = detect_fake_mode(values) if values else _graph_fake_mode(graph)
    real_args = tuple(a.meta["val"] if isinstance(a, Node) else a for a in args)
    with fake_mode:
        node.meta["val"] = target(*real_args, **kwargs)
    return node


def _graph_fake_mode(graph: Graph):
    from torch._guards import detect_fake_mode

    return detect_fake_mode([n.meta["val"] for n in graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)])


def _same_layout(new: torch.Tensor, old: torch.Tensor) -> bool:
    return new.shape == old.shape and new.stride() == old.stride() and new.dtype == old.dtype


def _static(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and all(isinstance(s, int) for s in (*value.shape, *value.stride()))
