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


def test_a_plan_runs_as_generated_source_that_names_nothing_from_the_artifact(tmp_path):
    """The runtime writes a plan as Python source: a straight line of steps. Kernel and op names from
    the artifact become names in it only when they are plain identifiers, and values are handed to
    the function, never written into it as text."""
    x, w = torch.randn(6, 5), torch.randn(7, 5)

    def fn(a, b):
        return torch.softmax(a @ b.t(), -1) * 3, (a + 1).t()

    runner = load(compiler.compile(from_fx(make_fx(fn)(x, w), [x, w]), "cpu"), tmp_path)
    assert_close_outputs(runner(x, w), list(fn(x, w)))
    program = next(iter(runner._programs.values()))
    assert program.source.startswith("def steps(inputs, stream):") and "for " not in program.source
    assert "mm" in program.source and "fused" in program.source  # the op and kernel names read as such
    hostile = "k(); import os; os.system('echo pwned')  #"
    name = program._name(object(), hostile)
    assert name.startswith("value_") and "os" not in name
    assert program._name((3, 4), "shape") != "(3, 4)" and program._name(7, "x") == "7"


def test_handed_over_inputs_are_dropped_after_their_last_use(tmp_path):
    """run_checked(release=True) (what the backend does with aot_autograd's boxed calls): the list is
    emptied and the runner keeps no reference to an input after the step that last reads it, so a
    backward's saved activations are freed as it goes."""
    import weakref

    x, w = torch.randn(6, 5), torch.randn(7, 5)

    def fn(a, b):
        return (torch.softmax(a @ b.t(), -1) * 3).sum(0)

    runner = load(compiler.compile(from_fx(make_fx(fn)(x, w), [x, w]), "cpu"), tmp_path)
    want = fn(x, w)
    kept = [x.clone(), w.clone()]
    assert_close_outputs(runner.run_checked(kept), [want])
    assert len(kept) == 2  # not handed over: left as it was
    handed = [x.clone(), w.clone()]
    refs = [weakref.ref(t) for t in handed]
    assert_close_outputs(runner.run_checked(handed, release=True), [want])
    assert handed == [] and all(ref() is None for ref in refs)
    source = next(iter(runner._programs.values())).source.splitlines()
    dropped = [i for i, line in enumerate(source) if line.strip().startswith(("s0 = None", "s1 = None"))]
    assert len(dropped) == 2 and max(dropped) < len(source) - 2  # before the graph's last steps
