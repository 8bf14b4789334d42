"""Large graphs compile correctly (never timed here: bench/compile_scaling.py measures speed),
and the helpers that keep large compiles fast behave."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import compiler
from client.runtime import load
from compiler.fx_import import from_fx, run_eager
from compiler.gc_pause import paused_gc
from compiler.lowering.memo import signature
from compiler.lowering.values import Lazy
from tests.compare import assert_close_outputs


def long_chain(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> list[torch.Tensor]:
    """About 2,500 ATen nodes: pointwise ops in a row, a second input read by hundreds of them
    (some independent of the chain), skip connections, and a normalization every 40 steps."""
    h, back, outputs = x, [x] * 8, []
    for i in range(2000):
        kind = i % 8
        if kind == 0:
            h = h + y
        elif kind == 1:
            h = torch.tanh(h) * 0.9
        elif kind == 2:
            h = h * torch.sigmoid(y)  # sigmoid(y) depends on no step of the chain
        elif kind == 3:
            h = h + back[-5]
        elif kind == 4:
            h = torch.where(h > 0, h, y * 0.5)
        elif kind == 5:
            h = h - 0.25 * y
        elif kind == 6:
            h = torch.sin(h)
        else:
            h = F.layer_norm(h, (h.shape[-1],), w) if i % 40 == 7 else h.abs() - 0.5
        back = back[1:] + [h]
        if i % 500 == 499:
            outputs.append(h)
    return outputs + [h]


def test_a_few_thousand_node_chain_compiles_and_matches_eager():
    generator = torch.Generator().manual_seed(0)
    inputs = [torch.randn(4, 32, generator=generator), torch.randn(4, 32, generator=generator),
              torch.rand(32, generator=generator) + 0.5]
    graph = from_fx(make_fx(long_chain)(*inputs), inputs)
    assert len(graph.nodes) > 2000
    artifact = compiler.compile(graph, "cpu", {"autotune": False, "benchmark_fusion": False})
    assert_close_outputs(load(artifact)(*inputs), run_eager(graph, inputs))
    fusion = artifact.manifest["fusion"]
    assert len(artifact.manifest["kernels"]) < len(graph.nodes) / 10  # fusion did its work
    assert len(fusion["refused"]) < 2 * len(graph.nodes)  # pairs that would close a cycle are not listed


def test_signatures_tell_apart_what_meta_kernels_might():
    op = torch.ops.aten.add.Tensor
    x = Lazy((4, 8), "float32", lambda ops, index: None)
    same = Lazy((4, 8), "float32", lambda ops, index: None)
    assert signature(op, [x, 1], {}) == signature(op, [same, 1], {})
    assert len({signature(op, [x, v], {}) for v in (1, 1.0, True, 0.0, -0.0)}) == 5
    assert signature(op, [x, 1], {}) != signature(op, [Lazy((4, 8), "bfloat16", x.load), 1], {})
    assert signature(op, [x, 1], {}) != signature(op, [x], {"alpha": 1})
    assert signature(op, [x, object()], {}) is None  # unknown kinds of argument are never shared


def test_paused_gc_restores_the_collector():
    @paused_gc
    def stage(fail: bool) -> bool:
        if fail:
            raise ValueError("boom")
        return gc.isenabled()

    assert gc.isenabled()
    assert stage(False) is False and gc.isenabled()
    with pytest.raises(ValueError):
        stage(True)
    assert gc.isenabled()
    gc.disable()
    try:
        stage(False)
        assert not gc.isenabled()  # a caller's own pause is left alone
    finally:
        gc.enable()
