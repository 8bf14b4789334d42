"""The loop behind the A/B tools (bench/mixed_order_ab.py, bench/online_softmax_ab.py): each bench
case whose name contains one of the wanted substrings is compiled once per mode (autotuned,
benchmark-driven fusion on), checked against eager and timed as bench/kernels.py times it (a
CUDA-graph replay on a cold L2), with Inductor and a copy of the case's bytes beside it. One JSON
row per case, appended to `out` as it is measured."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

import compiler
from bench.kernels import _flatten, graph_time_ms, relative_error, same_bytes_copy_ms
from bench.model_cases import CASES_DIR, case_inputs, load_cases
from client.cubin import cuda_target
from client.runtime import load
from compiler.fx_import import to_fx


TUNED = {"autotune": True, "benchmark_fusion": True}
# the heuristics' configs and the score's fusions, as a large graph gets them where its tuning
# budget runs out: what an A/B of a heuristic compares
UNTUNED = {"autotune": False, "benchmark_fusion": False}


def timed(case, inputs: list[torch.Tensor], reference: list[torch.Tensor], options: dict = TUNED) -> dict:
    artifact = compiler.compile(case.graph, cuda_target(), options)
    run = load(artifact)
    error = relative_error(run(*inputs), reference)
    kernels = [(k["name"], k["numel"], k["rnumel"], k["config"], (k.get("autotune") or {}).get("ms"))
               for k in artifact.manifest["kernels"]]
    return {"us": round(graph_time_ms(run, inputs) * 1000, 2), "err": error, "kernels": kernels,
            "bench": artifact.manifest["fusion"]["benchmarked"]}


def case_dirs(argument: str | None) -> list[Path]:
    """The case folders a comma-separated command-line argument names; bench/cases without one."""
    return [Path(d) for d in argument.split(",")] if argument else [CASES_DIR]


def compare_modes(wanted: list[str], out: str, modes: list[str], set_mode: Callable[[str], None],
                  shipped: str, folders: Sequence[Path] = (CASES_DIR,), options: dict = TUNED) -> None:
    """Times every wanted case of each of `folders` under each mode (set_mode(mode) before its
    compile, with compile `options`), then puts the shipped mode back."""
    for case in (c for folder in folders for c in load_cases(folder, wanted=wanted)):
        started = time.time()
        inputs = case_inputs(case, seed=0, device="cuda")
        fn = to_fx(case.graph, "cuda")
        reference = _flatten(fn(*inputs))
        torch._dynamo.reset()
        inductor = torch.compile(fn)
        inductor(*inputs)
        row = {"case": case.name, "inductor": round(graph_time_ms(inductor, inputs) * 1000, 2),
               "copy": round(same_bytes_copy_ms(case.moved_bytes) * 1000, 2)}
        for mode in modes:
            set_mode(mode)
            row[mode] = timed(case, inputs, reference, options)
        set_mode(shipped)
        with open(out, "a") as f:
            f.write(json.dumps(row, default=str) + "\n")
        print(case.name, "inductor", row["inductor"], "copy", row["copy"], {m: row[m]["us"] for m in modes},
              f"{time.time() - started:.0f}s", flush=True)
