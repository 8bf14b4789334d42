"""Convolutions on channels-last tensors (client/channels_last.py): which graphs are rewritten, that
the forward and every gradient stay what eager computes, that aot_autograd's traces (saved
activations, gradients) are channels-last, that outputs keep eager's layout, and that a graph whose
strides something could observe is left alone. (ResNet, EfficientNet and ConvNeXt train through the
whole stack with the rewrite in tests/models/test_model_zoo.py.)"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._dynamo.backends.common import aot_autograd

from client.channels_last import use_channels_last
from client.partition import aot_options


class Block(nn.Module):
    """Odd sizes: a strided convolution, BatchNorm, ReLU, a depthwise convolution, a residual add,
    max pooling and a feature map returned beside the pooled features."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 12, 3, stride=2, padding=1, bias=False)
        self.norm = nn.BatchNorm2d(12)
        self.depthwise = nn.Conv2d(12, 12, 5, padding=2, groups=12)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = F.relu(self.norm(self.stem(x)))
        h = h + self.depthwise(h)
        return F.max_pool2d(h, 3, 2, 1), h.mean((2, 3))


class Flattening(nn.Module):
    """A `view` that channels-last strides make impossible."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).view(x.shape[0], -1)


def compile_rewritten(model: nn.Module, seen: dict, mode: str = "on"):
    """torch.compile with the rewrite before aot_autograd; `seen` gets its count and both graphs."""

    def backend(gm, example_inputs):
        seen["rewritten"] = use_channels_last(gm, example_inputs, mode)

        def keep(name):
            def compiler(graph, _):
                seen[name] = graph
                return graph
            return compiler

        return aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"),
                            **aot_options("min_cut"))(gm, example_inputs)

    torch._dynamo.reset()
    return torch.compile(model, backend=backend)


def image(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(1))


def channels_last(value: torch.Tensor) -> bool:
    return value.dim() == 4 and value.is_contiguous(memory_format=torch.channels_last) and not value.is_contiguous()


def same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal strides where they matter (a dim of size 1 may have any)."""
    return a.shape == b.shape and all(n == 1 or x == y for n, x, y in zip(a.shape, a.stride(), b.stride()))


def test_the_forward_and_every_gradient_match_eager_and_outputs_keep_eager_layouts():
    torch.manual_seed(0)
    model, seen = Block(), {}
    twin = Block()
    twin.load_state_dict(model.state_dict())
    x = image(2, 3, 17, 19)
    compiled_x, eager_x = x.clone().requires_grad_(), x.clone().requires_grad_()
    got = compile_rewritten(model, seen)(compiled_x)
    expected = twin(eager_x)
    assert seen["rewritten"] == 2
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
        assert same_layout(g, e)  # the pooled map comes back contiguous, as eager's
    sum(o.square().sum() for o in got).backward()
    sum(o.square().sum() for o in expected).backward()
    torch.testing.assert_close(compiled_x.grad, eager_x.grad, rtol=1e-4, atol=1e-5)
    for (name, p), (_, q) in zip(model.named_parameters(), twin.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
        assert same_layout(p.grad, q.grad), name
    torch.testing.assert_close(model.norm.running_mean, twin.norm.running_mean)


def test_aot_autograd_traces_the_convolutions_and_what_they_save_as_channels_last():
    seen = {}
    pooled, _ = compile_rewritten(Block(), seen)(image(2, 3, 17, 19).requires_grad_())
    pooled.sum().backward()  # aot_autograd compiles the backward at its first call
    convolutions = [n for n in seen["forward"].graph.nodes if n.target == torch.ops.aten.convolution.default]
    assert len(convolutions) == 2
    assert all(channels_last(n.meta["val"]) for n in convolutions)
    saved = [n.meta["val"] for n in seen["backward"].graph.find_nodes(op="placeholder")  # not the
             if not n.name.startswith("tangents")  # incoming gradients: outputs keep eager's layout
             and isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].shape[:2] == (2, 12)
             and n.meta["val"].dim() == 4]  # activations of the block's 12 channels, not weights
    assert saved and all(channels_last(v) for v in saved)


def test_a_view_that_channels_last_strides_forbid_undoes_the_rewrite():
    torch.manual_seed(0)
    model, seen = Flattening(), {}
    x = image(2, 3, 9, 11)
    got = compile_rewritten(model, seen)(x)
    assert seen["rewritten"] == 0
    assert not any(n.op == "call_method" and n.target == "contiguous" for n in seen["forward"].graph.nodes)
    torch.testing.assert_close(got, model(x))


def test_a_graph_reading_strides_is_left_alone():
    conv = nn.Conv2d(3, 4, 3)
    seen = {}
    compiled = compile_rewritten(lambda x: torch.as_strided(conv(x), (2, 4), (1, 2)), seen)
    compiled(image(1, 3, 5, 5))
    assert seen["rewritten"] == 0


def test_auto_rewrites_only_half_precision_convolutions_on_a_gpu_and_modes_are_checked():
    seen = {}
    compile_rewritten(Block(), seen, mode="auto")(image(2, 3, 9, 9))  # float32 on a CPU
    assert seen["rewritten"] == 0
    compile_rewritten(Block(), seen, mode="off")(image(2, 3, 9, 9))
    assert seen["rewritten"] == 0
    with pytest.raises(ValueError, match="channels_last must be one of"):
        use_channels_last(torch.fx.symbolic_trace(Flattening()), [image(1, 3, 5, 5)], "sometimes")


def test_the_backend_setting_is_validated():
    from client.backend import BackendSettings

    assert BackendSettings.from_env(url="http://x").channels_last == "auto"
    with pytest.raises(ValueError, match="channels_last must be one of"):
        BackendSettings.from_env(url="http://x", channels_last="always")


def test_convolutions_under_cuda_autocast_to_half_precision_are_recognised():
    """"auto" also rewrites float32 convolutions that CUDA autocast runs in bf16/fp16; which nodes
    those are is read from dynamo's autocast markers (the device itself needs a GPU)."""
    from client.channels_last import _in_half_autocast

    found = {}

    def backend(gm, example_inputs):
        inside = _in_half_autocast(gm.graph)
        found.update({n.name: n in inside for n in gm.graph.nodes if n.target is torch.conv2d})
        return gm.forward

    def fn(x, w):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = F.conv2d(x, w, padding=1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return F.conv2d(y.float(), w, padding=1)

    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # CUDA autocast on a machine without CUDA
        torch.compile(fn, backend=backend)(image(1, 3, 5, 5), image(3, 3, 3, 3))
    assert sorted(found.values()) == [False, True]


def test_convolutions_inside_the_callers_autocast_region_are_recognised():
    """Autocast entered around the compiled call (`with torch.autocast(...): model(x)`, as training
    loops do) leaves no marker in dynamo's graph: the state is read as the backend runs. A region
    inside the graph that turns autocast off still counts as off."""
    from client.channels_last import _ambient_half_autocast, _in_half_autocast

    found = {}

    def backend(gm, example_inputs):
        inside = _in_half_autocast(gm.graph, _ambient_half_autocast("cpu"), device_type="cpu")
        found.update({n.name: n in inside for n in gm.graph.nodes if n.target is torch.conv2d})
        return gm.forward

    def fn(x, w):
        y = F.conv2d(x, w, padding=1)
        with torch.autocast("cpu", enabled=False):
            return F.conv2d(y.float(), w, padding=1)

    for ambient in (True, False):
        torch._dynamo.reset()
        found.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=ambient):
            torch.compile(fn, backend=backend)(image(1, 3, 5, 5), image(3, 3, 3, 3))
        assert sorted(found.values()) == ([False, True] if ambient else [False, False]), (ambient, found)
