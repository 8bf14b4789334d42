"""The partitioners the backend hands aot_autograd: with `min_cut`, a cross-entropy's backward reads
the low-precision logits and per-row numbers, never fp32 log-probabilities the forward had to write.
(The full training run through the service with min_cut is in test_client_backend.py.)"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch._dynamo.backends.common import aot_autograd

from client.partition import aot_options

ROWS, WIDTH, VOCAB = 48, 32, 500


def compiled_recording_backward(fn, partitioner: str, seen: list[tuple[tuple[int, ...], torch.dtype]]):
    """`fn` compiled through aot_autograd split by `partitioner`, each graph run as the fx module it
    is; (shape, dtype) of every tensor the backward receives goes into `seen`."""
    torch._dynamo.reset()

    def backward(gm, example_inputs):
        seen.extend((tuple(t.shape), t.dtype) for t in example_inputs if isinstance(t, torch.Tensor))
        return gm

    return torch.compile(fn, backend=aot_autograd(fw_compiler=lambda gm, _: gm, bw_compiler=backward,
                                                  **aot_options(partitioner)))


def backward_inputs(partitioner: str) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """(shape, dtype) of every tensor the backward graph receives, for a bf16 LM head + cross-entropy."""
    seen: list[tuple[tuple[int, ...], torch.dtype]] = []

    def head(x, weight, labels):
        logits = (x @ weight.t()).float()
        return F.cross_entropy(logits, labels)

    step = compiled_recording_backward(head, partitioner, seen)
    x = torch.randn(ROWS, WIDTH, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(VOCAB, WIDTH, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, VOCAB, (ROWS,))
    loss = step(x, weight, labels)
    loss.backward()
    expected = head(x.detach().requires_grad_(), weight, labels)
    torch.testing.assert_close(loss, expected)
    return seen


def test_min_cut_saves_the_logits_not_fp32_log_probabilities():
    default, min_cut = backward_inputs("save_all"), backward_inputs("min_cut")
    wide_fp32 = ((ROWS, VOCAB), torch.float32)
    assert wide_fp32 in default  # the default partition saves the log-probabilities
    assert wide_fp32 not in min_cut
    assert sum(torch.Size(s).numel() * d.itemsize for s, d in min_cut) < \
        sum(torch.Size(s).numel() * d.itemsize for s, d in default)


def test_each_partitioner_is_handed_to_aot_autograd():
    from torch._functorch.partitioners import default_partition

    from client.partition import save_all_partition

    assert aot_options("save_all") == {"keep_inference_input_mutations": True, "partition_fn": save_all_partition}
    assert "decompositions" not in aot_options("save_all") and save_all_partition is not default_partition
    options = aot_options("min_cut")
    assert options["partition_fn"] is not None and torch.ops.aten._log_softmax.default in options["decompositions"]


# -- joint-graph rewrites before the min-cut partition -----------------------------------------


def pool_step(pool: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor, partitioner: str = "min_cut"):
    """Output, input gradient and the backward's inputs of relu -> `pool`, through aot_autograd
    with `partitioner` (each graph run as the fx module it is)."""
    torch._dynamo.reset()
    seen: list[tuple[str, tuple[int, ...], torch.dtype]] = []

    def backward(gm, example_inputs):
        names = [p.name for p in gm.graph.find_nodes(op="placeholder")]
        seen.extend((n, tuple(t.shape), t.dtype) for n, t in zip(names, example_inputs) if isinstance(t, torch.Tensor))
        return gm

    def fn(x):
        return pool(torch.relu(x) * 1.5)

    step = torch.compile(fn, backend=aot_autograd(fw_compiler=lambda gm, _: gm, bw_compiler=backward,
                                                  **aot_options(partitioner)))
    x = x.detach().requires_grad_()
    out = step(x)
    out.backward(grad)
    return out, x.grad, seen


POOLS = [
    torch.nn.MaxPool2d(3, 2, 1),                   # ResNet's stem
    torch.nn.MaxPool2d(2),                         # stride = kernel, no padding
    torch.nn.MaxPool2d((3, 2), (1, 2), (1, 0)),    # overlapping rows, uneven window
    torch.nn.MaxPool2d(3, 2, 1, dilation=2),       # dilated
    torch.nn.MaxPool2d(3, 2, 0, ceil_mode=True),   # a last window past the edge
]


def test_max_pool_backward_gets_int8_window_offsets_and_same_gradients():
    torch.manual_seed(0)
    for pool in POOLS:
        x = torch.randn(2, 3, 11, 13)
        x[0, 0, :4, :4] = 0.25  # ties: the first maximum of a window wins, in both graphs
        grad = torch.randn_like(pool(x))
        out, x_grad, seen = pool_step(pool, x, grad)
        want_out, want_grad, default_seen = pool_step(pool, x, grad, "save_all")
        assert torch.equal(out, want_out) and torch.equal(x_grad, want_grad), pool
        assert any(dtype == torch.int64 and shape == tuple(out.shape) for _, shape, dtype in default_seen)
        assert not any(dtype == torch.int64 for _, _, dtype in seen), (pool, seen)
        assert any(dtype == torch.int8 and shape == tuple(out.shape) for _, shape, dtype in seen), (pool, seen)


def test_pool_backward_does_not_keep_the_pool_input_alive():
    """relu's output (the pool's input) is needed only for its shape by the pool's backward and
    for its sign by relu's: the backward gets a bool mask, not the bf16 tensor."""
    x = torch.randn(2, 4, 16, 16, dtype=torch.bfloat16)
    for pool in (torch.nn.MaxPool2d(3, 2, 1), torch.nn.AvgPool2d(2), torch.nn.AdaptiveAvgPool2d(1)):
        grad = torch.randn_like(pool(x))
        out, x_grad, seen = pool_step(pool, x, grad)
        _, want_grad, _ = pool_step(pool, x, grad, "save_all")
        torch.testing.assert_close(x_grad, want_grad)
        assert not any(shape == tuple(x.shape) and dtype == torch.bfloat16 for _, shape, dtype in seen), (pool, seen)


def released_by_the_backend(model: torch.nn.Module, x: torch.Tensor, cuda_graphs: bool = False) -> dict:
    """{"forward"/"backward": (placeholder names, positions the backend releases, whether each
    input shares its storage with another)} for one training step of `model`."""
    import tempfile

    from functorch.compile import make_boxed_func
    from torch.multiprocessing.reductions import StorageWeakRef

    from client.backend import Backend, BackendSettings, GraphFunction

    torch._dynamo.reset()
    backend = Backend(BackendSettings(url="http://unused", cache_dir=tempfile.mkdtemp(), cuda_graphs=cuda_graphs))
    seen: dict = {}

    def recorder(backward: bool):
        def compile_graph(gm, example_inputs):
            function = GraphFunction(backend, gm, "graph", backward)
            names = [node.name for node in gm.graph.find_nodes(op="placeholder")]
            storages = [StorageWeakRef(t.untyped_storage()) for t in example_inputs]
            shared = [storages.count(storage) > 1 for storage in storages]
            seen["backward" if backward else "forward"] = (names, function._released_inputs(example_inputs), shared)
            return make_boxed_func(gm)
        return compile_graph

    step = torch.compile(model, backend=aot_autograd(fw_compiler=recorder(False), bw_compiler=recorder(True),
                                                     **aot_options("min_cut")))
    step(x).sum().backward()
    return seen


class FusedAttention(torch.nn.Module):
    """q, k and v unbound from one projection: the attention's backward saves all three, views of
    one storage."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out = torch.nn.Linear(32, 96), torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(2, 8, 3, 2, 16).permute(2, 0, 3, 1, 4).unbind(0)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(F.gelu(attended.transpose(1, 2).reshape(2, 8, 32)))


def test_a_backward_releases_its_saved_activations_and_nothing_else():
    """Released: the backward's inputs the runner's dropping frees. Not parameters (primals_*), not
    incoming gradients (tangents_*), not views sharing a storage (q, k and v of one projection), and
    nothing of a forward or in CUDA-graph mode."""
    x = torch.randn(2, 8, 32, requires_grad=True)
    seen = released_by_the_backend(FusedAttention(), x)
    assert seen["forward"][1] == []
    names, released, shared = seen["backward"]
    assert released, names
    for i, name in enumerate(names):
        owned = name.startswith(("primals_", "tangents_"))
        assert (i in released) == (not owned and not shared[i]), (name, shared[i])
    assert any(shared[i] and not names[i].startswith(("primals_", "tangents_")) for i in range(len(names))), names
    assert released_by_the_backend(FusedAttention(), x, cuda_graphs=True)["backward"][1] == []


def rotary_step(partitioner: str, via_matmul: bool):
    """A rotary embedding as LLaMA-style models build it (angles = positions x inverse frequencies,
    `cat((angles, angles), -1)`, cos and sin applied to a projection): output, gradient, and the
    (shape, dtype) of every tensor the backward receives."""
    seen: list[tuple[tuple[int, ...], torch.dtype]] = []

    def fn(x, weight, inv_freq):
        positions = torch.arange(x.shape[1], dtype=torch.float32)
        if via_matmul:  # [1, F, 1] @ [1, 1, T]: a bmm over one column
            angles = (inv_freq[None, :, None].float() @ positions[None, None, :]).transpose(1, 2)
        else:
            angles = positions[None, :, None] * inv_freq.float()[None, None, :]
        emb = torch.cat((angles, angles), dim=-1)
        q = (x @ weight).view(x.shape[0], x.shape[1], -1, emb.shape[-1])
        cos, sin = emb.cos()[:, :, None].to(q.dtype), emb.sin()[:, :, None].to(q.dtype)
        half = q.shape[-1] // 2
        rotated = torch.cat((-q[..., half:], q[..., :half]), dim=-1)
        return q * cos + rotated * sin

    step = compiled_recording_backward(fn, partitioner, seen)
    torch.manual_seed(0)
    x = torch.randn(2, 37, 24, requires_grad=True)
    weight = torch.randn(24, 48)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 12, dtype=torch.float32) / 12))
    out = step(x, weight, inv_freq)
    out.backward(torch.randn_like(out))
    return out, x.grad, seen


def test_rotary_angles_are_recomputed_by_the_backward_not_saved():
    for via_matmul in (False, True):
        out, grad, seen = rotary_step("min_cut", via_matmul)
        want_out, want_grad, default_seen = rotary_step("save_all", via_matmul)
        assert torch.equal(out, want_out) and torch.equal(grad, want_grad)
        angles = ((1, 37, 24), torch.float32)
        assert angles in default_seen or ((1, 37, 1, 24), torch.float32) in default_seen
        assert not any(shape[:2] == (1, 37) for shape, _ in seen), (via_matmul, seen)


def test_a_repeated_concat_becomes_a_copy_only_where_the_layout_stays():
    from torch.fx.experimental.proxy_tensor import make_fx

    from client.partition import repeated_concats

    def fn(x):
        return torch.cat((x, x, x), dim=1) * 2

    x = torch.randn(2, 3, 5, 7)
    for layout, expected in ((torch.contiguous_format, 1), (torch.channels_last, 0)):
        gm = make_fx(fn, tracing_mode="fake")(x.to(memory_format=layout))
        assert repeated_concats(gm.graph) == expected, layout
        gm.recompile()
        assert torch.equal(gm(x.to(memory_format=layout)), fn(x))
        cats = [n for n in gm.graph.nodes if n.target is torch.ops.aten.cat.default]
        assert len(cats) == 1 - expected


# -- activation checkpointing --------------------------------------------------------------------


def checkpointed_dropout_step(partitioner: str | None):
    """(output, x's gradient, the op targets of both graphs) of a checkpointed block with two
    dropouts, compiled through aot_autograd with `partitioner` (None: eager), seeded alike."""
    from torch.utils.checkpoint import checkpoint

    def block(x, weight):
        h = F.dropout(torch.relu(x @ weight), p=0.3, training=True)
        return F.dropout(h.sin() * h, p=0.2, training=True)

    def fn(x, weight):
        return checkpoint(block, x, weight, use_reentrant=False).sum(-1)

    targets: list = []

    def recording(gm, _):
        targets.extend(node.target for node in gm.graph.nodes if node.op == "call_function")
        return gm

    if partitioner is not None:
        torch._dynamo.reset()
        fn = torch.compile(fn, backend=aot_autograd(fw_compiler=recording, bw_compiler=recording,
                                                    **aot_options(partitioner)))
    torch.manual_seed(3)
    x, weight = torch.randn(13, 24, requires_grad=True), torch.randn(24, 40, requires_grad=True)
    torch.manual_seed(4)
    out = fn(x, weight)
    out.backward(torch.linspace(-1, 1, 13))
    return out, x.grad, weight.grad, targets


def test_checkpointed_dropout_is_saved_not_recomputed_under_an_rng_state_op():
    """Recomputed, a checkpointed region's random ops would be wrapped in RNG-state ops no wire
    graph can hold (every graph of a checkpointed model with dropout fell back to eager); saved,
    the graphs hold plain ATen ops and the gradients are eager's exactly."""
    want_out, want_x, want_weight, _ = checkpointed_dropout_step(None)
    for partitioner in ("min_cut", "save_all"):
        out, grad_x, grad_weight, targets = checkpointed_dropout_step(partitioner)
        assert all(isinstance(t, torch._ops.OpOverload) or t is operator.getitem for t in targets), \
            (partitioner, [t for t in targets if not isinstance(t, torch._ops.OpOverload)])
        assert sum(t is torch.ops.aten.native_dropout.default for t in targets) == 2, partitioner  # drawn once
        assert torch.equal(out, want_out), partitioner
        torch.testing.assert_close(grad_x, want_x, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(grad_weight, want_weight, rtol=1e-5, atol=1e-6)
