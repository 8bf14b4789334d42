"""Trust, against the real stack: an artifact swapped in Redis by someone who can write there
(digest updated to match, so the service's own check passes) is refused by the HTTP client,
the backend's local cache and the backend itself, and none of its code runs; a worker without
a signing key refuses to start. docs/TRUST.md describes the model."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from client.backend import FusewireError, FusewireWarning, LocalCache, backend
from client.http import ArtifactVerificationError, FusewireClient
from client_helpers import TOKEN
from compiler.artifact import Artifact, digest_of
from compiler.fx_import import from_fx
from compiler.graph import key as graph_key
from compiler.signing import generate_key, key_id, load_private_key, sign_artifact
from svc_helpers import ROOT


def _compiled_but_never_fetched(api_server, fn, inputs) -> tuple[torch.fx.GraphModule, str]:
    """Submits fn's graph and waits for it without fetching it (the API caches what it serves)."""
    gm = make_fx(fn)(*inputs)
    graph = from_fx(gm, inputs)
    with FusewireClient(api_server.url, TOKEN) as client:
        key = client.submit(graph, "cpu").key
        client.wait(key, timeout=120)
    assert key == graph_key(graph, "cpu")
    return gm, key


def _swap(store, key: str, blob: bytes) -> None:
    """What anyone with write access to Redis can do: bundle and digest replaced together."""
    store.redis.set(store.k("artifact", key), blob)
    store.redis.set(store.k("artifact", key, "digest"), digest_of(blob))


def _planted(blob: bytes, marker) -> Artifact:
    """The real artifact with a kernel source that writes `marker` when imported."""
    evil = Artifact.from_bytes(blob)
    source = evil.manifest["kernels"][0]["source"]
    evil.files[source] = f"open({str(marker)!r}, 'w').write('ran')\n".encode() + evil.files[source]
    evil.signature = None
    return evil


@pytest.mark.parametrize("forger", ["unsigned", "attacker_key", "reused_signature"])
def test_an_artifact_swapped_in_redis_is_refused_and_none_of_it_runs(api_server, store, tmp_path, forger):
    scale = {"unsigned": 3.0, "attacker_key": 5.0, "reused_signature": 7.0}[forger]  # a key per case
    gm, key = _compiled_but_never_fetched(api_server, lambda x: torch.cos(x) * scale, [torch.randn(5, 7)])
    honest_blob = store.get_artifact(key)[0]
    honest = Artifact.from_bytes(honest_blob)
    assert honest.signature is not None  # the worker signed it
    marker = tmp_path / "marker"
    evil = _planted(honest_blob, marker)
    if forger == "attacker_key":
        sign_artifact(evil, generate_key())
    elif forger == "reused_signature":  # the honest signature copied onto changed files
        evil.signature = honest.signature
    _swap(store, key, evil.to_bytes())

    with FusewireClient(api_server.url, TOKEN) as client, pytest.raises(ArtifactVerificationError):
        client.fetch_bytes(key)
    inputs = [torch.randn(5, 7)]
    with pytest.warns(FusewireWarning, match="failed verification"):
        function = backend(url=api_server.url, token=TOKEN, cache_dir=tmp_path / "a").compile_graph(gm, inputs)
    torch.testing.assert_close(function(inputs), torch.cos(inputs[0]) * scale)  # eager
    with pytest.raises(FusewireError, match="failed verification"):
        backend(url=api_server.url, token=TOKEN, cache_dir=tmp_path / "b", on_error="raise").compile_graph(gm, inputs)
    assert not marker.exists()
    assert not list(tmp_path.glob("*/artifacts/*.fwa"))  # nothing refused was cached


def test_a_forged_local_cache_entry_is_refused_and_fetched_again(api_server, tmp_path):
    gm = make_fx(lambda x: torch.sin(x) - 2)(torch.randn(2, 2))
    inputs = [torch.randn(4, 11)]
    backend(url=api_server.url, token=TOKEN, cache_dir=tmp_path, on_error="raise").compile_graph(gm, inputs)
    [entry] = tmp_path.glob("artifacts/*.fwa")
    marker = tmp_path / "marker"
    forged = _planted(entry.read_bytes(), marker)
    sign_artifact(forged, generate_key())
    blob = forged.to_bytes()
    entry.write_bytes(blob)  # someone who can write to this node's disk, digest file included
    entry.with_suffix(".fwa.sha256").write_text(digest_of(blob))
    key = entry.name.removesuffix(".fwa")
    assert LocalCache(tmp_path).get(key) is None and not entry.exists()
    again = backend(url=api_server.url, token=TOKEN, cache_dir=tmp_path, on_error="raise")
    function = again.compile_graph(gm, inputs)
    assert again.stats["remote_hits"] == 1
    torch.testing.assert_close(function(inputs), torch.sin(inputs[0]) - 2)
    assert not marker.exists()


def test_workers_sign_with_their_configured_key(api_server, store, settings):
    _, key = _compiled_but_never_fetched(api_server, lambda x: torch.tanh(x) + 0.5, [torch.randn(3, 13)])
    signature = Artifact.from_bytes(store.get_artifact(key)[0]).signature
    assert signature["key_id"] == key_id(load_private_key(settings.signing_key_file).public_key())


def test_a_worker_without_a_signing_key_refuses_to_start(settings, tmp_path):
    from svc_helpers import settings_env

    env = settings_env(settings)
    env.pop("FUSEWIRE_SIGNING_KEY_FILE")
    run = subprocess.run([sys.executable, "-m", "client.cli", "worker", "--target", "cpu"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "no signing key" in run.stderr, run.stderr[-2000:]
    env["FUSEWIRE_SIGNING_KEY_FILE"] = str(tmp_path / "missing.pem")
    run = subprocess.run([sys.executable, "-m", "client.cli", "worker", "--target", "cpu"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    # the message is wrapped to the terminal's width, possibly inside the path
    assert run.returncode == 2 and "missing.pem" in run.stderr.replace("\n", ""), run.stderr[-2000:]


def test_a_compile_task_without_a_signing_key_fails_with_the_reason(monkeypatch):
    from service.settings import get_settings
    from worker import tasks

    monkeypatch.delenv("FUSEWIRE_SIGNING_KEY_FILE", raising=False)
    get_settings.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="no signing key"):
            tasks._signing_key()
    finally:
        get_settings.cache_clear()
