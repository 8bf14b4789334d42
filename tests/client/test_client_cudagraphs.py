"""CUDA-graph mode's parts that need no GPU: which inputs a graph writes, what cannot be captured
known from the plan, the setting, and a CPU run that says why it was not captured. The capture
and replay themselves are tested on a GPU (tests/gpu/test_gpu_cudagraphs.py)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from client.backend import BackendSettings, FusewireWarning, backend
from client.cudagraphs import capture_blocker, mutated_inputs
from client_helpers import TOKEN


def test_mutated_inputs_are_the_placeholders_a_node_writes():
    def step(weight, stats, x):
        stats.mul_(0.9).add_(x.mean(0), alpha=0.1)
        return (x @ weight,)

    gm = make_fx(step)(torch.randn(3, 3), torch.randn(3), torch.randn(4, 3))
    assert mutated_inputs(gm) == {1}

    def pure(weight, x):
        return (x @ weight,)
    assert mutated_inputs(make_fx(pure)(torch.randn(3, 3), torch.randn(4, 3))) == set()


def _plan(*targets: str, args: list | None = None) -> dict:
    return {"steps": [{"op": "extern", "target": t, "args": args or [], "kwargs": {}, "outputs": []} for t in targets]}


@pytest.mark.parametrize("target, blocked", [
    ("aten.mm.default", False),
    ("aten._scaled_dot_product_flash_attention.default", False),
    ("aten.native_dropout.default", False),
    ("aten.nonzero.default", True),
    ("aten._local_scalar_dense.default", True),
    ("aten.masked_select.default", True),
    ("aten.unique_consecutive.default", True),
])
def test_host_syncing_extern_calls_block_the_capture(target, blocked):
    reason = capture_blocker(_plan("aten.mm.default", target))
    assert (reason is not None) == blocked
    if blocked:
        assert target in reason and "host" in reason


def test_a_host_tensor_argument_blocks_the_capture():
    reason = capture_blocker(_plan("aten.index_select.default", args=[{"device": "cpu"}]))
    assert reason is not None and "aten.index_select.default" in reason


def test_the_setting_comes_from_the_environment_or_the_argument(monkeypatch, tmp_path):
    monkeypatch.setenv("FUSEWIRE_CUDA_GRAPHS", "1")
    assert BackendSettings.from_env().cuda_graphs is True
    assert BackendSettings.from_env(cuda_graphs=False).cuda_graphs is False
    monkeypatch.setenv("FUSEWIRE_CUDA_GRAPHS", "no")
    assert BackendSettings.from_env().cuda_graphs is False
    assert backend(cuda_graphs=True, cache_dir=tmp_path).settings.cuda_graphs is True


def test_cpu_tensors_run_uncaptured_with_the_reason(api_server, tmp_path):
    """CUDA-graph mode on CPU tensors: the graph compiles and runs as usual, and the stats say why
    no CUDA graph was captured (never an error, never an eager fallback)."""
    be = backend(url=api_server.url, token=TOKEN, cache_dir=tmp_path, on_error="raise", cuda_graphs=True)

    def fn(x, y):
        return torch.softmax(x * 2 + y, dim=-1)

    compiled = torch.compile(fn, backend=be)
    x, y = torch.randn(5, 7), torch.randn(5, 7)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FusewireWarning)
        for _ in range(3):
            torch.testing.assert_close(compiled(x, y), fn(x, y))
    assert be.stats["fallbacks"] == 0 and be.stats["cuda_graph_fallbacks"] == 1, be.stats
    assert list(be.uncaptured.values()) == ["its inputs are not all CUDA tensors"]


def test_copied_inputs_are_checked_for_overlap_after_broadcast_dims_are_dropped():
    from client.cudagraphs import _distinct, _overlaps

    x = torch.randn(8, 12)
    assert not any(_overlaps(t) for t in (x, x.t(), x[:, 2:5], x[::2, 1:], x.unsqueeze(1)))
    assert _overlaps(x.as_strided((5, 4), (1, 1))) and _overlaps(x.as_strided((3, 4), (3, 1)))
    row = torch.randn(33)
    expanded = row.expand(7, 33)
    assert _overlaps(expanded) and not _overlaps(_distinct(expanded))
    assert torch.equal(_distinct(expanded), row)


# -- the runner's bookkeeping, on CPU: a stand-in for CUDA's capture ---------------------------
#
# What a capture records is stood in for by the runner's closure over the tensors it was captured
# with: a replay recomputes into the same output buffers (the graph's pool) from the same inputs
# (placeholders or in-place inputs), as a CUDA graph does. The real capture runs in
# tests/gpu/test_gpu_cudagraphs.py; these check which inputs are copied, when outputs are copied
# out, and when a graph must not replay, on every CI run.


class _Capture:
    active: "_Capture | None" = None

    def replay(self) -> None:
        self.recompute()


class _PoolRunner:
    """A runner whose outputs live in buffers made at its capture (its pool): out = x * 2 + 1."""

    plan = {"steps": []}

    def __init__(self) -> None:
        self.buffers: list[torch.Tensor] = []

    def run_checked(self, inputs):
        (x,) = inputs
        if _Capture.active is None:
            return [x * 2 + 1]
        out = torch.empty_like(x)
        self.buffers.append(out)
        _Capture.active.recompute = lambda: torch.add(x * 2, 1, out=out)
        return [out]

    def constant_pointers(self, device):
        return set()


@pytest.fixture
def stand_in_capture(monkeypatch):
    import contextlib

    @contextlib.contextmanager
    def graph(capture, pool=None):
        _Capture.active = capture
        try:
            yield
        finally:
            _Capture.active = None

    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Capture)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", object)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)


def _runner(group=None):
    from collections import Counter

    from client.cudagraphs import GraphedRunner

    stats, reasons = Counter(), []
    return GraphedRunner(_PoolRunner(), set(), reasons.append, lambda name: stats.update([name]), group), stats


def test_outputs_kept_past_the_next_call_are_copied_out_the_rest_are_pool_views(stand_in_capture):
    run, stats = _runner()
    inputs = [torch.randn(9) for _ in range(8)]
    kept = []
    for i, x in enumerate(inputs):
        (out,) = run.run_checked([x])
        torch.testing.assert_close(out, x * 2 + 1)
        if i % 2 == 0:
            kept.append((out, x))  # every other output is kept
    for out, x in kept:
        torch.testing.assert_close(out, x * 2 + 1)  # none overwritten by a later replay
    assert stats["cuda_graphs_captured"] >= 1 and stats["cuda_graph_replays"] >= 4, stats


def test_a_graph_never_replays_over_a_later_graphs_outputs(stand_in_capture):
    from client.cudagraphs import CaptureGroup

    group = CaptureGroup()
    (a, a_stats), (b, b_stats) = _runner(group), _runner(group)
    for _ in range(4):
        a.run_checked([torch.randn(9)])
        b.run_checked([torch.randn(9)])
    assert group.members == [a, b]
    y = torch.randn(9)
    (kept,) = b.run_checked([y])
    assert kept.data_ptr() == b.runner.buffers[-1].data_ptr()  # a view of b's pool
    for _ in range(2):  # a's pool memory may be where kept is: a runs plainly
        a.run_checked([torch.randn(9)])
    assert a_stats["cuda_graph_plain_runs"] == 2
    x = torch.randn(9)
    torch.testing.assert_close(a.run_checked([x])[0], x * 2 + 1)  # then a is captured again, after b
    assert group.members == [b, a] and a_stats["cuda_graphs_captured"] == 2
    torch.testing.assert_close(kept, y * 2 + 1)
    del kept
    replays = b_stats["cuda_graph_replays"]
    b.run_checked([torch.randn(9)])
    assert b_stats["cuda_graph_replays"] == replays + 1  # a's outputs are dead: b replays
