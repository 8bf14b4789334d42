"""The wire-graph corpus under tests/graphs (written by tests/graphs/generate.py).

    from tests.corpus import corpus_names, load_graph, corpus_inputs
    for name in corpus_names():
        graph = load_graph(name)
        inputs = corpus_inputs(name, seed=0)      # valid indices, targets, variances...

Loading graphs needs no torch; only `corpus_inputs` imports it.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from compiler.graph import Graph, parse_graph

if TYPE_CHECKING:
    import torch

GRAPHS_DIR = Path(__file__).resolve().parent / "graphs"
_NOT_GRAPHS = {"inputs"}


def corpus_names() -> list[str]:
    """Every graph in the corpus, sorted."""
    return sorted(p.stem for p in GRAPHS_DIR.glob("*.json") if p.stem not in _NOT_GRAPHS)


@lru_cache(maxsize=None)
def load_graph(name: str) -> Graph:
    """The named graph, parsed and validated (a frozen model: safe to share)."""
    path = GRAPHS_DIR / f"{name}.json"
    if not path.exists():
        raise KeyError(f"no corpus graph '{name}'; known: {', '.join(corpus_names())}")
    return parse_graph(path.read_bytes())


@lru_cache(maxsize=1)
def _all_ranges() -> dict[str, dict[str, list]]:
    return json.loads((GRAPHS_DIR / "inputs.json").read_text())


def input_ranges(name: str) -> dict[str, tuple[float, float]]:
    """Value ranges [low, high) by input name for the inputs of `name` that need them."""
    return {input_name: (r[0], r[1]) for input_name, r in _all_ranges().get(name, {}).items()}


def corpus_inputs(name: str, seed: int = 0, device: str = "cpu") -> list["torch.Tensor"]:
    """Random inputs for the named graph, laid out with its strides, values in range."""
    from compiler.fx_import import random_inputs

    return random_inputs(load_graph(name), seed=seed, device=device, int_ranges=input_ranges(name))
