"""SVG drawn on the server: the graph picture (a Picture from picture.py, laid out by
layout.py) and stacked bar charts for the overview. Plain strings, every text escaped; no
script, so the pages need no JavaScript.

    graph_svg(picture) -> "<svg ...>"      one fill colour per kernel, a legend, <title> tooltips
    bar_chart(labels, series, colours, fmt, title) -> "<svg ...>"
"""

from __future__ import annotations

from html import escape
from typing import Callable

from service.dashboard.layout import layered
from service.dashboard.picture import Picture, PictureNode

NODE_W, NODE_H, GAP_X, GAP_Y, MARGIN = 150, 38, 16, 44, 12
LEGEND_ITEM_W, LEGEND_ROW_H = 300, 18
PALETTE = ("#8dd3c7", "#fdb462", "#bebada", "#fb8072", "#80b1d3", "#b3de69", "#fccde5", "#ffed6f",
           "#bc80bd", "#ccebc5", "#e5c494", "#a6cee3", "#f4a582", "#c2a5cf", "#fee08b", "#66c2a5")
KIND_STYLE = {  # fill, stroke, text colour, legend text
    "input": ("#ffffff", "#1f6fb4", "#123", "graph input"),
    "constant": ("#ffffff", "#7b3fa0", "#123", "captured constant"),
    "extern": ("#37474f", "#263238", "#fff", "ATen call (extern)"),
    "none": ("#ffffff", "#9e9e9e", "#555", "no kernel: a view, or unused"),
}


def kernel_colours(kernels: list[str]) -> dict[str, str]:
    """A distinct fill per kernel: the palette, then hues a golden angle apart."""
    colours = {}
    for i, name in enumerate(kernels):
        if i < len(PALETTE):
            colours[name] = PALETTE[i]
        else:
            hue = (i * 137.508) % 360
            colours[name] = f"hsl({hue:.1f},{60 + (i % 3) * 10}%,{70 + (i % 2) * 8}%)"
    return colours


def graph_svg(picture: Picture) -> str:
    colours = kernel_colours(picture.kernels)
    placed = layered([n.id for n in picture.nodes], picture.edges)
    columns = max((c for _, c in placed.values()), default=0) + 1
    width = max(2 * MARGIN + columns * (NODE_W + GAP_X), 640)
    legend, legend_h = _legend(picture, colours, width)
    widths = _row_widths(placed)
    xy = {node: (_x(r, c, widths, width), legend_h + MARGIN + r * (NODE_H + GAP_Y)) for node, (r, c) in placed.items()}
    rows = max((r for r, _ in placed.values()), default=-1) + 1
    height = legend_h + 2 * MARGIN + rows * (NODE_H + GAP_Y)
    nodes = [_node(node, xy[node.id], colours) for node in picture.nodes]
    edges = [_edge(xy[a], xy[b]) for a, b in picture.edges if a in xy and b in xy]
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="graph" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" font-family="ui-monospace, monospace" font-size="11">'
            f"<title>{len(picture.nodes)} nodes, {len(picture.kernels)} kernels</title>"
            '<defs><marker id="fw-arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7" markerHeight="7" '
            'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#8a8a8a"/></marker></defs>'
            f'{legend}<g class="edges">{"".join(edges)}</g><g class="nodes">{"".join(nodes)}</g></svg>')


def _row_widths(placed: dict[str, tuple[int, int]]) -> dict[int, int]:
    widths: dict[int, int] = {}
    for r, c in placed.values():
        widths[r] = max(widths.get(r, 0), c + 1)
    return widths


def _x(row: int, column: int, widths: dict[int, int], width: int) -> float:
    """Each row centred in the picture."""
    row_w = widths[row] * (NODE_W + GAP_X) - GAP_X
    return (width - row_w) / 2 + column * (NODE_W + GAP_X)


def _legend(picture: Picture, colours: dict[str, str], width: int) -> tuple[str, int]:
    items = [(f'<rect data-legend-kernel="{escape(k)}" width="12" height="12" fill="{colours[k]}" stroke="#555"/>', k)
             for k in picture.kernels]
    kinds = {node.kind for node in picture.nodes} - {"kernel"}
    for kind in ("input", "constant", "extern", "none"):
        if kind in kinds:
            fill, stroke, _, text = KIND_STYLE[kind]
            dash = ' stroke-dasharray="3,2"' if kind == "none" else ""
            items.append((f'<rect data-legend-kind="{kind}" width="12" height="12" fill="{fill}" stroke="{stroke}"'
                          f' stroke-width="1.5"{dash}/>', text))
    items.append(('<rect width="12" height="12" fill="#fff" stroke="#000" stroke-width="3"/>', "graph output"))
    per_row = max(1, (width - 2 * MARGIN) // LEGEND_ITEM_W)
    parts = []
    for i, (swatch, text) in enumerate(items):
        x, y = MARGIN + (i % per_row) * LEGEND_ITEM_W, MARGIN + (i // per_row) * LEGEND_ROW_H
        label = f'<text x="17" y="10">{escape(_clip(text, 44))}</text>'
        parts.append(f'<g transform="translate({x},{y})">{swatch}{label}</g>')
    rows = (len(items) + per_row - 1) // per_row
    return f'<g class="legend">{"".join(parts)}</g>', MARGIN + rows * LEGEND_ROW_H + 6


def _node(node: PictureNode, at: tuple[float, float], colours: dict[str, str]) -> str:
    x, y = at
    fill, stroke, ink, _ = KIND_STYLE.get(node.kind, KIND_STYLE["none"])
    title = f"{node.label}: {node.op}" + (f" -> {', '.join(node.kernels)}" if node.kernels else f" ({node.kind})")
    if node.kernels:
        stripe = NODE_W / len(node.kernels)
        body = "".join(f'<rect data-kernel="{escape(k)}" x="{x + i * stripe:.1f}" y="{y}" width="{stripe:.1f}" '
                       f'height="{NODE_H}" fill="{colours.get(k, "#eee")}"/>' for i, k in enumerate(node.kernels))
        stroke, ink = "#555", "#111"
    else:
        body = f'<rect x="{x}" y="{y}" width="{NODE_W}" height="{NODE_H}" fill="{fill}"/>'
    dash = ' stroke-dasharray="4,3"' if node.kind == "none" else ""
    border = 3 if node.output else 1.2
    kernels = escape(" ".join(node.kernels))
    return (f'<g class="node kind-{node.kind}" data-node="{escape(node.id)}" data-kernels="{kernels}">'
            f"<title>{escape(title)}</title>{body}"
            f'<rect x="{x}" y="{y}" width="{NODE_W}" height="{NODE_H}" fill="none" stroke="{stroke}" '
            f'stroke-width="{border}"{dash}/>'
            f'<text x="{x + 6}" y="{y + 15}" fill="{ink}" font-weight="bold">{escape(_clip(node.label, 21))}</text>'
            f'<text x="{x + 6}" y="{y + 30}" fill="{ink}">{escape(_clip(node.op, 22))}</text></g>')


def _edge(a: tuple[float, float], b: tuple[float, float]) -> str:
    x1, y1 = a[0] + NODE_W / 2, a[1] + NODE_H
    x2, y2 = b[0] + NODE_W / 2, b[1] - 2
    bend = (y2 - y1) / 2
    return (f'<path d="M{x1:.1f},{y1:.1f} C{x1:.1f},{y1 + bend:.1f} {x2:.1f},{y2 - bend:.1f} {x2:.1f},{y2:.1f}" '
            'fill="none" stroke="#8a8a8a" stroke-width="1" marker-end="url(#fw-arrow)"/>')


def _clip(text: str, length: int) -> str:
    return text if len(text) <= length else text[: length - 1] + "\u2026"


def bar_chart(labels: list[str], series: dict[str, list[float]], colours: dict[str, str],
              fmt: Callable[[float], str], title: str, width: int = 640, height: int = 150) -> str:
    """Stacked bars, one per label; each segment has a <title> tooltip. `series` name -> a value per label."""
    left, bottom, top = 64, 20, 10
    plot_w, plot_h = width - left - 8, height - bottom - top
    totals = [sum(values[i] for values in series.values()) for i in range(len(labels))]
    peak = max(totals, default=0) or 1
    step = plot_w / max(1, len(labels))
    parts = [f'<line x1="{left}" y1="{top + plot_h}" x2="{width - 8}" y2="{top + plot_h}" stroke="#999"/>',
             f'<text x="{left - 6}" y="{top + 9}" text-anchor="end">{escape(fmt(peak if any(totals) else 0))}</text>',
             f'<text x="{left - 6}" y="{top + plot_h}" text-anchor="end">0</text>']
    for i, label in enumerate(labels):
        base = top + plot_h
        for name, values in series.items():
            h = values[i] / peak * plot_h
            if h <= 0:
                continue
            base -= h
            parts.append(f'<rect x="{left + i * step + 1:.1f}" y="{base:.1f}" width="{max(1.0, step - 2):.1f}" '
                         f'height="{h:.1f}" fill="{colours.get(name, "#80b1d3")}">'
                         f"<title>{escape(f'{label} {name}: {fmt(values[i])}')}</title></rect>")
        if i % max(1, len(labels) // 6) == 0:
            parts.append(f'<text x="{left + i * step:.1f}" y="{height - 5}">{escape(label)}</text>')
    if not any(totals):
        parts.append(f'<text x="{left + plot_w / 2}" y="{top + plot_h / 2}" text-anchor="middle" fill="#777">'
                     "nothing in this period</text>")
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" font-family="system-ui, sans-serif" font-size="10">'
            f"<title>{escape(title)}</title>{''.join(parts)}</svg>")
