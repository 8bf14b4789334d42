"""Online softmax: in a looped reduction kernel, a row max followed by a sum of
exp(value - max) needs two passes over the row; keeping a running max and rescaling the
running sum when the max grows computes both in one.

`find_online_pairs` matches the pattern structurally: the sum's value must be exactly
exp(<the max's value> - <the max's result>), compared as expression trees built by running
both bodies under `ExpressionRecorder`.
"""

from __future__ import annotations

from typing import Any, Callable

from compiler.indexing import simplify_index
from compiler.ir import ComputeNode
from compiler.loop_mapping import GroupMapping


class ExpressionRecorder:
    """An ops handler whose values are hashable expression trees. A load of a buffer that a
    pointwise node of the group computes (`producers`: buffer -> that node's tree) is that node's
    tree, as in the kernel writer: the group's mapping made every read of it read the element
    written at the same point, and the kernel evaluates such values again rather than reading them back."""

    def __init__(self, bounds: dict) -> None:
        self.bounds = bounds
        self.producers: dict[str, Callable[[], Any]] = {}

    def load(self, buffer: str, index: Any) -> Any:
        producer = self.producers.get(buffer)
        if producer is not None:
            return producer()
        return ("load", buffer, str(simplify_index(index, self.bounds)))

    def to_dtype(self, value: Any, dtype: str) -> Any:
        if isinstance(value, tuple) and value[0] == "to_dtype" and value[2] == dtype:
            return value  # casting twice to the same dtype is one cast
        return ("to_dtype", value, dtype)

    def masked(self, mask: Any, body: Any, other: Any) -> tuple:
        return ("masked", mask, body(), other)

    def indirect(self, value: Any, size: int) -> Any:
        raise LookupError("indirect indexing: not an online-softmax candidate")

    def __getattr__(self, name: str) -> Any:
        return lambda *args: (name, *args)


def _strip_cast(tree: Any) -> Any:
    """Drops casts to float32: loads already come back as float32 in kernels (bf16 upcast on load)."""
    if not isinstance(tree, tuple):
        return tree
    if tree[0] == "to_dtype" and tree[2] == "float32":
        return _strip_cast(tree[1])
    return tuple(_strip_cast(part) for part in tree)


def find_online_pairs(nodes: list[ComputeNode], mapping: GroupMapping) -> dict[str, str]:
    """{max node name: sum node name} for every max/sum pair that can share one loop."""
    recorder = ExpressionRecorder(mapping.bounds)
    for node in nodes:
        if not node.is_reduction:
            index, rindex = mapping.index_of(node)
            for store in node.stores:
                recorder.producers[store.buffer.name] = \
                    lambda node=node, index=index, rindex=rindex: node.body(recorder, index, rindex)
    values: dict[str, Any] = {}
    for node in nodes:
        if node.reduction_type in ("max", "sum") and len(node.stores) == 1:
            try:
                index, rindex = mapping.index_of(node)
                values[node.name] = _strip_cast(node.body(recorder, index, rindex))
            except LookupError:
                continue
    pairs: dict[str, str] = {}
    for high in (n for n in nodes if n.reduction_type == "max" and n.name in values):
        index, _ = mapping.index_of(high)
        result = ("load", high.stores[0].buffer.name, str(simplify_index(high.stores[0].layout.index(index), mapping.bounds)))
        wanted = ("exp", ("sub", values[high.name], result))
        for total in (n for n in nodes if n.reduction_type == "sum" and n.name in values):
            if values[total.name] == wanted and total.name not in pairs.values():
                pairs[high.name] = total.name
                break
    return pairs
