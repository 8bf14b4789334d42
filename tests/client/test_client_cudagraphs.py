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
