"""Bounded work per graph: no tensor bigger than `max_tensor_elements`, no launch plan needing
more than `max_planned_bytes` at once.

No stage of the compiler allocates a graph's tensors. Lowering infers every shape on meta
tensors. So a graph asking for 10^12 elements costs the worker nothing, but the client would
try to allocate it, and so would a GPU worker's autotuning. These checks turn such a graph
into a clear error that names the node, as early as each fact is known:
- in the API, before anything is queued: sizes written literally in the graph (`check_literal_sizes`);
- in lowering, for every op's output, decompositions included (`check_tensor`);
- after codegen, before any autotuning, for the plan's peak (`check_plan`).

Torch-free, so the API can import it.
"""

from __future__ import annotations

import math
from typing import Any, Iterator

from pydantic import BaseModel, ConfigDict, Field

from compiler.aten_schemas import lookup_schema
from compiler.graph import ITEMSIZES, Graph


class WorkLimits(BaseModel):
    """Sized so that real models pass. A 32-layer, 128k-vocabulary LLaMA step at batch 8 x 4096
    has logits of 4.2e9 elements; the largest GPU lent to workers holds 141 GiB."""

    model_config = ConfigDict(frozen=True)

    max_tensor_elements: int = Field(2**34, ge=1, description="elements of any input, intermediate or output")
    max_planned_bytes: int = Field(192 * 2**30, ge=1, description="bytes the launch plan holds at once")


class LimitExceeded(ValueError):
    """A graph over a work limit. `where` locates it in the wire graph when known."""

    def __init__(self, problem: str, where: str | None = None) -> None:
        super().__init__(f"{where}: {problem}" if where else problem)
        self.problem, self.where = problem, where


def check_tensor(shape: tuple[int, ...] | list[int], what: str, limits: WorkLimits) -> None:
    numel = math.prod(shape)
    if numel > limits.max_tensor_elements:
        raise LimitExceeded(f"{what} has {numel:,} elements (shape {list(shape)}), over this service's limit of "
                            f"{limits.max_tensor_elements:,} per tensor")


def check_plan(plan: dict[str, Any], limits: WorkLimits) -> int:
    """The plan's planned peak in bytes (its own buffers, extern results and constants together);
    raises LimitExceeded above the limit."""
    peak = planned_peak_bytes(plan)
    if peak > limits.max_planned_bytes:
        raise LimitExceeded(f"the launch plan needs {peak / 2**30:,.1f} GiB at once, over this service's limit of "
                            f"{limits.max_planned_bytes / 2**30:,.1f} GiB")
    return peak


def planned_peak_bytes(plan: dict[str, Any], own_only: bool = False) -> int:
    """Bytes live at the worst step: constants, plan allocations (reuse counted once) and extern
    results from their step to their free. Graph inputs are the caller's and not counted.
    `own_only`: the plan's own allocations alone (what the runtime allocates for it)."""
    sizes = {name: meta["numel"] * ITEMSIZES[meta["dtype"]] for name, meta in plan["buffers"].items()}
    live = 0 if own_only else sum(_storage_bytes(c) for c in plan.get("constants", []))
    peak = live
    for step in plan["steps"]:
        if step["op"] == "alloc" and "reuse" not in step:
            live += sizes[step["buffer"]]
        elif step["op"] == "extern" and not own_only:
            for name, layout in zip(step["outputs"], step.get("layouts", [])):
                sizes.setdefault(name, _storage_bytes(layout))
                live += sizes[name]
        elif step["op"] == "free" and not step.get("keep"):
            live -= sizes.get(step["buffer"], 0)
        peak = max(peak, live)
    return peak


def _storage_bytes(layout: dict[str, Any]) -> int:
    size, stride = layout["size"], layout["stride"]
    if any(s == 0 for s in size):
        return 0
    extent = layout.get("offset", 0) + 1 + sum((s - 1) * abs(st) for s, st in zip(size, stride))
    return extent * ITEMSIZES[layout["dtype"]]


# -- what the API can know: sizes written in the graph ----------------------------------


def check_literal_sizes(graph: Graph, limits: WorkLimits) -> None:
    """Inputs, constants and every literal `size` argument (full, empty, zeros, new_*, expand,
    as_strided...) and arange's range, against max_tensor_elements."""
    for where, shape in _literal_shapes(graph):
        try:
            check_tensor(shape, "this tensor", limits)
        except LimitExceeded as exc:
            raise LimitExceeded(exc.problem, where) from None


def _literal_shapes(graph: Graph) -> Iterator[tuple[str, list[int]]]:
    for i, spec in enumerate(graph.inputs):
        yield f"inputs[{i}] '{spec.name}'.shape", list(spec.shape)
    for i, spec in enumerate(graph.constants):
        yield f"constants[{i}] '{spec.name}'.shape", list(spec.shape)
    for i, node in enumerate(graph.nodes):
        named = _named_args(node.target, node.args, node.kwargs)
        size = named.get("size")
        if isinstance(size, list) and size and all(isinstance(s, int) and not isinstance(s, bool) for s in size):
            yield f"nodes[{i}] '{node.name}'.size", [s for s in size if s >= 0]  # -1 (keep) adds nothing
        if node.target.startswith("aten.arange."):
            length = _arange_length(named)
            if length is not None:
                yield f"nodes[{i}] '{node.name}'", [length]


def _named_args(target: str, args: list, kwargs: dict) -> dict[str, Any]:
    schema = lookup_schema(target)
    named = dict(zip(schema.arg_names, args)) if schema else {}
    named.update(kwargs)
    return named


def _arange_length(named: dict[str, Any]) -> int | None:
    start, end, step = named.get("start", 0), named.get("end"), named.get("step", 1)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (start, end, step)):
        return None
    if step == 0:
        return None  # ATen's own error, raised in lowering
    return max(0, math.ceil((end - start) / step))
