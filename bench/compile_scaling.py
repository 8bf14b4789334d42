"""Compile time against graph size: how `compiler.compile` scales from a few thousand nodes to
whole-model graphs (a deep LLaMA's forward and backward), stage by stage. Runs on a CPU.

    python bench/compile_scaling.py [--families chain,ladder,llama] [--sizes 2000,5000,10000,20000,30000]
                                    [--target cpu] [--repeat 3] [--cuda-sizes 2000 --cuda-families chain,llama]
                                    [--profile DIR] [--json out.json]

Graph families, each traced with make_fx and converted with compiler.fx_import.from_fx:
  chain   pointwise ops in a row, varied (unary math, ops with a second input, skip connections
          to a few steps back), so fusion has groups to form and refuse
  ladder  norm-like rungs: layer_norm, softmax, row sums and an RMS norm interleaved with
          pointwise ops and residual adds
  llama   a Hugging Face LLaMA of tiny width (hidden 64) with as many layers as the size asks,
          forward, loss and the gradients of every parameter in one joint ATen graph

Per graph (`nodes` is the wire graph's node count, the size asked for is approximate):
  parse_s      JSON text -> validated Graph (compiler.graph.parse_graph), what a worker does first
  compile_s    compiler.compile(graph, target, {"autotune": False, "benchmark_fusion": False})
  stages       seconds per stage, from the `progress` callback: lowering, scheduling, codegen,
               binaries (cubins; the "autotuning" stage, near zero for the cpu target), packaging
  ratio        compile_s against the previous size of the family, scaled to a doubling
               (ratio ** (1 / log2(nodes / previous nodes)))
  kernels      kernels in the artifact; json_mb: the graph's JSON size
Each compile runs in a fresh process; --repeat N keeps the fastest of N (runs_s lists them all).
With --cuda-sizes, the sizes listed also compile for cuda:sm_90 (Triton builds the cubins
on this machine, as a CPU worker does). --profile DIR writes a cProfile dump per compile.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "models")]

import compiler  # noqa: E402
from compiler.fx_import import from_fx  # noqa: E402
from compiler.graph import Graph, graph_to_json, parse_graph  # noqa: E402

OPTIONS = {"autotune": False, "benchmark_fusion": False}
STAGES = ("lowering", "scheduling", "codegen", "autotuning", "packaging")
ROWS, COLS = 64, 256  # the synthetic families' activations (fp32)


# ---------------------------------------------------------------------------------
# Graph families
# ---------------------------------------------------------------------------------


def _chain_step(i: int, h: torch.Tensor, y: torch.Tensor, back: list[torch.Tensor]) -> torch.Tensor:
    """One pointwise op of the chain; every eighth reads a value from a few steps back."""
    kind = i % 16
    if kind == 0:
        return h + y
    if kind == 1:
        return h * 0.5
    if kind == 2:
        return torch.sin(h)
    if kind == 3:
        return h - y
    if kind == 4:
        return torch.tanh(h)
    if kind == 5:
        return h * y
    if kind == 6:
        return torch.relu(h)
    if kind == 7:
        return h + back[-5]  # a skip connection: a buffer with users far apart
    if kind == 8:
        return torch.sigmoid(h)
    if kind == 9:
        return torch.maximum(h, y)
    if kind == 10:
        return h.abs()
    if kind == 11:
        return h / (y.abs() + 1.0) if i % 32 == 11 else h + 1.0
    if kind == 12:
        return torch.exp(-h)
    if kind == 13:
        return torch.where(h > 0, h, y)
    if kind == 14:
        return h.neg()
    return h + back[-9]


CHAIN_NODES_PER_STEP = 1.19  # measured: some steps are two or three ATen ops


def chain(nodes: int) -> tuple[Callable, list[torch.Tensor]]:
    def fn(x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        h, back, outputs = x, [x] * 16, []
        for i in range(round(nodes / CHAIN_NODES_PER_STEP)):
            h = _chain_step(i, h, y, back)
            back = back[1:] + [h]
            if i % 997 == 996:
                outputs.append(h)  # a few intermediate outputs, as a forward's saved activations
        return outputs + [h]

    generator = torch.Generator().manual_seed(0)
    return fn, [torch.randn(ROWS, COLS, generator=generator) for _ in range(2)]


def _rung(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    h = h + F.layer_norm(h, (COLS,), w, b)
    s = torch.softmax(h * 0.125, -1)
    h = h + s * y
    h = h - h.sum(-1, keepdim=True) / COLS
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    return torch.nn.functional.gelu(h) + b


def ladder(nodes: int) -> tuple[Callable, list[torch.Tensor]]:
    inputs = ladder_inputs()
    per_rung = len(from_fx(make_fx(_rung)(*inputs), inputs).nodes)

    def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        h, outputs = x, []
        for i in range(max(1, nodes // per_rung)):
            h = _rung(h, w, b, y)
            if i % 50 == 49:
                outputs.append(h)
        return outputs + [h]

    return fn, ladder_inputs()


def ladder_inputs() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(ROWS, COLS, generator=generator), torch.randn(COLS, generator=generator),
            torch.randn(COLS, generator=generator), torch.randn(ROWS, COLS, generator=generator)]


LLAMA_NODES_PER_LAYER, LLAMA_BASE_NODES = 210, 63  # measured: the joint graph's nodes per layer, and outside them


def llama(nodes: int) -> tuple[Callable, list[torch.Tensor]]:
    import zoo  # noqa: F401  (makes transformers importable with CPU torch: see its ensure_torchvision_importable)
    from transformers import LlamaConfig, LlamaForCausalLM

    layers = max(1, round((nodes - LLAMA_BASE_NODES) / LLAMA_NODES_PER_LAYER))
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=64, num_hidden_layers=layers, bos_token_id=0, eos_token_id=0, pad_token_id=0))
    names = [n for n, _ in model.named_parameters()]
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 128, (2, 16), generator=generator)
    labels = torch.randint(1, 128, (2, 16), generator=generator)

    def fn(*params: torch.Tensor) -> list[torch.Tensor]:
        loss = torch.func.functional_call(model, dict(zip(names, params)),
                                          kwargs={"input_ids": ids, "labels": labels}).loss
        return [loss, *torch.autograd.grad(loss, params)]

    return fn, [p.detach().clone().requires_grad_(True) for p in model.parameters()]


FAMILIES: dict[str, Callable[[int], tuple[Callable, list[torch.Tensor]]]] = {
    "chain": chain, "ladder": ladder, "llama": llama}


def capture(family: str, nodes: int) -> Graph:
    fn, inputs = FAMILIES[family](nodes)
    gm = make_fx(fn)(*inputs)
    return from_fx(gm, [t.detach() for t in inputs])


# ---------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------


def timed_compile(graph: Graph, target: str, profile: Path | None) -> tuple[float, dict[str, float], object]:
    marks: list[tuple[str, float]] = []
    progress = lambda stage, fraction: marks.append((stage, time.perf_counter()))  # noqa: E731
    profiler = cProfile.Profile() if profile else None
    gc.collect()  # capturing the graph left garbage; a worker's heap starts a compile without it
    start = time.perf_counter()
    if profiler:
        profiler.enable()
    artifact = compiler.compile(graph, target, OPTIONS, progress=progress)
    if profiler:
        profiler.disable()
        profiler.dump_stats(str(profile))
    total = time.perf_counter() - start
    stages = {stage: round(marks[i + 1][1] - at, 3) for i, (stage, at) in enumerate(marks[:-1])}
    stages["binaries"] = stages.pop("autotuning", 0.0)
    return total, stages, artifact


def measure(family: str, size: int, target: str, profile_dir: Path | None) -> dict:
    start = time.perf_counter()
    graph = capture(family, size)
    capture_s = time.perf_counter() - start
    text = graph_to_json(graph)
    start = time.perf_counter()
    graph = parse_graph(text)
    parse_s = time.perf_counter() - start
    profile = profile_dir / f"{family}-{len(graph.nodes)}-{target.replace(':', '_')}.prof" if profile_dir else None
    total, stages, artifact = timed_compile(graph, target, profile)
    return {"family": family, "target": target, "nodes": len(graph.nodes), "json_mb": round(len(text) / 2**20, 2),
            "capture_s": round(capture_s, 2), "parse_s": round(parse_s, 3), "compile_s": round(total, 2),
            "stages": stages, "kernels": len(artifact.manifest["kernels"])}


def per_doubling(rows: list[dict]) -> None:
    """Adds `ratio`: compile time growth per doubling of nodes against the family's previous row."""
    previous: dict[tuple[str, str], dict] = {}
    for row in rows:
        key = (row["family"], row["target"])
        before = previous.get(key)
        if before is not None and row["nodes"] > before["nodes"] and before["compile_s"] > 0:
            doublings = math.log2(row["nodes"] / before["nodes"])
            row["ratio"] = round((row["compile_s"] / before["compile_s"]) ** (1 / doublings), 2)
        previous[key] = row


def measure_in_child(family: str, size: int, target: str, profile_dir: Path | None, repeat: int) -> dict:
    """`measure` in a fresh interpreter, `repeat` times, the fastest kept (other work on the machine
    only ever adds time): no size inherits the compiler's caches (simplified index expressions,
    loop mappings) from the sizes before it, nor their memory."""
    command = [sys.executable, __file__, "--one", f"{family}:{size}:{target}"]
    if profile_dir:
        command += ["--profile", str(profile_dir)]
    rows = []
    for _ in range(repeat):
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(done.stderr[-2000:])
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    best = min(rows, key=lambda r: r["compile_s"])
    return best | {"runs_s": [r["compile_s"] for r in rows]} if repeat > 1 else best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--sizes", default="2000,5000,10000,20000,30000", help="approximate node counts")
    parser.add_argument("--target", default="cpu")
    parser.add_argument("--cuda-sizes", default="", help="sizes also compiled for cuda:sm_90 (cubins built here)")
    parser.add_argument("--cuda-families", default="chain", help="families the --cuda-sizes runs use")
    parser.add_argument("--profile", type=Path, help="directory for one cProfile dump per compile")
    parser.add_argument("--repeat", type=int, default=1, help="compiles per size (fresh processes), the fastest kept")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # family:size:target, measured in this process
    args = parser.parse_args()
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    if args.one:
        family, size, target = args.one.split(":", 2)
        print(json.dumps(measure(family, int(size), target, args.profile)))
        return
    runs = [(f, int(s), args.target) for f in args.families.split(",") for s in args.sizes.split(",") if s]
    runs += [(f, int(s), "cuda:sm_90") for f in args.cuda_families.split(",") for s in args.cuda_sizes.split(",") if s]
    rows = []
    for family, size, target in runs:
        try:
            row = measure_in_child(family, size, target, args.profile, args.repeat)
        except Exception as exc:  # one size's failure is a result too; the rest still run
            row = {"family": family, "target": target, "size": size, "error": f"{type(exc).__name__}: {str(exc)[:2000]}"}
        rows.append(row)
        per_doubling([r for r in rows if "error" not in r])
        print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                                         "torch": torch.__version__, "options": OPTIONS, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
