"""The CPU runtime (client/runtime.py): where it keeps the kernel sources it imports."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import compiler
from client.runtime import load
from compiler.fx_import import from_fx
from tests.compare import assert_close_outputs


def test_kernel_sources_go_to_the_cache_dir_the_runtime_is_given(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEWIRE_CACHE_DIR", str(tmp_path / "from-env"))
    x = torch.randn(5, 7)
    artifact = compiler.compile(from_fx(make_fx(lambda a: torch.relu(a) * 2)(x), [x]), "cpu")
    assert_close_outputs(load(artifact, tmp_path / "given")(x), [torch.relu(x) * 2])
    assert list((tmp_path / "given" / "kernels" / artifact.key).glob("*.py"))
    assert not (tmp_path / "from-env").exists()
