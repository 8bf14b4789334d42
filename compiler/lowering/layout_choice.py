"""Which layout a realized intermediate takes: its loads' order, where eager's differs from it.

Eager lays a result out as its ATen kernel does, and some make a layout nothing around them
uses: `slice_backward` writes a fresh contiguous (NCHW) tensor even where the gradient it pads
is channels-last, and every pointwise op after it follows. Realized that way, a kernel whose
loads all walk channels-last stores across them, and the kernels reading the result read across
their other inputs. ReXNet's BatchNorm backward over a gradient assembled from channel slices
ran 0.80x Inductor's speed so (H100, 2026-11-27).

So a node's result that no caller sees (not a graph output, nor viewed by one), that no view
reads, and whose op asks for no memory format is laid out in the order its loads agree on: the
dims sorted by each load's stride, when every load that steps along all of the result's dims sorts
them alike, and every other load (a broadcast) sorts the dims it steps along in that order too. Inductor does the same for
a buffer whose layout is still free (`ComputedBuffer.get_fill_order`). Views are left out because
a view of another layout is no view at all: a reshape would become an index remap, and an ATen
call reading it a copy.

Only the buffer lies otherwise: every later node still sees eager's strides in its meta tensors
(`lowering._lower_nodes` keeps them in `LoweringContext.eager_metas`), so graph outputs keep the
strides the caller traced.
"""

from __future__ import annotations

from typing import Sequence

from compiler.dependencies import traced_loads
from compiler.graph import Graph, MemoryFormatArg, refs_in
from compiler.indexing import affine_coefficients, index_symbol
from compiler.ir import Layout
from compiler.lowering.padding import RESHAPES, is_view
from compiler.lowering.values import Lazy, StorageView

LAYOUT_FOLLOWS_LOADS = True  # off: every intermediate takes eager's layout (A/B runs, bench/switch_ab.py)


def layout_free_nodes(graph: Graph, graph_outputs: set[str]) -> set[str]:
    """Nodes whose results only non-view ops read (a reshape counts as a view), no caller sees, and
    whose op asks for no memory format (`x.contiguous()` is a clone asking for row-major strides,
    and the op after it, GroupNorm's backward, reads it beside row-major tensors)."""
    read_by_view: set[str] = set()
    for node in graph.nodes:
        if is_view(node.target) or node.target.split(".")[1] in RESHAPES:
            read_by_view.update(refs_in([*node.args, *node.kwargs.values()]))
    asks_format = {node.name for node in graph.nodes if _asks_memory_format([*node.args, *node.kwargs.values()])}
    return {node.name for node in graph.nodes} - read_by_view - graph_outputs - asks_format


def _asks_memory_format(values: list) -> bool:
    return any(isinstance(v, MemoryFormatArg) and v.memory_format != "preserve_format" or
               isinstance(v, list) and _asks_memory_format(v) for v in values)


def may_walk_otherwise(arguments: list) -> bool:
    """Whether some tensor argument of a node is not a row-major view of a buffer (a permuted or
    channels-last one, or a lazy value), so that the node's loads may walk its result in another
    order than row-major. Tracing every node's loads cost a LLaMA graph of 5,100 nodes a third of a
    second of lowering; one whose arguments are all row-major is left as eager lays it out."""
    for value in arguments:
        if isinstance(value, (list, tuple)):
            if may_walk_otherwise(list(value)):
                return True
        elif isinstance(value, Lazy):
            return True
        elif isinstance(value, StorageView):
            strides = [st for size, st in zip(value.layout.size, value.layout.stride) if size > 1 and st != 0]
            if any(a <= b for a, b in zip(strides, strides[1:])):
                return True
    return False


def follows_loads(value: Lazy, eager: Layout) -> Layout | None:
    """A dense layout in the order `value`'s loads walk, when they agree on one and it is not
    `eager`'s; else None."""
    if not LAYOUT_FOLLOWS_LOADS or len(value.size) < 2:
        return None
    order = load_order(value)
    if order is None:
        return None
    chosen = Layout.dense(value.size, order, value.dtype)
    return chosen if strides_differ(chosen, eager.stride) else None


def load_order(value: Lazy) -> tuple[int, ...] | None:
    """The dims of `value` outermost first as every load stepping along all of them lays them out;
    None when there is no such load, a load is not affine in the index (a gather, an index remap),
    or two loads disagree. A load along some of the dims (a broadcast) must lay those out
    in the same order: an NCHW tensor broadcast over a channels-last one's groups keeps eager's layout."""
    moving = [d for d, size in enumerate(value.size) if size > 1]
    if len(moving) < 2:
        return None
    index = [index_symbol("i", d) for d in range(len(value.size))]
    loads = traced_loads(lambda recorder: value.load(recorder, index), tuple(value.size))
    if loads is None:
        return None
    orders = []
    for dep in loads:
        affine = affine_coefficients(dep.index, index)
        if affine is None:
            return None
        steps = {d: affine[0].get(index[d], 0) for d in moving}
        stepped = [d for d in moving if steps[d] != 0]
        orders.append(tuple(sorted(stepped, key=lambda d: (-abs(steps[d]), d))))
    full = {order for order in orders if len(order) == len(moving)}
    if len(full) != 1:
        return None
    (walked,) = full
    if not all(order == tuple(d for d in walked if d in order) for order in orders):
        return None
    unit = [d for d in range(len(value.size)) if value.size[d] <= 1]
    return tuple(unit) + walked  # size-1 dims anywhere: their strides never matter


def strides_differ(layout: Layout, stride: Sequence[int]) -> bool:
    """Whether `layout` lies otherwise than `stride` says, size-1 dims aside."""
    return any(size > 1 and x != y for size, x, y in zip(layout.size, layout.stride, stride))
