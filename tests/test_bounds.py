"""Bounded work per graph (compiler/bounds.py): graphs over the tensor or plan limits fail at
once naming the node; graphs of huge (but allowed) tensors compile without allocating them."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import compiler
from compiler.bounds import LimitExceeded, WorkLimits, check_literal_sizes, planned_peak_bytes
from compiler.graph import parse_graph
from tests.compare import assert_close_outputs

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]
F32 = {"dtype": "float32"}


def _graph(nodes: list[dict], outputs: list[str], inputs: list[dict] | None = None) -> dict:
    return {"version": 1, "inputs": inputs or [{"name": "x", "dtype": "float32", "shape": [4, 3]}],
            "nodes": [{"kwargs": {}, **n} for n in nodes], "outputs": [{"ref": o} for o in outputs]}


def _node(name: str, target: str, *args, **kwargs) -> dict:
    return {"name": name, "target": target, "args": list(args), "kwargs": kwargs}


def _ref(name: str) -> dict:
    return {"ref": name}


def _full(n: int) -> dict:
    return _node("f", "aten.full.default", [n], 1.5, dtype=F32, device={"device": "cpu"})


# Each makes one tensor of `n` elements from a 4 x 3 input, summed to a scalar.
FAMILIES = {
    "full": lambda n: [_full(n)],
    "arange": lambda n: [_node("f", "aten.arange.default", n, dtype=F32, device={"device": "cpu"})],
    "repeat": lambda n: [_node("f", "aten.repeat.default", _ref("x"), [n // 12, 1])],
    "expand_clone": lambda n: [_node("e", "aten.expand.default", _ref("x"), [n // 12, 4, 3]),
                               _node("f", "aten.clone.default", _ref("e"))],
    "pad": lambda n: [_node("f", "aten.constant_pad_nd.default", _ref("x"), [0, n // 4 - 3], 2.0)],
    "new_empty_fill": lambda n: [_node("e", "aten.new_empty.default", _ref("x"), [n]),
                                 _node("f", "aten.fill.Scalar", _ref("e"), 0.5)],
}


def _family_graph(family: str, n: int) -> dict:
    nodes = FAMILIES[family](n) + [_node("s", "aten.sum.default", _ref("f")),
                                   _node("o", "aten.add.Tensor", _ref("x"), _ref("s"))]
    return _graph(nodes, ["o"])


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_tensor_over_the_limit_fails_at_once_naming_its_node(family):
    with pytest.raises(LimitExceeded, match=r"node '[fe]'.*elements.*over this service's limit of 17,179,869,184"):
        compiler.compile(parse_graph(_family_graph(family, 10**12)), "cpu")


def test_limits_are_configurable_and_small_graphs_pass_them():
    graph = parse_graph(_family_graph("full", 1000))
    with pytest.raises(LimitExceeded, match="1,000 elements"):
        compiler.compile(graph, "cpu", limits=WorkLimits(max_tensor_elements=999))
    compiler.compile(graph, "cpu", limits=WorkLimits(max_tensor_elements=1000))


def test_the_plans_peak_is_bounded():
    """Two live 1M-element float32 buffers (8 MB) under a 6 MB plan limit; each tensor alone is fine."""
    n = 1 << 20
    nodes = [_node("a", "aten.repeat.default", _ref("x"), [n // 12, 1]),
             _node("b", "aten.mul.Tensor", _ref("a"), 2.0)]
    graph = parse_graph(_graph(nodes, ["a", "b"]))
    with pytest.raises(LimitExceeded, match="launch plan needs"):
        compiler.compile(graph, "cpu", limits=WorkLimits(max_planned_bytes=6 << 20))
    artifact = compiler.compile(graph, "cpu", limits=WorkLimits(max_planned_bytes=8 << 20))
    assert planned_peak_bytes(artifact.plan) == 2 * (n // 12 * 12) * 4


def test_the_planned_peak_counts_extern_results():
    graph = parse_graph(_graph([_node("m", "aten.mm.default", _ref("x"), _ref("w")),
                                _node("r", "aten.relu.default", _ref("m"))], ["r", "m"],
                               [{"name": "x", "dtype": "float32", "shape": [64, 32]},
                                {"name": "w", "dtype": "float32", "shape": [32, 48]}]))
    plan = compiler.compile(graph, "cpu").plan
    assert any(step["op"] == "extern" for step in plan["steps"])
    assert planned_peak_bytes(plan) >= 2 * 64 * 48 * 4  # the mm result and the relu output: both outputs


@pytest.mark.parametrize("graph, where", [
    (_graph([_full(10**12)], ["f"]), "nodes[0] 'f'.size"),
    (_graph([_node("z", "aten.new_zeros.default", _ref("x"), [10**6, 10**6])], ["z"]), "nodes[0] 'z'.size"),
    (_graph([_node("e", "aten.expand.default", _ref("x"), [10**11, -1, -1])], ["e"]), "nodes[0] 'e'.size"),
    (_graph([_node("a", "aten.arange.start_step", 0, 10**12, 1, dtype=F32)], ["a"]), "nodes[0] 'a'"),
    (_graph([_node("o", "aten.relu.default", _ref("x"))], ["o"],
            [{"name": "x", "dtype": "float32", "shape": [2**20, 2**15]}]), "inputs[0] 'x'.shape"),
])
def test_sizes_written_in_the_graph_are_checked_without_torch(graph, where):
    with pytest.raises(LimitExceeded) as error:
        check_literal_sizes(parse_graph(graph), WorkLimits())
    assert error.value.where == where


def test_literal_checks_leave_ordinary_graphs_alone():
    check_literal_sizes(parse_graph(_family_graph("expand_clone", 1200)), WorkLimits())
    check_literal_sizes(parse_graph(_graph([_node("v", "aten.view.default", _ref("x"), [-1])], ["v"])), WorkLimits())


_NO_ALLOCATION = textwrap.dedent("""
    import json, resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))  # far below one 32 GiB tensor
    import compiler
    from compiler.graph import parse_graph
    for graph in json.loads(sys.stdin.read()):
        artifact = compiler.compile(parse_graph(graph), "cpu")
        assert max(b["numel"] for b in artifact.plan["buffers"].values()) >= 1 or artifact.plan["steps"]
    print("ok")
""")


def test_huge_tensors_are_compiled_without_being_allocated():
    """Every family at 2^33 elements (32 GiB of float32) compiles under a 6 GiB address-space limit."""
    graphs = [_family_graph(family, 2**33) for family in sorted(FAMILIES)]
    run = subprocess.run([sys.executable, "-c", _NO_ALLOCATION], input=json.dumps(graphs), cwd=ROOT,
                         capture_output=True, text=True, timeout=300, env={**__import__("os").environ, "TRITON_INTERPRET": "1"})
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]


@pytest.mark.parametrize("family", ["repeat", "pad", "new_empty_fill"])
def test_the_families_compute_what_eager_does_at_small_sizes(family):
    from client.runtime import load
    from compiler.fx_import import random_inputs, run_eager

    graph = parse_graph(_family_graph(family, 120))
    inputs = random_inputs(graph, seed=3)
    assert_close_outputs(load(compiler.compile(graph, "cpu"))(*inputs), run_eager(graph, inputs), where=family)
