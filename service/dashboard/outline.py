"""The outline of a submitted graph: names, ops and edges, without constants or arguments.

The API stores it when it creates a job (`outline:{key}`), since the graph itself is dropped
once compiled; the dashboard draws the picture from it and colours each node by the kernels
whose `origins` name it. Bounded: at most MAX_NODES nodes are kept (`total_nodes` says how
many the graph had).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from pydantic import BaseModel
from redis.exceptions import RedisError

from compiler.graph import Graph, Ref

MAX_NODES = 2000
log = logging.getLogger("fusewire.api")


def graph_outline(graph: Graph) -> dict[str, Any]:
    """{inputs, constants, nodes: [{name, target, refs}], outputs, total_nodes}."""
    return {
        "inputs": [_tensor(spec) for spec in graph.inputs],
        "constants": [_tensor(spec) for spec in graph.constants],
        "nodes": [{"name": node.name, "target": node.target, "refs": _refs([*node.args, *node.kwargs.values()])}
                  for node in graph.nodes[:MAX_NODES]],
        "outputs": _refs(graph.outputs),
        "total_nodes": len(graph.nodes),
    }


def outline_json(graph: Graph) -> str:
    return json.dumps(graph_outline(graph), separators=(",", ":"))


def keep_outline(store, key: str, graph: Graph, ttl_s: int) -> None:
    """Stores the outline of a graph a new job compiles. Best effort: a submission never fails for
    the dashboard's picture (without it, the picture is drawn from the launch plan)."""
    try:
        store.put_outline(key, outline_json(graph), ttl_s)
    except RedisError as exc:
        log.warning("job %s: could not store its graph outline for the dashboard: %s", key[:12], exc)


def _tensor(spec: BaseModel) -> dict[str, Any]:
    return {"name": spec.name, "dtype": spec.dtype, "shape": list(spec.shape)}


def _refs(values: list[Any]) -> list[str]:
    """Names referenced anywhere in `values` (nested lists included), each once, in order."""
    found: dict[str, None] = {}

    def walk(value: Any) -> None:
        if isinstance(value, Ref):
            found.setdefault(value.ref)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(values)
    return list(found)
