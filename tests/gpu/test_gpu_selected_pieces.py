"""On a GPU: a cat of many like pieces read through a pointer chosen per element
(KernelWriter.load_selected) runs from its cubins and matches eager, as StableLM's rotary
embedding over its 16 per-head LayerNorms, and under a pad's mask.

Skipped without CUDA (CPU CI); run on the device machine:
    python -m pytest -q tests/gpu
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import compiler
from client.cubin import cuda_target
from client.runtime import load
from compiler.fx_import import from_fx
from tests.gpu.test_gpu_cubins import no_triton_compiler  # noqa: F401  (a fixture)
from tests.lowering_cases import kernel_sources
from tests.test_selected_pieces import per_head_rotary, selected_pointers

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def compiled(fn, *inputs):
    artifact = compiler.compile(from_fx(make_fx(fn)(*inputs), list(inputs)), cuda_target())
    assert selected_pointers(kernel_sources(artifact)) >= 1
    return load(artifact)


def test_per_head_pieces_in_bf16(no_triton_compiler):  # noqa: F811
    generator = torch.Generator(device="cuda").manual_seed(0)
    heads = [torch.randn(2, 1, 333, 64, device="cuda", generator=generator).to(torch.bfloat16) for _ in range(16)]
    cos, sin = (torch.randn(333, 64, device="cuda", generator=generator).to(torch.bfloat16) for _ in range(2))
    got = compiled(per_head_rotary, cos, sin, *heads)(cos, sin, *heads)
    want = per_head_rotary(cos.float(), sin.float(), *(h.float() for h in heads)).to(torch.bfloat16)
    torch.testing.assert_close(got[0], want, rtol=2e-2, atol=2e-2)


def test_pieces_under_a_pad(no_triton_compiler):  # noqa: F811
    def fn(*xs):
        return F.pad(torch.cat(xs, 2), (1, 2, 0, 1)) * 3

    generator = torch.Generator(device="cuda").manual_seed(1)
    pieces = [torch.randn(3, 5, 7, device="cuda", generator=generator).transpose(0, 1) for _ in range(5)]
    torch.testing.assert_close(compiled(fn, *pieces)(*pieces)[0], fn(*pieces))
