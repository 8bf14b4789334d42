"""On a GPU: a mixed-order LayerNorm backward (compiler/mixed_order.py) under every candidate config
autotuning tries with its loads issued steps ahead (config "loop_stages", Triton's software
pipeliner), each compiled with its candidates forced to that one, runs from its cubins and matches
eager.

Skipped without CUDA (CPU CI); run on the device machine:
    python -m pytest -q tests/gpu
"""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from client.cubin import cuda_target
from client.runtime import load
from compiler.autotune import candidate_configs
from compiler.codegen import generate
from compiler.fx_import import from_fx
from compiler.lowering import lower
from compiler.options import CompileOptions
from compiler.scheduler import schedule
from tests.compare import assert_within_eager_error
from tests.gpu.forced_candidates import compiled_with

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def layer_norm_backward(dy, x, mean, rstd, w, b):
    return torch.ops.aten.native_layer_norm_backward(dy, x, [x.shape[-1]], mean, rstd, w, b, [True, True, True])


def _inputs(rows: int, length: int) -> list[torch.Tensor]:
    torch.manual_seed(rows + length)  # the same data every run
    x = torch.randn(rows, length, device="cuda", dtype=torch.bfloat16)
    w, b = (torch.randn(length, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [length], w, b, 1e-5)
    return [torch.randn_like(x), x, mean, rstd, w, b]


def _check(artifact, fn, inputs: list[torch.Tensor]) -> None:
    got = load(artifact)(*[t.clone() for t in inputs])
    eager = fn(*inputs)
    reference = fn(*[t.double() for t in inputs])
    for i, (g, e, r) in enumerate(zip(got, eager, reference)):
        assert_within_eager_error(g.float(), e.float(), r, f"output {i}")


@pytest.mark.parametrize("rows, length", [(4096, 768), (16384, 96), (6304, 192)])
def test_every_pipelined_mixed_candidate_matches_eager(rows, length):
    inputs = _inputs(rows, length)
    graph = from_fx(make_fx(layer_norm_backward)(*inputs), inputs)  # traced on the GPU: float32 mean and rstd
    kernels = generate(schedule(lower(graph), CompileOptions(benchmark_fusion=False)), cuda_target()).kernels
    mixed = next(k for k in kernels if k.config.get("mix_rows"))
    pipelined = [c for c in candidate_configs(mixed, can_regenerate=True) if c.get("loop_stages", 1) > 1]
    assert pipelined
    for config in pipelined:
        artifact = compiled_with(graph, config, lambda c: bool(c.get("mix_rows")))
        (built,) = [k for k in artifact.manifest["kernels"] if k["config"].get("mix_rows")]
        assert built["config"] == config and "tl.range(" in artifact.kernel_source(built)
        _check(artifact, layer_norm_backward, inputs)
