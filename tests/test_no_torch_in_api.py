"""The API process must not load torch or triton: it imports only the torch-free modules.

Each check runs in a fresh interpreter, since this test process has torch loaded already.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "triton")


def loaded_after(*modules: str) -> list[str]:
    """Imports `modules` in a new interpreter and returns which of HEAVY it loaded."""
    code = (
        "import importlib, json, sys\n"
        f"for name in {list(modules)!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"importing {modules} failed:\n{run.stderr[-3000:]}"
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_compiler_api_modules_do_not_load_torch():
    assert loaded_after("compiler", "compiler.graph", "compiler.artifact", "compiler.options",
                        "compiler.version", "compiler.aten_schemas") == []


def test_parsing_and_keying_a_graph_do_not_load_torch():
    code = (
        "import sys\n"
        "from compiler.graph import key, parse_graph\n"
        "from tests.corpus import corpus_names, load_graph\n"
        "for name in corpus_names():\n"
        "    key(load_graph(name), 'cuda:sm_90')\n"
        "print([m for m in ('torch', 'triton') if m in sys.modules])\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "[]"


def _require_service(module: str) -> None:
    path = ROOT / Path(*module.split("."))
    if not (path / "__init__.py").exists() and not path.with_suffix(".py").exists():
        pytest.skip(f"{module} does not exist yet (no {path.relative_to(ROOT)}/__init__.py or .py); "
                    "this check starts running when it does")


def test_service_package_does_not_load_torch():
    _require_service("service")
    assert loaded_after("service") == []


def test_service_app_does_not_load_torch():
    _require_service("service.app")
    assert loaded_after("service.app") == []
