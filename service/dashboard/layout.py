"""Layered layout of a DAG for the graph picture: rows top to bottom, data flowing down.

Longest-path layering (a node sits one row below its deepest producer; a source such as a
weight sits just above its first consumer instead of at the top), then a few barycenter
sweeps to order each row so edges cross less. Good enough for graphs of a few hundred
nodes; the picture caps what it draws.

    placed = layered(["x", "a", "b"], [("x", "a"), ("a", "b")])   # name -> (row, column)
"""

from __future__ import annotations

from collections import defaultdict

SWEEPS = 4


def layered(nodes: list[str], edges: list[tuple[str, str]]) -> dict[str, tuple[int, int]]:
    """`nodes` in a topological order, `edges` (producer, consumer) between them -> (row, column) each."""
    preds: dict[str, list[str]] = defaultdict(list)
    succs: dict[str, list[str]] = defaultdict(list)
    for src, dst in edges:
        preds[dst].append(src)
        succs[src].append(dst)
    rows = _rows(_layers(nodes, preds, succs))
    for sweep in range(SWEEPS):
        neighbours = preds if sweep % 2 == 0 else succs
        order = rows if sweep % 2 == 0 else rows[::-1]
        for row in order:
            _sort_row(row, neighbours, _columns(rows))
    return {node: (r, c) for r, row in enumerate(rows) for c, node in enumerate(row)}


def _layers(nodes: list[str], preds: dict[str, list[str]], succs: dict[str, list[str]]) -> dict[str, int]:
    layer: dict[str, int] = {}
    for node in nodes:
        layer[node] = 1 + max((layer[p] for p in preds[node] if p in layer), default=-1)
    for node in nodes:  # sources sit just above their first consumer, not all on the top row
        if not preds[node] and succs[node]:
            layer[node] = max(0, min(layer[s] for s in succs[node]) - 1)
    return layer


def _rows(layer: dict[str, int]) -> list[list[str]]:
    rows: list[list[str]] = [[] for _ in range(max(layer.values(), default=-1) + 1)]
    for node, r in layer.items():  # dict order = the topological order given
        rows[r].append(node)
    return [row for row in rows if row]


def _columns(rows: list[list[str]]) -> dict[str, float]:
    """Each node's column, centred so rows of different widths line up around one axis."""
    width = max(len(row) for row in rows)
    return {node: c + (width - len(row)) / 2 for row in rows for c, node in enumerate(row)}


def _sort_row(row: list[str], neighbours: dict[str, list[str]], column: dict[str, float]) -> None:
    """Orders a row by the mean column of each node's neighbours (a node without any keeps its place)."""
    def barycenter(item: tuple[int, str]) -> float:
        index, node = item
        linked = [column[n] for n in neighbours[node] if n in column]
        return sum(linked) / len(linked) if linked else column.get(node, index)

    row[:] = [node for _, node in sorted(enumerate(row), key=lambda item: (barycenter(item), item[0]))]
