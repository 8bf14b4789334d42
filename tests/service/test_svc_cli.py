"""The `fusewire` command against a real stack: `up` starts redis-server + worker + API,
the other subcommands talk to it, SIGTERM stops everything."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from compiler.artifact import Artifact
from svc_helpers import ROOT, compiler_problem, free_port, make_graph, wait_for


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSEWIRE_") and k != "REDIS_URL"}
    env["PYTHONPATH"] = str(ROOT)
    return env | extra


def fusewire(*args, env=None, timeout=120, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "client.cli", *args], cwd=cwd or ROOT, env=env or clean_env(),
                          capture_output=True, text=True, timeout=timeout)


def leftovers(marker: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in cmdline:
                found.append(f"{entry.name}: {cmdline}")
    return found


@pytest.mark.timeout(240)
def test_up_status_compile_fetch_and_clean_stop(tmp_path):
    port = free_port()
    state_dir = tmp_path / "state"
    config = tmp_path / "config"  # `up` trusts its dev key in XDG_CONFIG_HOME: never ~/.config in tests
    log = open(tmp_path / "up.stderr", "w")
    up = subprocess.Popen([sys.executable, "-m", "client.cli", "--json", "up", "--port", str(port),
                           "--state-dir", str(state_dir)],
                          cwd=ROOT, env=clean_env(XDG_CONFIG_HOME=str(config)), stdout=subprocess.PIPE,
                          stderr=log, text=True, start_new_session=True)
    try:
        line = up.stdout.readline()
        assert line, f"fusewire up printed nothing: {(tmp_path / 'up.stderr').read_text()[-3000:]}"
        info = json.loads(line)
        assert info["url"] == f"http://127.0.0.1:{port}"
        assert info["trusted_in"] == str(config / "fusewire" / "trusted_keys")
        trust = Path(info["trusted_in"])
        assert info["key_id"] in trust.read_text() or trust.read_text().startswith("fusewire-ed25519 ")
        assert Path(info["signing_key"]).stat().st_mode & 0o077 == 0
        env = clean_env(FUSEWIRE_URL=info["url"], FUSEWIRE_TRUSTED_KEYS_FILE=str(trust))

        status = fusewire("--json", "status", env=env)
        assert status.returncode == 0, status.stdout + status.stderr
        report = json.loads(status.stdout)
        assert report["ready"] and report["redis"] and report["workers"][0]["queues"] == ["compile.cpu"]

        example = Path(info["example_graph"])
        assert example.exists()
        out = tmp_path / "example.fwa"
        compiled = fusewire("compile", str(example), "-o", str(out), "--json", env=env)
        if compiler_problem() is None:
            assert compiled.returncode == 0, compiled.stderr
            result = json.loads(compiled.stdout)
            assert out.stat().st_size == result["bytes"] and result["kernels"]
            fetched = fusewire("fetch", result["key"], "-o", str(tmp_path / "again.fwa"), env=env)
            assert fetched.returncode == 0 and (tmp_path / "again.fwa").read_bytes() == out.read_bytes()
            assert Artifact.from_bytes(out.read_bytes()).signature["key_id"] == info["key_id"]
            untrusting = fusewire("fetch", result["key"], "-o", str(tmp_path / "no.fwa"),
                                  env=clean_env(FUSEWIRE_URL=info["url"], XDG_CONFIG_HOME=str(tmp_path / "empty")))
            assert untrusting.returncode == 1 and "no trusted keys are configured" in untrusting.stderr
            assert not (tmp_path / "no.fwa").exists()
        else:
            assert compiled.returncode == 1 and "compile failed" in compiled.stderr, compiled.stderr

        bad = tmp_path / "bad.json"
        graph = make_graph(4)
        graph["nodes"][1]["target"] = "aten.nonsense.default"
        bad.write_text(json.dumps(graph))
        refused = fusewire("compile", str(bad), env=env)
        assert refused.returncode == 1
        assert "nodes[1] 'r'.target" in refused.stderr and "aten.nonsense.default" in refused.stderr
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            code = up.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
            raise
        log.close()
    assert code == 0, (tmp_path / "up.stderr").read_text()[-3000:]
    with pytest.raises(httpx.HTTPError):
        httpx.get(info["url"] + "/healthz", timeout=1)
    assert wait_for(lambda: not leftovers(str(state_dir)) and not leftovers(f"fusewire-up-{up.pid}@"), 10,
                    "stack processes to exit") is True


def test_status_of_a_missing_service_exits_2():
    result = fusewire("--json", "status", env=clean_env(FUSEWIRE_URL=f"http://127.0.0.1:{free_port()}"))
    assert result.returncode == 2 and json.loads(result.stdout)["reachable"] is False


def test_status_does_not_import_torch():
    code = "import sys, client.cli; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=clean_env()).returncode == 0


def test_compile_local_writes_an_artifact(tmp_path, needs_compiler):
    from compiler.artifact import Artifact

    graph = tmp_path / "g.json"
    graph.write_text(json.dumps(make_graph(6)))
    result = fusewire("--json", "compile", str(graph), "--local", "-o", str(tmp_path / "g.fwa"), timeout=300)
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    artifact = Artifact.from_bytes((tmp_path / "g.fwa").read_bytes())
    assert artifact.key == info["key"] and len(info["kernels"]) == len(artifact.manifest["kernels"])
    assert artifact.signature is None


def test_keygen_then_a_locally_compiled_artifact_signed_with_it_loads(tmp_path, needs_compiler):
    from client.runtime import load
    from compiler.fx_import import random_inputs, run_eager
    from compiler.graph import parse_graph
    from compiler.signing import TrustedKeys

    config = tmp_path / "config"
    made = fusewire("--json", "keygen", "-o", str(tmp_path / "k.pem"), "--trust",
                    env=clean_env(XDG_CONFIG_HOME=str(config)))
    assert made.returncode == 0, made.stderr
    info = json.loads(made.stdout)
    assert (tmp_path / "k.pem.pub").read_text().strip() == info["public"]
    again = fusewire("keygen", "-o", str(tmp_path / "k.pem"))
    assert again.returncode == 2 and "--force" in again.stderr  # never overwrites a key by accident
    graph = tmp_path / "g.json"
    graph.write_text(json.dumps(make_graph(7)))
    result = fusewire("compile", str(graph), "--local", "--sign-key", str(tmp_path / "k.pem"), "-o",
                      str(tmp_path / "g.fwa"), timeout=300)
    assert result.returncode == 0, result.stderr
    trusted = TrustedKeys.from_env({"XDG_CONFIG_HOME": str(config)})
    assert list(trusted.keys) == [info["key_id"]]
    wire = parse_graph(graph.read_bytes())
    inputs = random_inputs(wire, seed=0)
    got = load((tmp_path / "g.fwa").read_bytes(), tmp_path / "cache", trusted)(*inputs)
    for g, w in zip(got, run_eager(wire, inputs)):
        assert (g - w).abs().max() < 1e-5


def test_explain_prints_fusion_decisions(tmp_path, needs_compiler):
    graph = tmp_path / "g.json"
    graph.write_text(json.dumps(make_graph(6)))
    result = fusewire("explain", str(graph), timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()


def test_compile_local_reports_bad_graphs(tmp_path):
    graph = tmp_path / "g.json"
    bad = make_graph(6)
    bad["nodes"][0]["args"] = [{"ref": "missing"}, {"ref": "y"}]
    graph.write_text(json.dumps(bad))
    result = fusewire("compile", str(graph), "--local")
    assert result.returncode == 2
    assert "nodes[0] 's'.args[0]" in result.stderr and "missing" in result.stderr


def test_serve_with_several_workers_removes_its_metrics_folder_on_exit(tmp_path):
    port = free_port()
    env = clean_env(TMPDIR=str(tmp_path), FUSEWIRE_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")
    server = subprocess.Popen([sys.executable, "-m", "client.cli", "serve", "--workers", "2", "--port", str(port),
                               "--log-level", "warning"], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def answering():
            try:
                return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).status_code in (200, 503)
            except httpx.HTTPError:
                return False

        wait_for(answering, 60, "the API")
        assert list(tmp_path.glob("fusewire-metrics-*"))  # prometheus multiprocess mode, in a folder of its own
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=30)
    assert not list(tmp_path.glob("fusewire-metrics-*"))
