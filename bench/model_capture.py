"""The ATen graphs of real training code, captured as fusewire's torch.compile backend sees them,
on fake tensors: nothing is computed and no tensor memory is allocated, at any size.

    for captured in capture_source("llama", "bench"):      # CapturedGraph: source, name ("fw0", "bw0"), wire graph
        print(captured.name, len(captured.graph.nodes))

How: the model is built on the meta device (no weights are allocated or initialized), cast to
bf16 as bench/models.py casts it, and every parameter and buffer is swapped for a fake tensor
of the same layout (tied weights stay tied). The step then runs under that FakeTensorMode through
torch.compile with a backend that runs aot_autograd, as client/backend.py does, with forward and
backward compilers that record each fx graph and hand it back unchanged (without the backend's
grouping of linears over one input, client/linear_groups.py: the benchmark set stays the one
measured since run E). The backend's channels-last rewrite of convolutions (client/channels_last.py)
runs when asked (`channels_last`, default "off" for the same reason; bench/channels_last is
captured with "auto" on the GPU). Fake tensors, not meta
ones: a model on meta tensors fails (transformers' caches build real CPU tensors).

The fake tensors are CUDA ones where the machine has a GPU (CAPTURE_DEVICE), so dispatch makes the
GPU's choices: one fused-attention extern call for scaled_dot_product_attention, float32 saved
statistics for bf16 batch and layer norms. A CPU build of PyTorch can only fake CPU tensors, and
the CPU's choices differ (SDPA with a mask takes its math path; norms save bf16 statistics, which
CUDA's backward kernels refuse): bench/cases is captured on the GPU machine, the tiny twin in CI on
the CPU. At tiny sizes these fake captures are the very graphs that captures on real tensors give
(checked for every zoo model on the CPU).

Sources: the zoo's models (tests/models/zoo.py: forward, loss and backward of one step), and two
that are not transformers, forward graphs only: a CNN normalization block (Conv2d + BatchNorm2d in
train mode + ReLU, then GroupNorm + SiLU, NCHW) and an optimizer update (a global-norm gradient
clip, then AdamW with foreach=False and fused=False, in float32). The zoo's held-out models
(Mistral, GPT-NeoX, BLOOM, OPT, ConvNeXt, EfficientNet, Swin) are sources too, captured only when
named: they check that the set generalizes and are never part of it. So is `<model>_autocast` for
any zoo or held-out model: float32 weights, the step under torch.autocast to bf16 (mixed precision,
bench/held_out_autocast).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import _pytree as pytree

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(ROOT / "tests" / "models") not in sys.path:
    sys.path.append(str(ROOT / "tests" / "models"))  # `import zoo`, as tests/models/conftest.py arranges

from client.backend import with_an_output  # noqa: E402
from compiler.fx_import import from_fx  # noqa: E402
from compiler.graph import Graph  # noqa: E402
from zoo import HELD_OUT, ZOO, build, make_batch, step_loss  # noqa: E402

BF16 = torch.bfloat16
# Fake tensors on the GPU where there is one, so that dispatch makes the GPU's choices (fused
# attention, float32 saved statistics of bf16 norms); a CPU build can only fake CPU tensors.
CAPTURE_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@dataclass
class CapturedGraph:
    """One aot_autograd graph of a source: `name` is its kind ("fw" or "bw") and its position
    among the source's graphs of that kind ("fw0", "fw1", "bw0")."""

    source: str
    name: str
    graph: Graph

    @property
    def kind(self) -> str:
        return self.name[:2]


# ---------------------------------------------------------------------------------
# capture: dynamo + aot_autograd with recording compilers
# ---------------------------------------------------------------------------------


class GraphRecorder:
    """A torch.compile backend: aot_autograd whose compilers record (kind, GraphModule, example
    inputs) and return the GraphModule itself (boxed), so the step runs on, on the fake tensors.
    aot_autograd gets the arguments fusewire's backend gives it (the min-cut partition, BatchNorm
    statistics written in-graph), so the graphs are the ones the backend compiles. `channels_last`
    is the backend's setting of that name (client/channels_last.py); "off" keeps the set measured
    since run E, "auto" gives the graphs the backend compiles on a GPU today."""

    def __init__(self, channels_last: str = "off") -> None:
        self.graphs: list[tuple[str, torch.fx.GraphModule, list[Any]]] = []
        self.channels_last = channels_last

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
        from torch._dynamo.backends.common import aot_autograd

        from client.channels_last import use_channels_last
        from client.partition import aot_options

        use_channels_last(gm, example_inputs, self.channels_last)
        return aot_autograd(fw_compiler=self._recorder("fw"), bw_compiler=self._recorder("bw"),
                            **aot_options("min_cut"))(gm, example_inputs)

    def _recorder(self, kind: str) -> Callable:
        from torch._functorch.aot_autograd import make_boxed_func

        def record(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
            self.graphs.append((kind, gm, list(example_inputs)))
            return make_boxed_func(gm)  # aot_autograd calls compiled graphs with one list of inputs

        return record


def captured_graphs(source: str, recorder: GraphRecorder) -> list[CapturedGraph]:
    """The recorded graphs in wire format, named by kind and order ("fw0", "fw1", "bw0")."""
    counts: dict[str, int] = {}
    result = []
    for kind, gm, example_inputs in recorder.graphs:
        module, tensors = tensor_outputs_only(gm), list(example_inputs)
        if not any(n.op == "call_function" for n in module.graph.nodes):
            continue  # nothing to compile (the backend does not compile these either)
        module, _ = with_an_output(module)  # an update that only writes its inputs, as the backend sends it
        name = f"{kind}{counts.get(kind, 0)}"
        counts[kind] = counts.get(kind, 0) + 1
        result.append(CapturedGraph(source, name, from_fx(module, tensors)))
    return result


def tensor_outputs_only(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of `gm` whose output is the tuple of its tensor outputs, in order: what the backend
    converts (aot_autograd's outputs also hold None for gradients nobody asked for, and numbers)."""
    output = gm.graph.find_nodes(op="output")[0]
    leaves, _ = pytree.tree_flatten(output.args[0])
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    graph.graph_copy(gm.graph, env)
    graph.output(tuple(env[leaf] for leaf in leaves if _is_tensor_node(leaf)))
    return torch.fx.GraphModule(gm, graph)


def _is_tensor_node(leaf: Any) -> bool:
    return isinstance(leaf, torch.fx.Node) and isinstance(leaf.meta.get("val"), torch.Tensor)


def run_compiled(step: Callable[[Callable], None], compiled_of: Any, mode: ContextManager,
                 channels_last: str = "off") -> GraphRecorder:
    """Runs `step(compiled)` under `mode` (a FakeTensorMode; a null context runs it for real),
    `compiled` being torch.compile(compiled_of) with a fresh recorder as backend; dynamo's caches
    are reset before and after, so nothing leaks between captures.

    Dynamo's own decompositions are off: with them, `addcmul_`/`addcdiv_` with a value (AdamW's
    second moment) become `prims.fma`, a prim that torch._inductor registers and the wire format
    has no schema for, so the backend would run such a graph eagerly. Without them the same update
    is `aten.addcmul`. No other source here changes.

    Shapes are static (`dynamic=False`): where graph breaks make dynamo compile a frame again
    (Sequencer2D's blocks between the LSTMs it leaves to eager), its automatic dynamic shapes would
    give the second compile SymInt inputs, and such graphs cannot be cut into cases."""
    recorder = GraphRecorder(channels_last)
    torch._dynamo.reset()
    try:
        compiled = torch.compile(compiled_of, backend=recorder, dynamic=False)
        with mode, torch._dynamo.config.patch(enable_dynamo_decompositions=False):
            step(compiled)
    finally:
        torch._dynamo.reset()
    return recorder


# ---------------------------------------------------------------------------------
# fake modules and tensors
# ---------------------------------------------------------------------------------


def fake_module(model: nn.Module, mode: FakeTensorMode) -> nn.Module:
    """Swaps every parameter and buffer of `model` (built on meta) for a fake tensor of the
    same shape, strides and dtype; a tensor shared by two modules (tied weights) stays shared."""
    fakes: dict[int, torch.Tensor] = {}

    def fake(tensor: torch.Tensor, parameter: bool) -> torch.Tensor:
        if id(tensor) not in fakes:
            empty = fake_tensor(tensor.shape, tensor.dtype, mode, tensor.stride())
            fakes[id(tensor)] = nn.Parameter(empty, requires_grad=tensor.requires_grad) if parameter else empty
        return fakes[id(tensor)]

    for module in model.modules():
        for name, parameter in list(module._parameters.items()):
            if parameter is not None:
                module._parameters[name] = fake(parameter, True)
        for name, buffer in list(module._buffers.items()):
            if buffer is not None:
                module._buffers[name] = fake(buffer, False)
    return model


def fake_tensor(shape: Sequence[int], dtype: torch.dtype, mode: FakeTensorMode,
                stride: Sequence[int] | None = None) -> torch.Tensor:
    """An uninitialized fake tensor on CAPTURE_DEVICE (no memory behind it)."""
    with mode:
        if stride is None:
            return torch.empty(tuple(shape), dtype=dtype, device=CAPTURE_DEVICE)
        return torch.empty_strided(tuple(shape), tuple(stride), dtype=dtype, device=CAPTURE_DEVICE)


# ---------------------------------------------------------------------------------
# sources
# ---------------------------------------------------------------------------------


def capture_zoo_model(name: str, size: str, channels_last: str = "off", autocast: bool = False) -> list[CapturedGraph]:
    """Forward, loss and backward of one training step of a zoo model in bf16; with `autocast`,
    float32 weights and the step under torch.autocast to bf16 (mixed precision)."""
    with torch.device("meta"):
        model = build(name, size)
        if not autocast:
            model = model.to(dtype=BF16)
    mode = FakeTensorMode()
    fake_module(model, mode)
    batch = {key: fake_tensor(value.shape, value.dtype, mode) for key, value in make_batch(name, size).items()}

    def step(compiled: Callable) -> None:
        with torch.autocast(CAPTURE_DEVICE, dtype=BF16, enabled=autocast):
            loss = step_loss(compiled, name, batch)
        loss.backward()

    return captured_graphs(name, run_compiled(step, model, mode, channels_last))


class ConvNormBlock(nn.Module):
    """Conv2d -> BatchNorm2d (train mode) -> ReLU -> GroupNorm -> SiLU, as CNNs and diffusion UNets use them."""

    def __init__(self, channels: int, groups: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.batch_norm = nn.BatchNorm2d(channels)
        self.group_norm = nn.GroupNorm(groups, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.batch_norm(self.conv(x)))
        return F.silu(self.group_norm(x))


CNN_SIZES = {"tiny": dict(batch=2, channels=8, side=8, groups=4),
             "bench": dict(batch=32, channels=256, side=56, groups=32)}


def capture_cnn_norm(size: str, channels_last: str = "off") -> list[CapturedGraph]:
    """The training forward of ConvNormBlock in bf16 (parameters need gradients; backward is not run)."""
    dims = CNN_SIZES[size]
    with torch.device("meta"):
        block = ConvNormBlock(dims["channels"], dims["groups"]).train().to(dtype=BF16)
    mode = FakeTensorMode()
    fake_module(block, mode)
    images = fake_tensor((dims["batch"], dims["channels"], dims["side"], dims["side"]), BF16, mode)
    recorder = run_compiled(lambda compiled: compiled(images), block, mode, channels_last)
    graphs = captured_graphs("cnn_norm", recorder)
    return [g for g in graphs if g.kind == "fw"]


OPTIMIZER_SHAPES = {"tiny": [(16, 8), (4, 8), (8,)],
                    "bench": [(4096, 4096), (1024, 4096), (4096,)]}  # 16.8M, 4.2M and 4K float32 elements


def capture_optimizer(size: str, channels_last: str = "off") -> list[CapturedGraph]:
    """A global-norm gradient clip (clip_grad_norm_) and an AdamW step (foreach=False, fused=False) on
    float32 parameters; the optimizer's state is made up front (fake), as its first step would.
    There is no convolution: `channels_last` changes nothing."""
    mode = FakeTensorMode()
    params = [nn.Parameter(fake_tensor(shape, torch.float32, mode)) for shape in OPTIMIZER_SHAPES[size]]
    for param in params:
        param.grad = fake_tensor(param.shape, torch.float32, mode)
    optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, foreach=False, fused=False)
    with mode:
        for param in params:
            optimizer.state[param] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(param),
                                      "exp_avg_sq": torch.zeros_like(param)}

    def update() -> None:
        torch.nn.utils.clip_grad_norm_(params, max_norm=1.0, foreach=False)
        optimizer.step()

    return captured_graphs("adamw", run_compiled(lambda compiled: compiled(), update, mode))


SOURCES: dict[str, Callable[[str, str], list[CapturedGraph]]] = {
    **{name: (lambda size, channels_last, name=name: capture_zoo_model(name, size, channels_last)) for name in ZOO},
    "cnn_norm": capture_cnn_norm,
    "adamw": capture_optimizer,
}


# The zoo's held-out models (tests/models/zoo.py): captured only when named, never part of bench/cases.
# "<model>_autocast": any zoo or held-out model trained with mixed precision (float32 weights, the
# step under autocast to bf16), captured only when named (bench/held_out_autocast).
HELD_OUT_SOURCES: dict[str, Callable[[str, str], list[CapturedGraph]]] = {
    name: (lambda size, channels_last, name=name: capture_zoo_model(name, size, channels_last)) for name in HELD_OUT}
HELD_OUT_SOURCES.update({
    f"{name}_autocast": (lambda size, channels_last, name=name: capture_zoo_model(name, size, channels_last, autocast=True))
    for name in (*ZOO, *HELD_OUT)})


def capture_source(source: str, size: str, channels_last: str = "off") -> list[CapturedGraph]:
    """Every graph of one source ("gpt2", ..., "cnn_norm", "adamw", or a held-out model) at size
    "tiny" or "bench", its convolutions rewritten as the backend's `channels_last` setting would."""
    known = {**SOURCES, **HELD_OUT_SOURCES}
    if source not in known:
        raise KeyError(f"unknown source {source!r}; known: {', '.join(known)}")
    return known[source](size, channels_last)
