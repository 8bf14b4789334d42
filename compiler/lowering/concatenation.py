"""A cat's result stored piece by piece: each piece written into its slice of the result's buffer
by a node of its own, which the scheduler may fuse into the kernel that computes the piece.

A cat is otherwise one pointwise node that reads every piece under a mask (lowering/shapes.py).
That node cannot join the kernel of a piece's producer, whose loops cover the piece, not the cat.
Where a piece is computed from a reduction, its values are then computed twice: CoaT's class
token, cat before a LayerNorm's output over 32 x 3136 x 64, cost a second read of the
LayerNorm's input in the cat's own kernel (H100, 2026-11-27: 20.7 us, 0.81x Inductor, whose
`ConcatKernel` has each piece written into the result by its producer).

A cat is stored by piece (`Concatenation.by_piece`) when both hold:
- some piece is a whole buffer that a reduction computed, or that a node computed from a
  reduction's result (a normalization's output): its node can then join the reduction's kernel;
- the result is needed in memory anyway: it is a graph output, or an ATen call (a matmul, a
  convolution) reads it, directly or through views. A cat that only lowered ops read stays one
  node, which the scheduler fuses into its readers.
A piece that joins no kernel costs a launch of its own, as in Inductor.

With MANY_PIECES_BY_PIECE (off: see its comment), a cat of more than MAX_MASKED_PIECES pieces is
stored by piece whatever reads it, and is realized where it is produced, inside a decomposition too
(lowering/__init__.py `_finish_one`): its readers read the buffer. As one node it would have every
element of its readers' kernels test each piece's range, load under each mask and chain the `where`s,
as Inductor avoids past `max_pointwise_cat_inputs`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from compiler.graph import Graph, refs_in
from compiler.ir import ComputeNode, Program
from compiler.lowering import registry
from compiler.lowering.padding import is_view, viewed_through
from compiler.lowering.values import Lazy, StorageView, TensorValue

CAT_BY_PIECE = True  # off: every cat is one masked node (A/B runs, bench/switch_ab.py)
# Inductor's max_pointwise_cat_inputs: StableLM's cat of 16 per-head LayerNorms ([4,1,1024,64] bf16 each),
# fused as one masked node into the rotary embedding that reads it, ran at 0.36x Inductor (H200).
MAX_MASKED_PIECES = 8
# Off for now: on that case (its pieces graph inputs) the pieces became 32 copy kernels, which the
# scheduler does not combine (their writes to disjoint slices of one buffer are refused as
# inconsistent), and it ran slower: 77.0 us on, 68.1 off, Inductor 24.5 (H200, 2026-11-29,
# bench/switch_ab.py). Inductor copies a cat's input pieces in one kernel. In the model the pieces are
# LayerNorms' outputs, each of which could store its copy in its own kernel: not measured.
MANY_PIECES_BY_PIECE = False
CAT_TARGETS = frozenset({"aten.cat.default", "aten.stack.default"})


@dataclass
class Concatenation(Lazy):
    """A cat's result while lazy: its pieces along `dim`, each starting at its offset. `by_piece`:
    realized, it is stored piece by piece (`LoweringContext.realize`)."""

    pieces: tuple[TensorValue, ...] = ()
    offsets: tuple[int, ...] = ()
    dim: int = 0
    by_piece: bool = False


def cats_materialized(graph: Graph, graph_outputs: set[str]) -> set[str]:
    """The cat (and stack) nodes whose results must be in memory whatever the scheduler fuses: graph
    outputs (or viewed by one) and those an ATen call reads, directly or through views."""
    users: dict[str, list[Any]] = {}
    for node in graph.nodes:
        for name in set(refs_in([*node.args, *node.kwargs.values()])):
            users.setdefault(name, []).append(node)

    def read_by_extern(name: str, depth: int = 0) -> bool:
        for user in users.get(name, []):
            if _always_extern(user.target):
                return True
            if depth < 8 and is_view(user.target) and read_by_extern(user.name, depth + 1):
                return True
        return False

    return {node.name for node in graph.nodes if node.target in CAT_TARGETS
            and (node.name in graph_outputs or read_by_extern(node.name))}


def cat_pieces(graph: Graph) -> set[str]:
    """The nodes a cat (or stack) reads as a piece, directly or through views: lowering/reductions.py
    unrolls a small reduction among them, so that it joins the cat's node instead of writing a buffer
    of its own that the cat's kernel reads again."""
    pieces = [name for node in graph.nodes if node.target in CAT_TARGETS and node.args
              for name in refs_in(node.args[0])]
    return viewed_through(graph, pieces)


def _always_extern(target: str) -> bool:
    from compiler.fx_import import resolve_op

    try:
        return registry.always_extern(resolve_op(target))
    except Exception:
        return True  # an op nobody can resolve runs as is


def stored_by_piece(ctx: Any, pieces: Sequence[TensorValue]) -> bool:
    """Whether the cat being lowered (`ctx.origin`) is stored piece by piece (see the module docstring)."""
    if MANY_PIECES_BY_PIECE and len(pieces) > MAX_MASKED_PIECES:
        return True
    return CAT_BY_PIECE and ctx.origin in ctx.materialized_cats and reads_a_reduction(ctx.program, pieces)


def reads_a_reduction(program: Program, pieces: Sequence[TensorValue]) -> bool:
    """Whether some piece is a whole buffer that a reduction computed, or that a node computed from a
    reduction's result. A slice of one is left out: its node would cover part of the producer's loops,
    which no kernel fuses (ReXNet's cat of a BatchNorm's channels 0-26, a residual added, and 27-37
    became three kernels instead of one)."""
    wanted = {p.buffer.name for p in pieces if isinstance(p, StorageView) and p.buffer.kind == "computed"
              and p.layout.numel == p.buffer.layout.numel}
    if not wanted:
        return False
    writers: dict[str, ComputeNode] = {}
    for node in program.nodes:
        if isinstance(node, ComputeNode):
            for store in node.stores:
                writers[store.buffer.name] = node
    reduced = {name for name, node in writers.items() if node.is_reduction}

    def from_reduction(name: str) -> bool:
        node = writers.get(name)
        if node is None:
            return False
        return node.is_reduction or bool(_buffers_read(node) & reduced)

    return any(from_reduction(name) for name in wanted)


def _buffers_read(node: ComputeNode) -> set[str]:
    from compiler.dependencies import extract_read_writes

    return extract_read_writes(node).read_buffers()
