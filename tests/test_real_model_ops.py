"""Ops that real models' training graphs hold and that must compile: extern calls that leave an
output out (convolution_backward for the first layer), random ops (with `eager_random`, dropout draws from
torch's generator exactly as eager does), fused attention with non-tensor outputs, dtypes kernels do not
compute in, and a PyTorch decomposition that disagrees with its op (never used)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from client.runtime import load
from compiler import compile
from compiler.fx_import import from_fx, run_eager
from compiler.graph import parse_graph
from compiler.lowering import LoweringError


def compiled(fn, *inputs):
    graph = from_fx(make_fx(fn)(*inputs), inputs)
    artifact = compile(graph, "cpu", {"eager_random": True})  # dropout's masks are compared with eager's
    return graph, artifact, load(artifact)


def extern_targets(artifact) -> list[str]:
    return [step["target"] for step in artifact.plan["steps"] if step["op"] == "extern"]


def test_convolution_backward_without_the_input_gradient():
    x, w, grad = torch.randn(2, 3, 9, 7), torch.randn(5, 3, 3, 3), torch.randn(2, 5, 7, 5)

    def fn(grad, x, w):
        _, grad_w, grad_b = torch.ops.aten.convolution_backward(
            grad, x, w, [5], [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [False, True, True])
        return grad_w * 2, grad_b

    graph, artifact, run = compiled(fn, grad, x, w)
    step = next(s for s in artifact.plan["steps"] if s["op"] == "extern")
    assert step["positions"] == [1]  # the bias gradient is a kernel's sum (lowering/convolution_bias.py)
    for got, want in zip(run(grad, x, w), run_eager(graph, [grad, x, w])):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("shapes, transposed", [
    (((2, 6, 9, 11), (4, 6, 3, 3), (4,)), False),   # conv2d
    (((2, 3, 5, 6, 4), (4, 3, 3, 3, 3), (4,)), False),  # conv3d
    (((2, 6, 13), (4, 6, 3), (4,)), False),         # conv1d
    (((2, 4, 5, 6), (4, 3, 3, 3), (3,)), True),     # transposed conv2d: the bias is per output channel
], ids=str)
def test_a_convolutions_bias_and_its_gradient_are_kernels(shapes, transposed):
    """cuDNN adds a bias in a separate ATen kernel and ATen sums its gradient in another: here the
    convolution and its backward run without the bias, whose add and sum fuse with their neighbours."""
    x, w, b = (torch.randn(*s) for s in shapes)
    stride, padding, zeros = [1] * (w.dim() - 2), [1] * (w.dim() - 2), [0] * (w.dim() - 2)

    def fn(x, w, b):
        y = torch.ops.aten.convolution(x, w, b, stride, padding, stride, transposed, zeros, 1)
        grad = torch.relu(y) * 0.5
        grad_x, grad_w, grad_b = torch.ops.aten.convolution_backward(
            grad, x, w, list(b.shape), stride, padding, stride, transposed, zeros, 1, [True, True, True])
        return y, grad_x, grad_w, grad_b

    graph, artifact, run = compiled(fn, x, w, b)
    externs = [s for s in artifact.plan["steps"] if s["op"] == "extern"]
    assert [s["target"] for s in externs] == ["aten.convolution.default", "aten.convolution_backward.default"]
    assert externs[0]["args"][2] is None and externs[1]["args"][10] == [True, True, False]
    for got, want in zip(run(x, w, b), run_eager(graph, [x, w, b])):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_backward_asking_only_for_the_bias_gradient_calls_no_aten_op():
    x, w, grad = torch.randn(2, 3, 9, 7), torch.randn(5, 3, 3, 3), torch.randn(2, 5, 7, 5)

    def fn(grad, x, w):
        return torch.ops.aten.convolution_backward(
            grad, x, w, [5], [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [False, False, True])[2]

    graph, artifact, run = compiled(fn, grad, x, w)
    assert extern_targets(artifact) == []
    torch.testing.assert_close(run(grad, x, w)[0], run_eager(graph, [grad, x, w])[0])


def test_channels_last_convolutions_plan_channels_last_results_and_the_ops_after_them_follow():
    """PyTorch's meta kernel plans a contiguous output for a channels-last convolution; cuDNN (and
    oneDNN here) return channels-last, so the plan says so (compiler/lowering/extern_layouts.py) and
    no result needs converting at run time. The ReLU after it and the gradients keep the layout."""
    cl = torch.channels_last
    x, w = torch.randn(2, 6, 9, 11).contiguous(memory_format=cl), torch.randn(4, 6, 3, 3).contiguous(memory_format=cl)
    grad = torch.randn(2, 4, 9, 11).contiguous(memory_format=cl)

    def fn(x, w, grad):
        y = torch.relu(torch.ops.aten.convolution(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1))
        grad_x, grad_w, _ = torch.ops.aten.convolution_backward(
            grad * (y > 0), x, w, [0], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False])
        return y, grad_x * 2, grad_w * 2

    graph, artifact, run = compiled(fn, x, w, grad)
    externs = [s for s in artifact.plan["steps"] if s["op"] == "extern"]
    planned = [layout["stride"] for step in externs for layout in step["layouts"]]
    assert planned == [[396, 1, 44, 4], [594, 1, 66, 6], [54, 1, 18, 6]]  # output, input and weight gradients
    outputs = run(x, w, grad)
    for got, want in zip(outputs, run_eager(graph, [x, w, grad])):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert got.is_contiguous(memory_format=cl)


@pytest.mark.parametrize("op", ["native_dropout", "bernoulli"])
def test_random_ops_draw_as_eager_does(op):
    p = 0.3
    x = torch.randn(257, 129)

    def fn(x):
        if op == "native_dropout":
            out, mask = torch.ops.aten.native_dropout(x, p, True)
            return out + 1, mask
        keep = torch.ops.aten.bernoulli.p(torch.empty_like(x), 1 - p)
        return x * keep / (1 - p) + 1, keep

    graph, artifact, run = compiled(fn, x)
    assert extern_targets(artifact)  # the random op is an ATen call; the arithmetic around it is a kernel
    assert artifact.manifest["kernels"]
    torch.manual_seed(7)
    got = run(x)
    torch.manual_seed(7)
    want = run_eager(graph, [x])
    torch.testing.assert_close(got[0], want[0])
    assert got[1].equal(want[1])  # the same seed gives the same mask
    kept = got[1].bool()
    assert abs((~kept).float().mean().item() - p) < 0.01  # 33153 draws: 0.01 is > 6 standard deviations
    torch.testing.assert_close(got[0][kept], x[kept] / (1 - p) + 1)
    torch.testing.assert_close(got[0][~kept], torch.ones_like(x[~kept]))
    torch.manual_seed(8)
    assert not run(x)[1].equal(got[1])  # another seed, another mask


def test_cpu_flash_attention_forward_and_backward_match_eager():
    q, k, v = (torch.randn(2, 4, 9, 16) for _ in range(3))
    grad = torch.randn(2, 4, 9, 16)

    def fn(q, k, v, grad):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad, q, k, v, out, lse, 0.0, True)
        return out, lse, dq, dk, dv

    graph, artifact, run = compiled(fn, q, k, v, grad)
    assert extern_targets(artifact) == ["aten._scaled_dot_product_flash_attention_for_cpu.default",
                                        "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"]
    for got, want in zip(run(q, k, v, grad), run_eager(graph, [q, k, v, grad])):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want)


def cudnn_attention_graph(outputs: list[dict]) -> dict:
    spec = {"dtype": "bfloat16", "shape": [2, 4, 8, 16]}
    return {"version": 1, "inputs": [{"name": n, **spec} for n in "qkv"],
            "nodes": [{"name": "a", "target": "aten._scaled_dot_product_cudnn_attention.default",
                       "args": [{"ref": "q"}, {"ref": "k"}, {"ref": "v"}, None, True, 0.0, True]},
                      {"name": "y", "target": "aten.mul.Tensor", "args": [{"ref": "a", "index": 0}, 2.0]}],
            "outputs": outputs}


def test_numbers_an_op_returns_are_static_values_and_absent_outputs_are_skipped():
    """cuDNN attention returns (out, lse, None, None, max_q, max_k, seed, offset, None): the numbers are
    shape-derived (meta kernels see no data), the Nones are outputs it leaves out."""
    graph = parse_graph(json.dumps(cudnn_attention_graph([{"ref": "y"}, {"ref": "a", "index": 1}])))
    artifact = compile(graph, "cpu")  # lowered and planned here; it runs on a CUDA device only
    step = next(s for s in artifact.plan["steps"] if s["op"] == "extern")
    assert step["positions"] == [0, 1, 6, 7]
    bad = parse_graph(json.dumps(cudnn_attention_graph([{"ref": "y"}, {"ref": "a", "index": 4}])))
    with pytest.raises(LoweringError, match=r"'a' is 8 here, not a tensor; graph outputs are tensors"):
        compile(bad, "cpu")


def test_ops_on_unsigned_wide_dtypes_run_as_aten_calls():
    x = torch.randint(0, 1000, (5, 7), dtype=torch.int64).to(torch.uint32)

    def fn(x):
        return x.to(torch.int64) + 1

    graph, artifact, run = compiled(fn, x)
    assert extern_targets(artifact) == ["aten._to_copy.default"]
    assert run(x)[0].equal(fn(x))


def test_fourier_token_mixing_runs_its_complex_ops_as_aten_calls_and_fuses_the_rest():
    """FNet mixes tokens by the real part of a 2D FFT of its hidden states (wire v1.2: complex dtypes),
    forward and backward; the residual add and LayerNorm around it are still kernels."""
    x = torch.randn(2, 9, 12, requires_grad=True)
    weight = torch.randn(12)

    def step(x, weight):
        mixed = torch.fft.fftn(x.to(torch.complex64), dim=(1, 2)).real
        y = F.layer_norm(x + mixed, (12,), weight)
        return torch.autograd.grad((y * y).sum(), x)[0], y

    graph, artifact, run = compiled(step, x, weight)
    assert any("fft" in target for target in extern_targets(artifact)), extern_targets(artifact)
    assert any(step["op"] == "kernel" for step in artifact.plan["steps"])
    for got, want in zip(run(x, weight), step(x, weight)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_complex_graph_inputs_and_outputs_travel():
    z = torch.randn(4, 6, dtype=torch.complex64)

    def fn(z, scale):
        return (z * scale).conj().resolve_conj(), torch.view_as_real(z).sum(-1) * scale

    scale = torch.randn(6)
    graph, artifact, run = compiled(fn, z, scale)
    assert [spec.dtype for spec in graph.inputs] == ["complex64", "float32"]
    assert parse_graph(json.dumps(graph.model_dump(mode="json"))) == graph
    for got, want in zip(run(z, scale), fn(z, scale)):
        torch.testing.assert_close(got, want)


def test_a_decomposition_whose_outputs_disagree_with_the_op_is_not_used(monkeypatch):
    """PyTorch's decomposition of the CPU flash attention returns the attention weights where the op
    returns a logsumexp. Attention ops always run as ATen calls; with that rule switched off, the
    check of every decomposition against the op's meta outputs still keeps the wrong one out."""
    from compiler.lowering import registry

    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    q = torch.randn(1, 2, 5, 8)
    assert registry.decomposition_for(op)(q, q, q, 0.0, False)[1].shape != op(q, q, q, 0.0, False)[1].shape
    monkeypatch.setattr(registry, "always_extern", lambda op: False)
    graph, artifact, run = compiled(lambda q: op(q, q, q, 0.0, False), q)
    assert extern_targets(artifact) == [str(op)]
    for got, want in zip(run(q), run_eager(graph, [q])):
        torch.testing.assert_close(got, want)
