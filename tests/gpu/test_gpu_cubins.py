"""On a GPU: every corpus graph, compiled ahead of time for this GPU's arch (autotuned, with
benchmark-driven fusion), runs from its cubins without the Triton compiler and matches eager.

Skipped without CUDA (CPU CI); run on the device machine:
    python -m pytest -q tests/gpu
"""

from __future__ import annotations

import pytest
import torch

import compiler
from client.cubin import cuda_target
from compiler.artifact import Artifact
from compiler.fx_import import run_eager
from tests.compare import assert_close_outputs
from tests.corpus import corpus_inputs, corpus_names, load_graph

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def artifacts(signed) -> dict[str, bytes]:
    """Artifacts built on first use, one graph at a time, signed as a worker signs them."""
    class Built(dict):
        def __missing__(self, name: str) -> bytes:
            # the defaults: autotuned, with benchmark-driven fusion, so every tuned and timed choice
            # (and timing itself, on random inputs) is checked against eager on the whole corpus
            self[name] = signed(compiler.compile(load_graph(name), cuda_target()))
            return self[name]
    return Built()


@pytest.fixture
def no_triton_compiler(monkeypatch):
    """Any attempt to compile Triton source fails the test."""
    import triton
    import triton.compiler.compiler as triton_compiler
    from triton.runtime.jit import JITFunction

    def forbidden(*args, **kwargs):
        raise AssertionError("the Triton compiler ran while loading or running cubins")

    monkeypatch.setattr(triton, "compile", forbidden)
    monkeypatch.setattr(triton_compiler, "compile", forbidden)
    monkeypatch.setattr(JITFunction, "run", forbidden)


@pytest.mark.parametrize("name", corpus_names())
def test_corpus_runs_from_cubins_and_matches_eager(name, artifacts, no_triton_compiler):
    from client.runtime import load

    artifact = Artifact.from_bytes(artifacts[name])
    assert all(k.get("cubin") for k in artifact.manifest["kernels"])
    run = load(artifact)
    graph = load_graph(name)
    for seed in (0, 1):
        inputs = corpus_inputs(name, seed=seed, device="cuda")
        expected = run_eager(graph, [t.clone() for t in inputs])
        assert_close_outputs(run(*inputs), expected, where=f"{name} seed {seed}")


def test_misaligned_and_mutated_inputs_run_on_aligned_copies(no_triton_compiler):
    """Kernels assume 16-byte aligned pointers: an input at an odd offset runs on an aligned copy,
    and an input the graph writes in place is written back."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from client.runtime import load
    from compiler.fx_import import from_fx

    def fn(x, acc):
        acc.add_(x * 2)
        return (x.exp() + acc,)

    x, acc = torch.randn(37, 29, device="cuda"), torch.randn(37, 29, device="cuda")
    run = load(compiler.compile(from_fx(make_fx(fn)(x.clone(), acc.clone()), [x, acc]), cuda_target()))
    storage_x, storage_acc = torch.randn(37 * 29 + 1, device="cuda"), torch.randn(37 * 29 + 3, device="cuda")
    odd_x, odd_acc = storage_x[1:].view(37, 29), storage_acc[3:].view(37, 29)  # 4 and 12 bytes past alignment
    odd_x.copy_(x)
    odd_acc.copy_(acc)
    expected_acc = acc.clone()
    expected = fn(x, expected_acc)[0]
    for _ in range(2):  # the second call runs the prepared program again
        odd_acc.copy_(acc)
        got = run(odd_x, odd_acc)[0]
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(odd_acc, expected_acc)


def test_dropout_drawn_in_cubins_and_embedding_gradients_by_atomic_adds(signed, no_triton_compiler):
    """Random numbers from Philox in the cubins (the default), and an embedding backward big enough
    for index_add_'s atomics (compiler/lowering/indexing.py), on the GPU."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from client.runtime import load
    from compiler.fx_import import from_fx

    rows, p = 50257, 0.1
    x = torch.randn(8, 1000, 64, device="cuda", dtype=torch.bfloat16)
    indices = torch.randint(0, rows, (8, 1000), device="cuda")

    def fn(x, indices):
        out, mask = torch.ops.aten.native_dropout(x, p, True)
        grad_weight = torch.ops.aten.embedding_dense_backward(out, indices, rows, -1, False)
        return out, mask, grad_weight

    artifact = Artifact.from_bytes(signed(compiler.compile(from_fx(make_fx(fn)(x, indices), [x, indices]), cuda_target())))
    targets = [s["target"] for s in artifact.plan["steps"] if s["op"] == "extern"]
    assert targets == ["aten.randint.low", "aten.index_add_.default"], targets
    out, mask, grad_weight = load(artifact)(x, indices)
    assert abs((~mask).float().mean().item() - p) < 0.005
    torch.testing.assert_close(out, torch.where(mask, x.float() / (1 - p), 0).to(torch.bfloat16))
    want = torch.zeros(rows, 64, device="cuda", dtype=torch.float64).index_add_(0, indices.flatten(),
                                                                                out.double().flatten(0, 1))
    torch.testing.assert_close(grad_weight, want.to(torch.bfloat16), rtol=2e-2, atol=2e-2)


def test_a_depthwise_convolution_and_its_backward_in_bf16_match_eager_through_channels_last_calls(no_triton_compiler):
    """EfficientNet's block: depthwise conv, BatchNorm statistics, SiLU, and the conv's backward; the
    runtime calls the two convolutions on channels-last copies (cuDNN) and converts their results to
    the plan's NCHW layout (client/runtime.py channels_last_call)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from client.runtime import load
    from compiler.fx_import import from_fx

    generator = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(4, 48, 29, 31, device="cuda", generator=generator).to(torch.bfloat16)
    w = torch.randn(48, 1, 5, 5, device="cuda", generator=generator).to(torch.bfloat16)
    grad = torch.randn(4, 48, 15, 16, device="cuda", generator=generator).to(torch.bfloat16)

    def fn(x, w, grad):
        y = torch.ops.aten.convolution(x, w, None, [2, 2], [2, 2], [1, 1], False, [0, 0], 48)
        activated = torch.nn.functional.silu(y - y.float().mean((0, 2, 3), keepdim=True).to(y.dtype))
        grads = torch.ops.aten.convolution_backward(grad * activated, x, w, [0], [2, 2], [2, 2], [1, 1], False,
                                                    [0, 0], 48, [True, True, False])
        return activated, grads[0], grads[1]

    run = load(compiler.compile(from_fx(make_fx(fn)(x, w, grad), [x, w, grad]), cuda_target()))
    want = fn(x.double(), w.double(), grad.double())
    eager = fn(x, w, grad)
    for got, reference, own in zip(run(x, w, grad), want, eager):
        assert got.stride() == own.stride()
        error, eager_error = (got.double() - reference).abs().max(), (own.double() - reference).abs().max()
        assert error <= 2 * eager_error + 1e-2, (error, eager_error)
