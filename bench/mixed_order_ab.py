"""Mixed-order reductions A/B on a GPU (compiler/mixed_order.py): each bench case whose name
contains one of the given substrings is compiled (autotuned, benchmark-driven fusion on) with
mixed-order fusion off, with the judge deciding, and forced, and timed as bench/kernels.py times
it (a CUDA-graph replay on a cold L2); Inductor beside them. One JSON row per case.

    python3 bench/mixed_order_ab.py layer_norm_backward out.jsonl [nomix,judge,force]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import compiler  # noqa: E402
from bench.kernels import _flatten, graph_time_ms, relative_error  # noqa: E402
from bench.model_cases import case_inputs, load_cases  # noqa: E402
from client.runtime import load  # noqa: E402
from compiler import benchmark_fusion, mixed_order, scheduler, split_reductions  # noqa: E402
from compiler.fx_import import to_fx  # noqa: E402

REAL_CHUNK, REAL_UNCERTAIN = mixed_order.mix_chunk, benchmark_fusion.uncertain


def set_mode(mode: str) -> None:
    """nomix: no column sum is split for a mixed kernel; judge: as shipped; force: the judge never
    times a mixed-order fusion, so it is always kept."""
    chunk = REAL_CHUNK if mode != "nomix" else (lambda rows, length: None)
    split_reductions.mix_chunk = scheduler.mix_chunk = chunk
    benchmark_fusion.uncertain = REAL_UNCERTAIN if mode != "force" else (
        lambda a, b, fused, rw: None if fused.mix_rows else REAL_UNCERTAIN(a, b, fused, rw))


def timed(case, inputs, reference) -> dict:
    artifact = compiler.compile(case.graph, "cuda:sm_90", {"autotune": True, "benchmark_fusion": True})
    run = load(artifact)
    error = relative_error(run(*inputs), reference)
    kernels = [(k["name"], k["numel"], k["rnumel"], k["config"], (k.get("autotune") or {}).get("ms"))
               for k in artifact.manifest["kernels"]]
    return {"us": round(graph_time_ms(run, inputs) * 1000, 2), "err": error, "kernels": kernels,
            "bench": artifact.manifest["fusion"]["benchmarked"]}


def main() -> None:
    wanted, out = sys.argv[1].split(","), sys.argv[2]
    modes = (sys.argv[3] if len(sys.argv) > 3 else "nomix,judge").split(",")
    for case in load_cases(wanted=wanted):
        started = time.time()
        inputs = case_inputs(case, seed=0, device="cuda")
        fn = to_fx(case.graph, "cuda")
        reference = _flatten(fn(*inputs))
        torch._dynamo.reset()
        inductor = torch.compile(fn)
        inductor(*inputs)
        row = {"case": case.name, "inductor": round(graph_time_ms(inductor, inputs) * 1000, 2)}
        for mode in modes:
            set_mode(mode)
            row[mode] = timed(case, inputs, reference)
        set_mode("judge")
        with open(out, "a") as f:
            f.write(json.dumps(row, default=str) + "\n")
        print(case.name, "inductor", row["inductor"], {m: row[m]["us"] for m in modes},
              f"{time.time() - started:.0f}s", flush=True)


if __name__ == "__main__":
    main()
