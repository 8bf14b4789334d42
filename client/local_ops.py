"""Graphs holding ops that cannot travel on the wire: custom ops a library registers with
torch.library (transformers' `grouped_mm_fallback`, which its mixture-of-experts layers call under
torch.compile), or any other op call the wire format has no name for. Such a graph is split in node order:
each local op alone in a part (with the items taken of its result), the runs of wire ops between
them in others. The service compiles the wire parts as graphs of their own; the local ops run in
the caller's process between them, where their library is loaded. Nothing falls back to eager.

    split = split_at_local_ops(gm)          # None when every op travels
    function = SplitFunction(backend, split, name, backward)   # its parts compiled now
    function(args)                          # boxed, as aot_autograd calls its compilers' results

The wire format is unchanged (docs/CLIENT.md): the service never sees a local op.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

import torch
import torch.fx
from torch.fx.passes.split_module import split_module

from compiler.fx_import import travels

if TYPE_CHECKING:
    from client.backend import Backend, GraphFunction


def local_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The op calls that cannot go on the wire and make tensors. Shape arithmetic (`sym_size`,
    `operator.mul` of sizes in a dynamic-shape graph) is not one: such a graph is specialised to
    concrete sizes before it is compiled (client/backend.py), which removes it."""
    return [node for node in gm.graph.nodes if node.op == "call_function"
            and isinstance(node.target, torch._ops.OpOverload) and not travels(node) and _makes_tensors(node)]


def _makes_tensors(node: torch.fx.Node) -> bool:
    value = node.meta.get("val")
    values = value if isinstance(value, (list, tuple)) else [value]
    return bool(values) and all(isinstance(v, torch.Tensor) for v in values)


def split_at_local_ops(gm: torch.fx.GraphModule) -> torch.fx.GraphModule | None:
    """`gm` split into parts `submod_<n>` in node order, each local op in a part of its own; its
    `local_parts` attribute names those parts. None when `gm` has no local op."""
    local = set(local_nodes(gm))
    if not local:
        return None
    part_of: dict[torch.fx.Node, int] = {}
    local_parts: set[int] = set()
    part, previous_local = 0, True
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        source = node.args[0] if node.op == "call_function" and node.target is operator.getitem else None
        if isinstance(source, torch.fx.Node) and source in part_of:  # an item stays with its tuple
            part_of[node] = part_of[source]
            continue
        is_local = node in local
        if is_local or previous_local:
            part += 1
        part_of[node] = part
        previous_local = is_local
        if is_local:
            local_parts.add(part)
    split = split_module(gm, gm, lambda node: part_of[node], keep_original_order=True,
                         keep_original_node_name=True)
    split.local_parts = {f"submod_{n}" for n in local_parts}
    return split


class _CompiledPart(torch.nn.Module):
    """A wire part in the split graph's place: called with positional tensors, runs the compiled
    GraphFunction (boxed)."""

    def __init__(self, function: "GraphFunction") -> None:
        super().__init__()
        self.function = function

    def forward(self, *args: Any) -> Any:
        return self.function(list(args))


class SplitFunction:
    """What aot_autograd runs for a graph with local ops: the split graph, its wire parts compiled
    (one GraphFunction each, named "<graph> part <n>"), its local ops run as they are."""

    def __init__(self, backend: "Backend", split: torch.fx.GraphModule, name: str, backward: bool = False) -> None:
        from client.backend import GraphFunction

        self._boxed_call = True
        self.split, self.name = split, name
        self.parts: dict[str, GraphFunction] = {}
        for node in split.graph.find_nodes(op="call_module"):
            if node.target in split.local_parts:
                continue
            part = getattr(split, node.target)
            function = GraphFunction(backend, part, f"{name} part {node.target.removeprefix('submod_')}", backward)
            if function.static and function.has_work:  # compiled now, at torch.compile time
                function.prepare([p.meta.get("val") for p in part.graph.find_nodes(op="placeholder")])
            self.parts[node.target] = function
            setattr(split, node.target, _CompiledPart(function))

    def __call__(self, args: list) -> Any:
        inputs = list(args)
        args.clear()  # boxed: the caller's list is ours, so the inputs are freed as the split graph goes
        return self.split(*inputs)
