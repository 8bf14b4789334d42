"""Stage 3, first: a reduction's reduced dims put in the order its input sits in memory.

A reduction kernel walks a row's reduced elements in the order of the node's reduction ranges,
flattened row-major (compiler/loop_mapping.py), and a split's partials take chunks of that
flattened row (compiler/split_reductions.py). Lowering lists the reduced dims in the tensor's
logical order: a full sum of a channels-last [N, C, H, W] tensor walks (n, c, h, w), so
neighbouring elements of a row lie C apart in memory, and each chunk of a split reads one channel
in steps of C. HGNetV2's padded gradient summed that way ran 0.61x Inductor (H200, 2026-11-29).

This stage reorders each order-free reduction's (sum, prod, max, min, any, welford) reduced dims by
the strides of what it reads, the largest first, so that the innermost reduced dim is the one that
steps through memory by the smallest distance. The reads vote by the bytes of one element each; a
reduction none of whose reads covers every reduced dim affinely keeps its order. argmax and argmin
keep theirs: on ties they report the first position in the logical order. Scans keep theirs too,
and so do column reductions (split_reductions.is_outer): their tiles read along the columns whatever
the order of the rows, and a row reduction over the same rows that takes in a column sum's partial
pass (compiler/mixed_order.py) needs the rows in its own order. LFM2's RMSNorm backward lost its
mixed kernel that way: 17.7 -> 20.0 us (H200, 2026-11-29).
"""

from __future__ import annotations

from dataclasses import replace

from compiler.dependencies import node_index_symbols
from compiler.indexing import affine_coefficients
from compiler.ir import ComputeNode, Program
from compiler.split_reductions import is_outer, simplified_reads

ORDER_FREE = frozenset({"sum", "prod", "max", "min", "any", "welford"})
MEMORY_ORDER_REDUCTIONS = True  # off: reduced dims keep the logical order (A/B runs, bench/switch_ab.py)


def order_reduced_dims(program: Program) -> None:
    """Rewrites, in place, every reduction of `program` whose reads favour another dim order."""
    if not MEMORY_ORDER_REDUCTIONS:
        return
    itemsize = program.buffer_itemsizes()
    for i, node in enumerate(program.nodes):
        if isinstance(node, ComputeNode) and node.reduction_type in ORDER_FREE \
                and sum(s != 1 for s in node.reduction_ranges) > 1 and not is_outer(node):
            order = memory_order_of_reduced_dims(node, itemsize)
            if order != list(range(len(node.reduction_ranges))):
                program.nodes[i] = permute_reduced_dims(node, order)


def memory_order_of_reduced_dims(node: ComputeNode, itemsize: dict[str, int]) -> list[int]:
    """The node's reduced dims from the largest to the smallest stride, as most of its read bytes
    see them; the node's own order where no read decides."""
    index, rindex = node_index_symbols(node)
    reduced = [d for d, s in enumerate(node.reduction_ranges) if s != 1]
    symbols = [s for s in index + rindex if not s.is_Integer]
    votes: dict[tuple[int, ...], int] = {}
    for buffer, read in simplified_reads(node):
        affine = affine_coefficients(read, symbols)
        if affine is None or any(affine[0].get(rindex[d], 0) == 0 for d in reduced):
            continue
        strides = affine[0]
        order = tuple(sorted(range(len(node.reduction_ranges)), key=lambda d: -abs(strides.get(rindex[d], 0))))
        votes[order] = votes.get(order, 0) + itemsize.get(buffer, 4)
    own = list(range(len(node.reduction_ranges)))
    if not votes:
        return own
    best = max(votes.values())
    if votes.get(tuple(own), 0) == best:
        return own
    return list(next(order for order, weight in votes.items() if weight == best))


def permute_reduced_dims(node: ComputeNode, order: list[int]) -> ComputeNode:
    """The node with its reduced dims taken in `order` (order[k]: the original dim walked k-th)."""
    original_body = node.body

    def body(ops, index, rindex):
        logical = [None] * len(order)
        for position, dim in enumerate(order):
            logical[dim] = rindex[position]
        return original_body(ops, index, logical)

    return replace(node, reduction_ranges=tuple(node.reduction_ranges[d] for d in order), body=body)
