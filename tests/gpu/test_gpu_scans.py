"""On a GPU: scan kernels (compiler/lowering/scans.py) run from their cubins under every candidate
config autotuning tries and match eager by Inductor's float64 rule: Mamba-2's segment sums (a
cumsum along a non-innermost dim between masked fills, an exp after it), rows in registers and
rows walked in a loop with a carry (a row of 20,000), a cumprod, bf16. Also a contraction spelled
as a broadcast multiply and a sum (compiler/lowering/contractions.py), run as a bmm.

Skipped without CUDA (CPU CI); run on the device machine:
    python -m pytest -q tests/gpu
"""

from __future__ import annotations

from typing import Callable, Iterator

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import compiler
import compiler.autotune as autotune
from client.cubin import cuda_target
from client.runtime import load
from compiler.codegen import generate
from compiler.fx_import import from_fx
from compiler.lowering import lower
from compiler.options import CompileOptions
from compiler.scheduler import schedule
from tests.compare import assert_within_eager_error
from tests.gpu.forced_candidates import compiled_with

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def segment_sums(x, outside):
    n = outside.shape[-1]
    spread = x[..., None].expand(*x.shape, n).masked_fill(outside, 0.0)
    return torch.exp(torch.cumsum(spread, -2).masked_fill(outside, float("-inf")))


def long_rows(x):
    return torch.cumsum(x, -1), torch.cumprod(1 + x / 4096, -1)


def _inputs(case: str) -> list[torch.Tensor]:
    torch.manual_seed(0)
    if case == "segment sums":
        return [torch.randn(2, 8, 3, 256, device="cuda"), ~torch.ones(256, 256, device="cuda", dtype=torch.bool).tril()]
    if case == "long rows":
        return [torch.randn(6, 20000, device="cuda")]
    return [torch.randn(64, 300, device="cuda", dtype=torch.bfloat16)]


def _every_config(fn: Callable, inputs: list[torch.Tensor]) -> Iterator[tuple[dict, list]]:
    """`fn` compiled with its one kernel forced to each of autotuning's candidates in turn."""
    graph = from_fx(make_fx(fn)(*inputs), inputs)
    (kernel,) = generate(schedule(lower(graph), CompileOptions(benchmark_fusion=False)), cuda_target()).kernels
    configs = autotune.candidate_configs(kernel, can_regenerate=True)
    assert len(configs) > 1
    for config in configs:
        artifact = compiled_with(graph, config, lambda c: True)
        assert "tl.cumsum" in "".join(artifact.kernel_source(k) for k in artifact.manifest["kernels"])
        yield config, load(artifact)(*inputs)


@pytest.mark.parametrize("case", ["segment sums", "long rows", "bf16"])
def test_every_scan_candidate_matches_eager(case):
    fn = {"segment sums": segment_sums, "long rows": long_rows}.get(case, lambda x: torch.cumsum(x, -1))
    inputs = _inputs(case)
    eager = fn(*inputs)
    eager = eager if isinstance(eager, tuple) else (eager,)
    reference = fn(*[t.double() if t.is_floating_point() else t for t in inputs])
    reference = reference if isinstance(reference, tuple) else (reference,)
    for config, outputs in _every_config(fn, inputs):
        for got, want, exact in zip(outputs, eager, reference):
            assert_within_eager_error(got.float(), want.float(), exact, f"{case} under {config}")


def test_a_contraction_runs_as_a_bmm():
    def states(c, b):
        return (c.unsqueeze(-1) * b.unsqueeze(2)).sum(3)

    torch.manual_seed(0)
    inputs = [torch.randn(2, 3, 256, 128, 8, device="cuda"), torch.randn(2, 3, 128, 8, 64, device="cuda")]
    artifact = compiler.compile(from_fx(make_fx(states)(*inputs), inputs), cuda_target(), {"benchmark_fusion": False})
    assert [s["target"] for s in artifact.plan["steps"] if s["op"] == "extern"] == ["aten.bmm.default"]
    (got,) = load(artifact)(*inputs)
    reference = states(*[t.double() for t in inputs])
    assert_within_eager_error(got, states(*inputs), reference, "the state products")
