"""`fusewire compile module:function` (and explain) against the real service: the function is
imported, traced with make_fx on its example inputs, submitted, and its artifact written."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from client.runtime import load
from client_helpers import TOKEN
from svc_helpers import ROOT

MODULE = '''
import torch

def mlp(x, w, b):
    return torch.nn.functional.gelu(x @ w + b).sum(-1)

def example_inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(5, 8, generator=g), torch.randn(8, 8, generator=g), torch.randn(8, generator=g)

def scaled(x):
    return torch.softmax(x * 3, dim=-1)

scaled.example_inputs = lambda: [torch.randn(3, 6)]

def no_inputs_here(x):
    return x
'''


def fusewire(tmp_path, *args, url):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSEWIRE_")}
    env.update(PYTHONPATH=str(ROOT), TRITON_INTERPRET="1", FUSEWIRE_URL=url, FUSEWIRE_TOKEN=TOKEN,
               FUSEWIRE_TRUSTED_KEYS_FILE=os.environ["FUSEWIRE_TRUSTED_KEYS_FILE"])  # the session workers' key
    return subprocess.run([sys.executable, "-m", "client.cli", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180)


def test_compile_module_function_remote_local_and_explain(api_server, tmp_path):
    (tmp_path / "mymodel.py").write_text(MODULE)
    remote = fusewire(tmp_path, "compile", "mymodel:mlp", "--json", url=api_server.url)
    assert remote.returncode == 0, remote.stderr
    result = json.loads(remote.stdout)
    artifact = (tmp_path / "mlp.fwa").read_bytes()
    assert result["output"] == "mlp.fwa" and result["bytes"] == len(artifact) and result["kernels"]

    sys.path.insert(0, str(tmp_path))
    try:
        import mymodel
    finally:
        sys.path.remove(str(tmp_path))
    inputs = mymodel.example_inputs()
    torch.testing.assert_close(load(artifact)(*inputs)[0], mymodel.mlp(*inputs), atol=1e-4, rtol=1e-4)

    local = fusewire(tmp_path, "--json", "compile", "mymodel.py:scaled", "--local", "-o", "s.fwa", url=api_server.url)
    assert local.returncode == 0, local.stderr
    assert json.loads(local.stdout)["output"] == "s.fwa" and (tmp_path / "s.fwa").exists()

    same = fusewire(tmp_path, "compile", "mymodel:mlp", "--local", "--json", "-o", "again.fwa", url=api_server.url)
    assert json.loads(same.stdout)["key"] == result["key"]  # the service's key is the one computed locally

    fetched = fusewire(tmp_path, "fetch", result["key"], "-o", "fetched.fwa", "--json", url=api_server.url)
    assert fetched.returncode == 0 and (tmp_path / "fetched.fwa").read_bytes() == artifact

    explained = fusewire(tmp_path, "explain", "mymodel:mlp", "--json", url=api_server.url)
    assert explained.returncode == 0, explained.stderr
    assert result["key"] in json.loads(explained.stdout)["explain"]


def test_compile_module_function_errors_say_what_to_do(api_server, tmp_path):
    (tmp_path / "mymodel.py").write_text(MODULE.replace("def example_inputs", "def other_inputs"))
    missing = fusewire(tmp_path, "compile", "mymodel:no_inputs_here", url=api_server.url)
    assert missing.returncode == 2 and "example_inputs" in missing.stderr, missing.stderr
    unknown = fusewire(tmp_path, "compile", "mymodel:nothing", url=api_server.url)
    assert unknown.returncode == 2 and "cannot import mymodel:nothing" in unknown.stderr
    nofile = fusewire(tmp_path, "compile", "graph.json", url=api_server.url)
    assert nofile.returncode == 2 and "no such file" in nofile.stderr


def test_status_json(api_server, tmp_path):
    status = fusewire(tmp_path, "--json", "status", url=api_server.url)
    assert status.returncode == 0, status.stdout + status.stderr
    report = json.loads(status.stdout)
    assert report["reachable"] and report["ready"] and report["workers"]
