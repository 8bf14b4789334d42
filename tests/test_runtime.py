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


def _convolution_steps(fn, *inputs) -> dict:
    artifact = compiler.compile(from_fx(make_fx(fn)(*inputs), list(inputs)), "cpu")
    return {step["target"]: step for step in artifact.plan["steps"] if step["op"] == "extern"}


def _depthwise(dtype: torch.dtype, groups: int = 6) -> tuple:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 6, 9, 7, generator=generator).to(dtype)
    w = torch.randn(6, 6 // groups, 3, 3, generator=generator).to(dtype)
    grad = torch.randn(2, 6, 9, 7, generator=generator).to(dtype)
    return x, w, grad


def _conv_and_backward(x, w, grad):
    groups = x.shape[1] // w.shape[1]
    y = torch.ops.aten.convolution(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], groups)
    grads = torch.ops.aten.convolution_backward(grad, x, w, [0], [1, 1], [1, 1], [1, 1], False, [0, 0], groups,
                                                [True, True, False])
    return y, grads[0], grads[1]


def test_grouped_half_convolutions_run_on_channels_last_copies_on_a_gpu_only():
    """A depthwise convolution and its backward in bf16 on a GPU are called on channels-last copies
    (cuDNN's fast path); what they give equals the NCHW call's. Nothing changes on a CPU, for
    ordinary (ungrouped) convolutions or in float32."""
    from client.runtime import channels_last_call

    x, w, grad = _depthwise(torch.bfloat16)
    steps = _convolution_steps(_conv_and_backward, x, w, grad)
    gpu, cpu = torch.device("cuda"), torch.device("cpu")
    for target, op in [("aten.convolution.default", torch.ops.aten.convolution.default),
                       ("aten.convolution_backward.default", torch.ops.aten.convolution_backward.default)]:
        step = steps[target]
        assert channels_last_call(step, op, cpu) is None
        wrapped = channels_last_call(step, op, gpu)
        assert wrapped is not None, target
        args = (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 6) if target.endswith("convolution.default") else \
            (grad, x, w, [0], [1, 1], [1, 1], [1, 1], False, [0, 0], 6, [True, True, False])
        want = op(*args)
        got = wrapped(*args)
        for a, b in zip(got if isinstance(got, tuple) else [got], want if isinstance(want, tuple) else [want]):
            if b is not None:
                torch.testing.assert_close(a.contiguous(), b, atol=2e-2, rtol=2e-2)
    for dtype, groups in [(torch.float32, 6), (torch.bfloat16, 1)]:
        steps = _convolution_steps(_conv_and_backward, *_depthwise(dtype, groups))
        assert all(channels_last_call(step, torch.ops.aten.convolution.default, gpu) is None
                   for step in steps.values()), (dtype, groups)
