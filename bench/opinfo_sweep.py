"""fusewire against PyTorch's own op test database (OpInfo `op_db`), a suite this project did not
write: every op with CPU support, its first sample inputs, float32 and bfloat16, forward and
backward (gradients of a weighted sum of the outputs), each traced with make_fx, converted with
`compiler.fx_import.from_fx`, compiled for `cpu` and run under Triton's interpreter.

Each (op, dtype, direction, sample) lands in one class:
  fused     correct, no extern call in the plan
  extern    correct, with ATen calls in the plan
  refused   a clean error before anything ran: ConversionError, GraphValidationError, LoweringError
  wrong     ran, and broke Inductor's rule (its `same()`): not allclose to eager (rtol = atol = 1e-4
            float32, 1e-2 bfloat16) and error against a float64 run > 2x eager's own + tol / 10
            (integer and bool outputs exact; shapes, dtypes and non-finite positions as eager's)
  crashed   any other exception (a compiler bug), or the process died (memory corruption)
  skipped   nothing to test: the sample has no tensor output, eager itself fails on it, or make_fx
            cannot trace it (data-dependent Python control flow: no graph exists to compile)

    python bench/opinfo_sweep.py --jsonl results.jsonl [--ops abs,sum] [--samples 2] [--jobs 2]
    python bench/opinfo_sweep.py --summary results.jsonl > docs/COVERAGE.md

Ops run in child processes (a chunk each); a child that dies marks the case it was running
`crashed` and the chunk goes on in a new child. tests/opinfo runs a fixed subset in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import traceback
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]
DTYPES = ("float32", "bfloat16")
DIRECTIONS = ("forward", "backward")
FLOORS = {"float32": 1e-5, "bfloat16": 1e-3}  # Inductor's tol / 10 (1e-4 and 1e-2)
MULTIPLIER = 2.0
CLEAN_ERRORS = ("ConversionError", "GraphValidationError", "LoweringError")
# Lowering names the node of any exception a lowering raises ("node 'x' (aten.sum.dim_IntList):
# IndexError: ..."): that is a compiler bug with a location, not a refusal.
_WRAPPED_BUG = re.compile(r"\): [A-Za-z]*(Error|Exception): ")


@dataclass
class Result:
    op: str  # OpInfo name, with its variant after a dot (e.g. "nn.functional.linear_cross_entropy")
    dtype: str
    direction: str
    sample: int
    outcome: str  # fused | extern | refused | wrong | crashed | skipped
    detail: str = ""


# -- one case ---------------------------------------------------------------------------------


def op_name(opinfo: Any) -> str:
    return opinfo.name + (f".{opinfo.variant_test_name}" if opinfo.variant_test_name else "")


def all_ops() -> dict[str, Any]:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    return {op_name(o): o for o in op_db if torch.float32 in o.supported_dtypes("cpu")}


def cases(opinfo: Any, samples: int) -> Iterator[tuple[str, str, int, Any]]:
    import torch

    for dtype in DTYPES:
        if getattr(torch, dtype) not in opinfo.supported_dtypes("cpu"):
            continue
        for direction in DIRECTIONS:
            if direction == "backward" and not (opinfo.supports_autograd and getattr(torch, dtype) in
                                                opinfo.supported_backward_dtypes("cpu")):
                continue
            try:
                found = opinfo.sample_inputs("cpu", getattr(torch, dtype), requires_grad=direction == "backward")
                for i, sample in zip(range(samples), found):
                    yield dtype, direction, i, sample
            except Exception:  # an OpInfo whose sample generator fails on this machine: nothing to test
                continue


def run_case(opinfo: Any, dtype: str, direction: str, index: int, sample: Any) -> Result:
    """Traces, converts, compiles and runs one sample; classifies what happened."""
    import torch

    result = Result(op_name(opinfo), dtype, direction, index, "skipped")
    try:
        fn, tensors = case_function(opinfo, sample, direction)
        torch.manual_seed(0)
        expected = fn(*tensors)
    except Exception as exc:
        result.detail = f"eager fails: {type(exc).__name__}: {str(exc)[:200]}"
        return result
    if not expected:
        result.detail = "no tensor output"
        return result
    from torch.fx.experimental.proxy_tensor import make_fx

    try:
        torch.manual_seed(0)
        traced = make_fx(fn)(*tensors)
    except Exception as exc:  # data-dependent Python (narrow with a tensor start...): no graph to give fusewire
        result.detail = f"make_fx cannot trace it: {type(exc).__name__}: {str(exc)[:160]}"
        return result
    try:
        from compiler import compile as fw_compile
        from compiler.fx_import import from_fx

        graph = from_fx(traced, tensors)
        artifact = fw_compile(graph, "cpu", {"eager_random": True})  # random samples are compared with eager's numbers
    except Exception as exc:
        clean = type(exc).__name__ in CLEAN_ERRORS and not _WRAPPED_BUG.search(str(exc))
        result.outcome = "refused" if clean else "crashed"
        result.detail = f"{type(exc).__name__}: {str(exc)[:300]}"
        if not clean:
            result.detail += " @ " + _where(exc)
        return result
    try:
        from client.runtime import load

        torch.manual_seed(0)
        got = load(artifact)(*[t.detach() for t in tensors])
    except Exception as exc:
        result.outcome, result.detail = "crashed", f"run: {type(exc).__name__}: {str(exc)[:300]} @ {_where(exc)}"
        return result
    from compiler.fx_import import run_eager

    torch.manual_seed(0)
    graph_eager = run_eager(graph, [t.detach() for t in tensors])  # what ATen makes of the graph fusewire got
    if _is_seeded(graph):
        # OpInfo's random ops reseed inside their wrappers (wrapper_set_seed): the compiled run must
        # match the traced graph run by ATen under the same seed
        expected, reference = graph_eager, None
    else:
        reference = float64_reference(fn, tensors)
    if opinfo.name.startswith(("empty", "new_empty")):  # uninitialized memory: shapes and dtypes only
        expected = graph_eager = [torch.zeros_like(t) for t in got]
        got = [torch.zeros_like(t) for t in got]
    declared = _meta_outputs(graph, tensors)
    follows_meta = [i for i, (g, e) in enumerate(zip(got, expected))
                    if (g.shape, g.dtype) != (e.shape, e.dtype) and i < len(declared)
                    and (g.shape, g.dtype) == (declared[i].shape, declared[i].dtype)]
    for i in follows_meta:  # compared in the dtype PyTorch's meta kernel declares; values only if shapes agree
        same_shape = got[i].shape == expected[i].shape
        expected[i] = expected[i].to(got[i].dtype) if same_shape else got[i]
        graph_eager[i] = graph_eager[i].to(got[i].dtype) if same_shape else got[i]
        if reference is not None and not same_shape:
            reference[i] = got[i].double()
    problem = compare(got, expected, graph_eager, reference, dtype)
    if problem:
        result.outcome, result.detail = "wrong", problem
    else:
        externs = [s["target"] for s in artifact.plan["steps"] if s["op"] == "extern"]
        result.outcome = "extern" if externs else "fused"
        result.detail = ", ".join(sorted(set(externs)))
        if follows_meta:
            result.detail = (f"outputs {follows_meta} follow PyTorch's meta kernel (the op's declared shape and "
                             f"dtype, CUDA's), where CPU eager differs; " + result.detail)
    return result


def _meta_outputs(graph: Any, tensors: list) -> list:
    """The graph's outputs as PyTorch's meta kernels declare them: the contract compiled code follows."""
    import torch

    from compiler.fx_import import run_eager

    try:
        return run_eager(graph, [t.detach().to("meta") for t in tensors])
    except Exception:
        return []


def _is_seeded(graph: Any) -> bool:
    import torch

    from compiler.fx_import import resolve_op

    return any(torch.Tag.nondeterministic_seeded in resolve_op(node.target).tags for node in graph.nodes)


def _where(exc: BaseException) -> str:
    frame = traceback.extract_tb(exc.__traceback__)[-1]
    return f"{Path(frame.filename).name}:{frame.lineno} {frame.name}"


def case_function(opinfo: Any, sample: Any, direction: str) -> tuple[Callable, list]:
    """fn(*tensors) -> list of output tensors, with the sample's non-tensor arguments fixed."""
    import torch
    from torch.utils import _pytree as pytree

    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    tensors = [leaves[i].detach() for i in positions]
    differentiable = [j for j, i in enumerate(positions) if leaves[i].requires_grad]  # as the sample marks them

    def call(*inputs: Any) -> Any:
        full = list(leaves)
        for i, tensor in zip(positions, inputs):
            full[i] = tensor
        first, args, kwargs = pytree.tree_unflatten(full, spec)
        return opinfo(first, *args, **kwargs)

    def outputs_of(value: Any) -> list:
        return [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]

    def real_outputs_of(value: Any) -> list:  # complex outputs weighted as (real, imag) pairs
        return [torch.view_as_real(t.resolve_conj()) if t.is_complex() else t for t in outputs_of(value)]

    if direction == "forward":
        return (lambda *inputs: outputs_of(call(*inputs))), tensors

    generator = torch.Generator().manual_seed(1)

    def backward(*inputs: Any) -> list:
        inputs = [t.detach().requires_grad_(i in differentiable) for i, t in enumerate(inputs)]
        outs = [o for o in real_outputs_of(call(*inputs)) if o.requires_grad]
        if not outs:
            return []
        total = sum((o * weights[j]).sum() for j, o in enumerate(outs))
        wrt = [inputs[i] for i in differentiable]
        grads = torch.autograd.grad(total, wrt, allow_unused=True)
        return [g for g in grads if g is not None]

    with torch.enable_grad():
        probe = [t.detach().requires_grad_(i in differentiable) for i, t in enumerate(tensors)]
        shapes = [(o.shape, o.dtype) for o in real_outputs_of(call(*probe)) if o.requires_grad]
    weights = [torch.randn(shape, generator=generator).to(dtype) for shape, dtype in shapes]
    return backward, tensors


def float64_reference(fn: Callable, tensors: list) -> list | None:
    import torch

    doubled = [t.double() if t.is_floating_point() else t for t in tensors]
    try:
        torch.manual_seed(0)
        return fn(*doubled)
    except Exception:
        return None  # the op has no float64 kernel: compare with eager itself


def compare(got: list, expected: list, graph_eager: list, reference: list | None, dtype: str) -> str:
    """Empty when `got` passes the rule against `expected` (eager), `graph_eager` (the traced graph run
    op by op by ATen) and `reference` (float64). Eager's error is the larger of the two eager runs'
    (make_fx may trace another ATen path than eager takes: linalg.cond traces a full SVD where eager
    computes singular values only); shapes, dtypes, integers and non-finite values follow eager."""
    import torch

    if len(got) != len(expected):
        return f"{len(got)} outputs, eager gives {len(expected)}"
    for i, (g, e) in enumerate(zip(got, expected)):
        ge = graph_eager[i] if len(graph_eager) == len(expected) and graph_eager[i].shape == e.shape else e
        r = reference[i] if reference is not None and len(reference) == len(expected) else e
        if g.shape != e.shape or g.dtype != e.dtype:
            return f"output {i}: {g.dtype} {tuple(g.shape)}, eager gives {e.dtype} {tuple(e.shape)}"
        if e.is_complex():  # compared as (real, imaginary) pairs
            g, e, ge, r = (_as_real_pairs(t) for t in (g, e, ge, r))
        if not e.is_floating_point():
            if not torch.equal(g, e):
                return f"output {i}: integer values differ from eager's"
            continue
        finite = torch.isfinite(e)
        if not torch.equal(torch.isfinite(g), finite) or not torch.equal(torch.isnan(g), torch.isnan(e)):
            return f"output {i}: non-finite values where eager has none, or the other way round"
        if not torch.equal(g[~finite & ~torch.isnan(e)], e[~finite & ~torch.isnan(e)]):
            return f"output {i}: infinities of the other sign"
        tolerance = 10 * FLOORS[dtype]
        if torch.allclose(g[finite].double(), e[finite].double(), rtol=tolerance, atol=tolerance):
            continue  # Inductor's same(): close to eager within tol passes before the float64 rule
        error = _rmse(g[finite], r.to(g.device)[finite])
        eager_error = max(_rmse(e[finite], r[finite]), _rmse(ge[finite], r[finite]))
        if error > MULTIPLIER * eager_error + FLOORS[dtype]:
            return f"output {i}: error {error:.3g} against float64, eager's {eager_error:.3g}"
    return ""


def _as_real_pairs(t: Any) -> Any:
    """A complex tensor as (real, imaginary) float pairs; a conjugate view (eager's inverse FFTs of
    real input return one) is resolved first, as view_as_real refuses it."""
    import torch

    if not t.is_complex():
        return t
    return torch.view_as_real((t.to(torch.complex64) if t.dtype == torch.complex32 else t).resolve_conj())


def _rmse(a: Any, b: Any) -> float:
    return (a.double() - b.double()).pow(2).mean().sqrt().item() if a.numel() else 0.0


# -- the sweep ------------------------------------------------------------------------------


def child(names: list[str], samples: int, out: Path) -> None:
    """Runs the cases of `names` in this process, appending one JSON line per case to `out`;
    a line `{"start": ...}` before each case tells the parent which case a death interrupted."""
    import warnings

    warnings.simplefilter("ignore")
    ops = all_ops()
    with open(out, "a") as sink:
        for name in names:
            for dtype, direction, index, sample in cases(ops[name], samples):
                sink.write(json.dumps({"start": [name, dtype, direction, index]}) + "\n")
                sink.flush()
                sink.write(json.dumps(asdict(run_case(ops[name], dtype, direction, index, sample))) + "\n")
                sink.flush()


def sweep(names: list[str], samples: int, jobs: int, out: Path) -> None:
    """Runs `names` in `jobs` child processes at a time; a dead child's case is recorded crashed."""
    chunks = [names[i::jobs] for i in range(jobs)]
    parts = [out.with_suffix(f".part{i}") for i in range(jobs)]
    for part in parts:
        part.unlink(missing_ok=True)
    pending = {i: list(chunk) for i, chunk in enumerate(chunks) if chunk}
    running: dict[int, subprocess.Popen] = {}
    while pending or running:
        for i in list(pending):
            if i not in running:
                running[i] = _start_child(pending.pop(i), samples, parts[i])
        for i, process in list(running.items()):
            if process.poll() is None:
                continue
            del running[i]
            if process.returncode != 0:
                rest = _after_death(parts[i], chunks[i], process.returncode)
                if rest:
                    pending[i] = rest
        if running:
            next(iter(running.values())).wait()
    with open(out, "w") as sink:
        for part in parts:
            if part.exists():
                for line in part.read_text().splitlines():
                    if line and "start" not in json.loads(line):
                        sink.write(line + "\n")
                part.unlink()


def _start_child(names: list[str], samples: int, part: Path) -> subprocess.Popen:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, __file__, "--child", "--samples", str(samples), "--jsonl", str(part),
                             "--ops", ",".join(names)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _after_death(part: Path, chunk: list[str], code: int) -> list[str]:
    """Records the interrupted case as crashed; returns the chunk's ops not started yet."""
    lines = [json.loads(line) for line in part.read_text().splitlines() if line] if part.exists() else []
    if not lines or "start" not in lines[-1]:
        return []
    name, dtype, direction, index = lines[-1]["start"]
    with open(part, "a") as sink:
        sink.write(json.dumps(asdict(Result(name, dtype, direction, index, "crashed",
                                            f"the process died (exit code {code})"))) + "\n")
    return chunk[chunk.index(name) + 1:]


# -- the summary ----------------------------------------------------------------------------


def summary(path: Path) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line]
    tested = [r for r in rows if r["outcome"] != "skipped"]
    counts = Counter(r["outcome"] for r in tested)
    correct = counts["fused"] + counts["extern"]
    import datetime

    import torch
    import triton

    follows_meta = sorted({r["op"] for r in tested if "follow PyTorch's meta kernel" in r["detail"]})
    samples = 1 + max((int(r["sample"]) for r in rows), default=1)
    lines = ["# Coverage: PyTorch's OpInfo database", "",
             "fusewire against PyTorch's own op tests (`op_db`): every op with CPU float32 support, its first "
             f"{samples} sample inputs, float32 and bfloat16, forward and backward (gradients of a weighted sum of the "
             "outputs), traced with make_fx, converted with `compiler.fx_import`, compiled for `cpu` and run "
             "under Triton's interpreter; checked by Inductor's rule (bench/opinfo_sweep.py says exactly how). "
             "`tests/opinfo` runs a subset in CI.", "",
             f"Generated {datetime.date.today()} with torch {torch.__version__}, triton {triton.__version__}, by",
             "", f"    python bench/opinfo_sweep.py --samples {samples} --jsonl results.jsonl && "
             "python bench/opinfo_sweep.py --summary results.jsonl > docs/COVERAGE.md", "",
             f"Ops: {len({r['op'] for r in rows})}. Samples tested: {len(tested)} (skipped: "
             f"{len(rows) - len(tested)}, where the sample has no tensor output, eager rejects it, or make_fx "
             "cannot trace it).", "",
             "| class | samples | share |", "| --- | --- | --- |"]
    for outcome in ("fused", "extern", "refused", "wrong", "crashed"):
        lines.append(f"| {outcome} | {counts[outcome]} | {100 * counts[outcome] / max(len(tested), 1):.1f} % |")
    lines.append(f"| **correct** (fused + extern) | {correct} | {100 * correct / max(len(tested), 1):.1f} % |")
    by_direction = defaultdict(Counter)
    for r in tested:
        by_direction[(r["dtype"], r["direction"])][r["outcome"]] += 1
    lines += ["", "| dtype | direction | fused | extern | refused | wrong | crashed |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for (dtype, direction), c in sorted(by_direction.items()):
        lines.append(f"| {dtype} | {direction} | " + " | ".join(str(c[o]) for o in ("fused", "extern", "refused", "wrong", "crashed")) + " |")
    if follows_meta:
        lines += ["", "Correct, following PyTorch's meta kernel where CPU eager differs (the shapes and dtypes "
                  "the op declares, which CUDA's kernels return; e.g. float32 statistics of a bf16 layer norm, "
                  "batch statistics in eval mode): " + ", ".join(follows_meta) + "."]
    for outcome in ("wrong", "crashed", "refused"):
        group = defaultdict(list)
        for r in tested:
            if r["outcome"] == outcome:
                group[_cause(r["detail"])].append(f"{r['op']} ({r['dtype']} {r['direction']})")
        if group:
            lines += ["", f"## {outcome.capitalize()}, by cause", ""]
            for cause, cases_ in sorted(group.items(), key=lambda kv: -len(kv[1])):
                shown = ", ".join(sorted(set(cases_))[:12]) + (" ..." if len(set(cases_)) > 12 else "")
                lines.append(f"- {len(cases_)} x `{cause}`: {shown}")
    return "\n".join(lines) + "\n"


def _cause(detail: str) -> str:
    """The detail without the names and numbers that differ between cases of one cause."""
    text = re.sub(r"node '[^']*'", "node '…'", detail.split(" @ ")[0])
    text = re.sub(r"\[[0-9, ]*\]|\([0-9, ]*\)|[0-9]+(\.[0-9e+-]+)?", "#", text)
    return text[:140]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", help="comma-separated OpInfo names (default: all with CPU float32 support)")
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--jsonl", type=Path)
    parser.add_argument("--summary", type=Path, help="print the COVERAGE.md table of a results file")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.summary:
        print(summary(args.summary), end="")
        return
    known = all_ops()
    names = args.ops.split(",") if args.ops else sorted(known)
    unknown = [name for name in names if name not in known]
    if unknown:  # a child would die on the first one and silently drop the rest of its share
        parser.error(f"no OpInfo with CPU float32 support is named {', '.join(unknown)}")
    if args.child:
        child(names, args.samples, args.jsonl)
    else:
        sweep(names, args.samples, args.jobs, args.jsonl)


if __name__ == "__main__":
    main()
