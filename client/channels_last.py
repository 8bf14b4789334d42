"""Convolutions in channels-last layout: a rewrite of dynamo's graph before aot_autograd traces it.

cuDNN runs half-precision convolutions on tensor cores in NHWC ("channels-last") layout. Given
NCHW tensors, ATen's convolution converts them around every call: in ResNet-18's training step on an
H100, 111 `nchwToNhwcKernel` and 55 `nhwcToNchwKernel` launches took 1.2 of its 3.5 ms of GPU time.
Inductor avoids this by planning channels-last layouts for convolution outputs and the ops after
them. Here the same is done one stage earlier: each 2-d convolution reads channels-last copies of
its input and weight (`x.contiguous(memory_format=torch.channels_last)`, free for a tensor already in
that layout). ATen's convolution then returns channels-last; the elementwise ops, BatchNorm and
pooling after it keep that layout, and so does aot_autograd's trace of the backward: the saved
activations and their gradients are channels-last too. What is left to convert is the network's
input, the weights (small) and any graph output eager returns in another layout.

Values are unchanged, strides are not, so the rewrite is kept only where nothing can tell:
- no node reads strides (`as_strided`, `stride`, `data_ptr`, ...);
- the rewritten graph runs on fake tensors: a `view` that channels-last strides make impossible
  raises there, and the rewrite is undone;
- a graph output whose strides changed is converted back to eager's contiguous layout (an output of
  any other layout undoes the rewrite).

Which convolutions: "auto" (the default) rewrites those of float16/bfloat16 tensors, or under CUDA
autocast to those, on a GPU; "on" every 2-d convolution (tests run it on CPU); "off" none. Autocast is
either entered inside the compiled code (dynamo's `_enter_autocast` markers in the graph) or around
the call (`with torch.autocast(...): model(x)`, the usual training loop), where dynamo's graph has no
marker and the state is read as the backend runs, inside the caller's region. Missing the second
form left ResNet's stem convolution, reading the float32 images, in NCHW under autocast: its
BatchNorm, ReLU and max pool ran NCHW, with layout conversions around them.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch.fx import Graph, GraphModule, Node
from torch.utils import _pytree as pytree

from client.linear_groups import STRIDE_SENSITIVE

MODES = ("auto", "on", "off")
CONVS = (torch.conv2d, torch.nn.functional.conv2d)
HALF = (torch.float16, torch.bfloat16)
# calls whose result depends on their argument's strides: linear grouping's, and three that read a
# whole graph's tensors by their strides too
STRIDE_READERS = STRIDE_SENSITIVE | {"as_strided_scatter", "view_as_real", "view_as_complex"}


def use_channels_last(gm: GraphModule, example_inputs: Sequence[Any], mode: str = "auto") -> int:
    """Rewrites `gm` in place; returns how many convolutions now read channels-last tensors (0 when the
    graph has none to rewrite or the rewrite was undone)."""
    if mode not in MODES:
        raise ValueError(f"channels_last must be one of {MODES}, not {mode!r}")
    graph = gm.graph
    half_autocast = _in_half_autocast(graph, _ambient_half_autocast("cuda"))
    convs = [] if mode == "off" else [n for n in graph.nodes if _wanted(n, mode, half_autocast)]
    if not convs or _reads_strides(graph) or any(_symbolic(x) for x in example_inputs):
        return 0
    inserted: list[Node] = []
    for conv in convs:
        for position in (0, 1):  # input, weight
            inserted += _channels_last_arg(graph, conv, position)
    if not inserted:
        return 0
    try:  # the interpreter runs gm.graph: no recompile until the rewrite is kept
        outputs = _fake_outputs(gm, example_inputs)
    except Exception:  # an impossible view, an op fake tensors cannot run: keep eager's layouts
        _undo(gm, inserted)
        return 0
    if not _restore_output_layouts(gm, outputs, inserted):
        _undo(gm, inserted)
        return 0
    gm.recompile()
    return len(convs)


def _wanted(node: Node, mode: str, half_autocast: set[Node]) -> bool:
    if node.op != "call_function" or node.target not in CONVS or len(node.args) < 2:
        return False
    values = [_example(a) for a in node.args[:2]]
    if not all(isinstance(v, torch.Tensor) and v.dim() == 4 for v in values):
        return False
    if mode == "on":
        return True
    x = values[0]
    return x.device.type == "cuda" and (x.dtype in HALF or node in half_autocast)


def _ambient_half_autocast(device_type: str) -> bool:
    """Whether the code being compiled runs inside the caller's autocast region to float16/bfloat16
    on `device_type` (dynamo calls the backend within the caller's autocast state)."""
    return torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) in HALF


def _in_half_autocast(graph: Graph, ambient: bool = False, device_type: str = "cuda") -> set[Node]:
    """The nodes of dynamo's graph inside an autocast region to float16/bfloat16 on `device_type`:
    the regions the graph enters, and with `ambient` every node outside them (the caller's region)."""
    inside: set[Node] = set()
    regions: list[bool] = [ambient]
    for node in graph.nodes:
        name = getattr(node.target, "__name__", "")
        if name == "_enter_autocast":
            args = list(node.args)
            regions.append(len(args) >= 3 and args[0] == device_type and args[1] in HALF and bool(args[2]))
        elif name == "_exit_autocast" and len(regions) > 1:
            regions.pop()
        elif regions[-1]:
            inside.add(node)
    return inside


def _symbolic(value: Any) -> bool:
    if isinstance(value, torch.SymInt):
        return True
    return isinstance(value, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in (*value.shape, *value.stride()))


def _reads_strides(graph: Graph) -> bool:
    for node in graph.nodes:
        name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
        if node.op in ("call_method", "call_function") and name in STRIDE_READERS:
            return True
    return False


def _channels_last_arg(graph: Graph, conv: Node, position: int) -> list[Node]:
    arg = conv.args[position]
    if not isinstance(arg, Node):
        return []
    with graph.inserting_before(conv):
        converted = graph.call_method("contiguous", (arg,), {"memory_format": torch.channels_last})
    conv.update_arg(position, converted)
    return [converted]


def _example(value: Any) -> Any:
    return value.meta.get("example_value") if isinstance(value, Node) else value


def _fake_outputs(gm: GraphModule, example_inputs: Sequence[Any]) -> list[Any]:
    """The rewritten graph's flat outputs, run on fake tensors (sizes and strides, no data)."""
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    mode = detect_fake_mode(example_inputs) or FakeTensorMode(allow_non_fake_inputs=True)

    def fake(value: Any) -> Any:
        if isinstance(value, FakeTensor) and value.fake_mode is not mode:
            # a fake tensor of another mode (a capture on fake tensors, bench/model_capture.py): the
            # run reads sizes and strides only
            with mode:
                return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=value.device)
        if isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor):
            return mode.from_tensor(value)
        return value

    class FakeRun(torch.fx.Interpreter):
        def get_attr(self, target: str, args: Any, kwargs: Any) -> Any:
            return fake(super().get_attr(target, args, kwargs))

    with mode:
        result = FakeRun(gm).run(*[fake(x) for x in example_inputs])
    return pytree.tree_leaves(result)


def _restore_output_layouts(gm: GraphModule, outputs: list[Any], inserted: list[Node]) -> bool:
    """Converts graph outputs whose strides the rewrite changed back to eager's (contiguous) layout;
    False when one had another layout in eager."""
    graph = gm.graph
    output = graph.find_nodes(op="output")[0]
    leaves, spec = pytree.tree_flatten(output.args[0])
    if len(leaves) != len(outputs):
        return False
    changed = False
    for i, (leaf, now) in enumerate(zip(leaves, outputs)):
        eager = _example(leaf)
        if not isinstance(eager, torch.Tensor) or not isinstance(now, torch.Tensor):
            continue
        if _same_strides(eager, now):
            continue
        if not eager.is_contiguous():
            return False
        with graph.inserting_before(output):
            restored = graph.call_method("contiguous", (leaf,))
        inserted.append(restored)
        leaves[i], changed = restored, True
    if changed:
        output.args = (pytree.tree_unflatten(leaves, spec),)
    return True


def _same_strides(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal strides where they matter: a dim of size 1 may have any stride."""
    return a.shape == b.shape and all(size == 1 or x == y for size, x, y in zip(a.shape, a.stride(), b.stride()))


def _undo(gm: GraphModule, inserted: list[Node]) -> None:
    """Back to the graph dynamo gave (whose code was never regenerated)."""
    for node in reversed(inserted):
        node.replace_all_uses_with(node.args[0])
        gm.graph.erase_node(node)
