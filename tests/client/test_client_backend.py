"""The torch.compile backend against the real service (uvicorn API + Redis + Celery worker):
a transformer training step matches eager, a second process runs from the local cache
without the network, failures fall back to eager with one warning per graph (or raise),
and a new input shape compiles again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch._dynamo.exc import BackendCompilerFailed
from torch.fx.experimental.proxy_tensor import make_fx

from client.backend import FusewireError, FusewireWarning, LocalCache, backend, fusewire_backend
from compiler.artifact import Artifact
from client_models import Block, batch, pair, train
from client_helpers import TOKEN
from svc_helpers import ROOT

TOL = 1e-4


def assert_close(worst: dict) -> None:
    assert worst["loss"] < TOL and worst["params"] < TOL and worst["grads"] < TOL, worst


def no_fallbacks():
    """Turns every FusewireWarning into an error."""
    catcher = warnings.catch_warnings()
    catcher.__enter__()
    warnings.simplefilter("error", FusewireWarning)
    return catcher


def test_training_step_matches_eager_and_second_process_hits_local_cache(api_server, compiles, tmp_path):
    cache = tmp_path / "cache"
    be = backend(url=api_server.url, token=TOKEN, cache_dir=cache, on_error="raise")
    with warnings.catch_warnings():
        warnings.simplefilter("error", FusewireWarning)
        assert_close(train(be, steps=2))
    # model fw + bw, optimizer step (at least): all from the service, none eager
    assert be.stats["graphs"] >= 3 and be.stats["fallbacks"] == 0, be.stats
    assert be.stats["compiles"] + be.stats["remote_hits"] == be.stats["graphs"], be.stats
    assert len(list((cache / "artifacts").glob("*.fwa"))) == be.stats["graphs"]
    assert len(list((cache / "kernels").glob("*/*.py"))) > 0  # the runtime's kernel sources live there too
    # the backward's saved activations went to the service as released inputs, and it compiled with them
    options = [Artifact.from_bytes(path.read_bytes()).manifest["options"] for path in (cache / "artifacts").glob("*.fwa")]
    assert any(o.get("released_inputs") for o in options), options

    # a fresh process, same cache dir, the service unreachable and on_error="raise": any network use would fail it
    before = compiles()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(Path(__file__).parent)]), TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, str(Path(__file__).parent / "client_models.py"), str(cache),
                          f"http://127.0.0.1:{_closed_port()}"], env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert_close(report["worst"])
    stats = report["stats"]
    assert stats["local_hits"] == stats["graphs"] == be.stats["graphs"], stats
    assert "compiles" not in stats and "remote_hits" not in stats, stats
    assert compiles() == before


def test_service_down_runs_eagerly_with_one_warning_per_graph(closed_url, tmp_path):
    be = backend(url=closed_url, token=TOKEN, cache_dir=tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert_close(train(be, steps=2))
    ours = [str(w.message) for w in caught if issubclass(w.category, FusewireWarning)]
    assert len(ours) == be.stats["graphs"] == be.stats["fallbacks"] >= 3, ours
    assert all("runs eagerly" in m and "service unreachable" in m for m in ours), ours
    assert not list(tmp_path.glob("artifacts/*.fwa"))


def test_on_error_raise_raises(closed_url, tmp_path):
    model, _ = pair()
    compiled = torch.compile(model, backend=backend(url=closed_url, cache_dir=tmp_path, on_error="raise"))
    with pytest.raises(BackendCompilerFailed) as info:
        compiled(batch(0)[0])
    assert isinstance(info.value.__cause__, FusewireError) or "FusewireError" in str(info.value)
    assert "service unreachable" in str(info.value)


def test_new_input_shape_compiles_again_and_stays_correct(api_server, compiles, tmp_path):
    """Dynamo goes dynamic on the second shape; the backend specialises per concrete signature."""
    be = backend(url=api_server.url, token=TOKEN, cache_dir=tmp_path, on_error="raise")
    model, reference = pair(seed=3)
    compiled = torch.compile(model, backend=be)
    for seq in (8, 5, 7):
        x = batch(seq, seq=seq)[0]
        model.zero_grad()
        reference.zero_grad()
        out = compiled(x)
        out.square().mean().backward()
        ref = reference(x)
        ref.square().mean().backward()
        assert (out - ref).abs().max().item() < TOL
        assert max((a.grad - b.grad).abs().max().item() for a, b in zip(model.parameters(), reference.parameters())) < TOL
    # seq 8: static fw + bw; seq 5: dynamic fw + bw; seq 7: the dynamic graphs' second signature
    assert be.stats["recompiles"] == 2 and be.stats["fallbacks"] == 0, be.stats
    assert len(list(tmp_path.glob("artifacts/*.fwa"))) == 6


def test_guard_compiles_each_signature_once_and_keeps_them(api_server, tmp_path):
    """A graph called with other shapes/strides than it was compiled for compiles a variant for them."""
    gm = make_fx(lambda x, y: [torch.relu(x + y).sum(1), None, (x * y,)])(torch.randn(3, 4), torch.randn(3, 4))
    be = backend(url=api_server.url, token=TOKEN, cache_dir=tmp_path, on_error="raise")
    function = be.compile_graph(gm, [torch.randn(3, 4), torch.randn(3, 4)])
    for x, y in [(torch.randn(3, 4), torch.randn(3, 4)), (torch.randn(5, 4), torch.randn(5, 4)),
                 (torch.randn(4, 5).t(), torch.randn(5, 4)), (torch.randn(3, 4), torch.randn(3, 4))]:
        got = function([x, y])
        want = gm(x, y)
        assert got[1] is None and isinstance(got[2], tuple) and len(got) == 3
        torch.testing.assert_close(got[0], want[0])
        torch.testing.assert_close(got[2][0], want[2][0])
    assert len(function.variants) == 3 and be.stats["recompiles"] == 2, be.stats


def test_failed_job_falls_back_with_the_compiler_error(api_server, tmp_path):
    """Example inputs whose shapes do not broadcast: valid wire format, a compile that fails on the worker."""
    gm = make_fx(lambda x, y: x + y)(torch.randn(4, 3), torch.randn(4, 3))
    be = backend(url=api_server.url, token=TOKEN, cache_dir=tmp_path, timeout_s=60)
    with pytest.warns(FusewireWarning, match="the service's compile failed: .*broadcast"):
        function = be.compile_graph(gm, [torch.randn(7, 3), torch.randn(6, 3)])
    x = torch.randn(4, 3)
    torch.testing.assert_close(function([x, x]), x + x)  # eager from now on
    with pytest.raises(FusewireError, match="compile failed"):
        backend(url=api_server.url, token=TOKEN, cache_dir=tmp_path, on_error="raise").compile_graph(
            gm, [torch.randn(7, 3), torch.randn(6, 3)])


def test_service_errors_and_timeouts_fall_back(api_server, tmp_path):
    gm = make_fx(lambda x: torch.tanh(x) * 3)(torch.randn(2, 2))
    inputs = [torch.randn(11, 13)]  # a shape no other test compiles: not in the service's cache
    with pytest.warns(FusewireWarning, match="service error 403 forbidden"):
        backend(url=api_server.url, token="not-a-token", cache_dir=tmp_path).compile_graph(gm, inputs)
    def chain(x):  # enough work that no warm worker compiles it within the 10 ms allowed
        for i in range(40):
            x = torch.tanh(x * (1 + i / 100)).cumsum(-1) if i % 8 == 0 else torch.tanh(x * (1 + i / 100))
        return x

    slow = make_fx(chain)(torch.randn(2, 2))
    with pytest.warns(FusewireWarning, match="longer than timeout_s=0.01"):
        backend(url=api_server.url, token=TOKEN, cache_dir=tmp_path, timeout_s=0.01).compile_graph(slow, inputs)


def test_local_cache_is_verified_and_a_bad_entry_is_fetched_again(api_server, tmp_path):
    gm = make_fx(lambda x: torch.sigmoid(x) + 1)(torch.randn(2, 2))
    inputs = [torch.randn(6, 9)]
    first = backend(url=api_server.url, token=TOKEN, cache_dir=tmp_path, on_error="raise")
    first.compile_graph(gm, inputs)
    [entry] = tmp_path.glob("artifacts/*.fwa")
    key = entry.name.removesuffix(".fwa")
    assert LocalCache(tmp_path).get(key) == entry.read_bytes()
    assert entry.with_suffix(".fwa.sha256").read_text() == __import__("hashlib").sha256(entry.read_bytes()).hexdigest()
    assert not [p for p in entry.parent.iterdir() if p.name.endswith(".tmp")]

    entry.write_bytes(entry.read_bytes()[:-1] + b"!")  # bit rot
    assert LocalCache(tmp_path).get(key) is None and not entry.exists()
    again = backend(url=api_server.url, token=TOKEN, cache_dir=tmp_path, on_error="raise")
    function = again.compile_graph(gm, inputs)
    assert again.stats["remote_hits"] == 1 and entry.exists()
    torch.testing.assert_close(function(inputs), torch.sigmoid(inputs[0]) + 1)


def test_non_tensor_inputs_are_specialised(api_server, tmp_path):
    """Graphs with int inputs (dynamic shapes) are compiled per concrete value at call time."""
    def fn(x, n):
        return [x * n, n + 1]

    gm = torch.fx.symbolic_trace(fn)
    be = backend(url=api_server.url, token=TOKEN, cache_dir=tmp_path, on_error="raise")
    function = be.compile_graph(gm, [torch.randn(3, 3), 2])
    x = torch.randn(3, 3)
    got = function([x, 2])
    torch.testing.assert_close(got[0], x * 2)
    assert got[1] == 3
    got = function([x, 5])
    torch.testing.assert_close(got[0], x * 5)
    assert got[1] == 6 and len(function.variants) == 2


def test_registered_backend_name_and_options(closed_url, tmp_path):
    from importlib.metadata import entry_points

    [entry] = [e for e in entry_points(group="torch_dynamo_backends") if e.name == "fusewire"]
    assert entry.load() is fusewire_backend
    assert "fusewire" in torch._dynamo.list_backends()
    block = Block()
    x = batch(1)[0]
    compiled = torch.compile(block, backend="fusewire", options={"url": closed_url, "cache_dir": str(tmp_path)})
    with pytest.warns(FusewireWarning, match="service unreachable"):
        torch.testing.assert_close(compiled(x), block(x))


def _closed_port() -> int:
    from svc_helpers import free_port

    return free_port()


def test_min_cut_partitioner_trains_like_eager(api_server, tmp_path):
    be = backend(url=api_server.url, token=TOKEN, cache_dir=tmp_path / "cache", on_error="raise", partitioner="min_cut")
    assert_close(train(be, steps=2))
    assert be.stats["fallbacks"] == 0 and be.stats["graphs"] >= 3, be.stats


def test_unknown_partitioner_is_refused():
    with pytest.raises(ValueError, match="partitioner must be one of"):
        backend(url="http://127.0.0.1:1", partitioner="greedy")


def test_adamw_step_compiles_without_fallback_and_matches_eager(api_server, tmp_path):
    """Dynamo writes AdamW's `addcmul_(..., value=)` as Inductor's `prims.fma`; it travels as ATen's
    mul and add, so the optimizer's graph is compiled, not run eagerly."""
    be = backend(url=api_server.url, token=TOKEN, cache_dir=tmp_path / "cache", on_error="raise")
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(33, 17)), torch.nn.Parameter(torch.randn(17))]
    reference = [torch.nn.Parameter(p.detach().clone()) for p in params]
    compiled_opt = torch.optim.AdamW(params, lr=1e-2, foreach=False, fused=False)
    eager_opt = torch.optim.AdamW(reference, lr=1e-2, foreach=False, fused=False)
    step = torch.compile(compiled_opt.step, backend=be)
    for i in range(3):
        grads = [torch.randn_like(p) for p in params]
        for p, q, g in zip(params, reference, grads):
            p.grad, q.grad = g.clone(), g.clone()
        step()  # on_error="raise": a fallback would raise here
        eager_opt.step()
    for p, q in zip(params, reference):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert be.stats["fallbacks"] == 0 and be.stats["graphs"] >= 1, be.stats
