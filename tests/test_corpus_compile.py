"""Every corpus graph compiles and matches eager under Triton's interpreter,
with fusion on (the default) and off."""

from __future__ import annotations

import pytest

import compiler
from client.runtime import load
from compiler.fx_import import run_eager
from tests.compare import assert_close_outputs
from tests.corpus import corpus_inputs, corpus_names, load_graph


@pytest.mark.parametrize("name", corpus_names())
@pytest.mark.parametrize("fusion", [True, False], ids=["fused", "unfused"])
def test_corpus_graph_matches_eager(name: str, fusion: bool, signed) -> None:
    graph = load_graph(name)
    artifact = compiler.compile(graph, "cpu", {"fusion": fusion})
    run = load(signed(artifact))  # the bytes, as a client gets them
    for seed in (0, 1):
        inputs = corpus_inputs(name, seed=seed)
        expected = run_eager(graph, [t.clone() for t in inputs])
        assert_close_outputs(run(*inputs), expected, where=f"{name} seed {seed}")


def test_corpus_is_large_enough() -> None:
    assert len(corpus_names()) >= 25
