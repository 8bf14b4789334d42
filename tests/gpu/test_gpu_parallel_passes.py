"""On a GPU: a gradient clip's global norm, its norms' first passes side by side in one launch
(compiler/parallel_passes.py), runs from its cubins and matches eager by the float64 rule.

Skipped without CUDA (CPU CI); run on the device machine:
    python -m pytest -q tests/gpu
"""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import compiler
from client.cubin import cuda_target
from client.runtime import load
from compiler.fx_import import from_fx
from tests.compare import assert_within_eager_error

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def clip_factor(*grads):
    norms = torch.stack([torch.linalg.vector_norm(g) for g in grads])
    return torch.clamp(1.0 / (torch.linalg.vector_norm(norms) + 1e-6), max=1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_global_norm_with_first_passes_side_by_side_matches_eager(dtype):
    torch.manual_seed(0)
    grads = [torch.randn(shape, device="cuda", dtype=dtype) * 1e-3
             for shape in ((2048, 2048), (1000, 3000), (4096,), (513, 1024))]
    artifact = compiler.compile(from_fx(make_fx(clip_factor)(*grads), grads), cuda_target())
    (kernel,) = [k for k in artifact.manifest["kernels"] if k["config"].get("parts")]
    assert len(kernel["config"]["parts"]) >= 2
    (got,) = load(artifact)(*grads)
    assert_within_eager_error(got.float(), clip_factor(*grads).float(), clip_factor(*[g.double() for g in grads]),
                              "clip factor")
