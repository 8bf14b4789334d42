"""What the graph picture shows: nodes, their kind and kernels, and edges (drawn by svg.py).

Two sources, best first:

- the submitted graph's outline (`outline:{key}`, outline.py) with the manifest: every wire
  node, coloured by the kernels whose `origins` name it (a node split over several kernels,
  a layer norm's statistics and normalization say, gets one stripe per kernel). A node no
  kernel names is an ATen call when the plan calls its op as an extern, else it has no work
  of its own: a view (an index remap its readers apply) or a value nobody reads.
  Extern steps do not name their wire node, so they are matched by op; where a graph has
  more nodes of an op than the plan has calls of it, `notes` says so.
- without an outline (compiled before outlines were kept, or its record expired before the
  job was ready): the launch plan itself, kernels and extern calls joined by the buffers
  they pass. A buffer's writer is the first kernel after its `alloc` that takes it, or the
  extern call that lists it as an output.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from compiler.artifact import tensor_buffers

MAX_DRAWN = 300  # nodes drawn at most; the page says when a graph has more


@dataclass
class PictureNode:
    id: str
    label: str
    op: str
    kind: str  # input | constant | kernel | extern | none
    kernels: list[str] = field(default_factory=list)
    output: bool = False


@dataclass
class Picture:
    nodes: list[PictureNode]
    edges: list[tuple[str, str]]
    kernels: list[str]  # in the manifest's order: the legend's and the colours' order
    source: str  # "graph" or "plan"
    total: int  # graph nodes (or plan calls) there were, drawn or not
    drawn: int  # of those, drawn
    notes: list[str] = field(default_factory=list)


def short_op(target: str) -> str:
    """'aten.native_layer_norm.default' -> 'native_layer_norm'; 'aten.add.Tensor' -> 'add.Tensor'."""
    name = target.split(".", 1)[1] if target.startswith(("aten.", "prims.")) else target
    return name.removesuffix(".default")


def from_outline(outline: dict[str, Any], manifest: dict[str, Any], limit: int = MAX_DRAWN) -> Picture:
    kernels_of: dict[str, list[str]] = defaultdict(list)
    for kernel in manifest["kernels"]:
        for origin in kernel["origins"]:
            kernels_of[origin].append(kernel["name"])
    externs = Counter(step["target"] for step in manifest["plan"]["steps"] if step["op"] == "extern")
    drawn = outline["nodes"][:limit]
    referenced = {ref for node in drawn for ref in node["refs"]} | set(outline["outputs"])
    whole = len(drawn) == outline["total_nodes"]  # then unused inputs are drawn too
    outputs = set(outline["outputs"])
    nodes = [PictureNode(spec["name"], spec["name"], _shape(spec), kind, output=spec["name"] in outputs)
             for kind, specs in (("input", outline["inputs"]), ("constant", outline["constants"]))
             for spec in specs if whole or spec["name"] in referenced]
    for node in drawn:
        kernels = kernels_of.get(node["name"], [])
        kind = "kernel" if kernels else "extern" if node["target"] in externs else "none"
        nodes.append(PictureNode(node["name"], node["name"], short_op(node["target"]), kind, kernels,
                                 node["name"] in outputs))
    names = {node.id for node in nodes}
    edges = [(ref, node["name"]) for node in drawn for ref in node["refs"] if ref in names]
    notes = _extern_notes(outline["nodes"], kernels_of, externs)
    return Picture(nodes, edges, [k["name"] for k in manifest["kernels"]], "graph", outline["total_nodes"], len(drawn),
                   notes)


def _extern_notes(nodes: list[dict], kernels_of: dict[str, list[str]], externs: Counter) -> list[str]:
    unclaimed = Counter(node["target"] for node in nodes
                        if node["name"] not in kernels_of and node["target"] in externs)
    return [f"{unclaimed[target]} nodes call {short_op(target)}, the plan {calls} time{'s' * (calls > 1)}: "
            "the others were dropped (their results are never read)"
            for target, calls in sorted(externs.items()) if unclaimed[target] > calls]


def _shape(spec: dict[str, Any]) -> str:
    return f"{spec['dtype']}[{', '.join(map(str, spec['shape']))}]"


def from_plan(manifest: dict[str, Any], limit: int = MAX_DRAWN) -> Picture:
    plan = manifest["plan"]
    nodes = [PictureNode(spec["buffer"], spec["buffer"], _shape({"dtype": spec["dtype"], "shape": spec["size"]}), kind)
             for kind, specs in (("input", plan["inputs"]), ("constant", plan.get("constants", [])))
             for spec in specs if "buffer" in spec]
    sources = len(nodes)
    writer = {node.id: node.id for node in nodes}
    edges: list[tuple[str, str]] = []
    allocated: set[str] = set()
    calls = [step for step in plan["steps"] if step["op"] in ("kernel", "extern")]
    for index, step in enumerate(plan["steps"]):
        if step["op"] == "alloc":
            allocated.add(step["buffer"])
        elif step["op"] in ("kernel", "extern") and len(nodes) < limit:
            node, reads, writes = _plan_node(index, step, allocated)
            edges += sorted({(writer[b], node.id) for b in reads if b in writer})
            writer.update({b: node.id for b in writes})
            allocated -= set(writes)
            nodes.append(node)
    kept = {node.id for node in nodes}
    for output in plan["outputs"]:
        for node in nodes:
            node.output |= writer.get(output["buffer"]) == node.id
    return Picture(nodes, [e for e in edges if e[0] in kept], [k["name"] for k in manifest["kernels"]], "plan",
                   len(calls), len(nodes) - sources)


def _plan_node(index: int, step: dict[str, Any], allocated: set[str]) -> tuple[PictureNode, list[str], list[str]]:
    if step["op"] == "kernel":
        args = step["args"]
        writes = [a for a in args if a in allocated]
        node = PictureNode(step["kernel"], step["kernel"], f"grid {step['grid'][0]}", "kernel", [step["kernel"]])
        return node, [a for a in args if a not in writes], writes
    reads = sorted(tensor_buffers([step["args"], step.get("kwargs", {})]))
    node = PictureNode(f"extern{index}", short_op(step["target"]), "ATen call", "extern")
    return node, reads, list(step["outputs"])
