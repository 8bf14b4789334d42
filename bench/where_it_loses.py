"""Where a bench case loses to Inductor, on a GPU: each named case is compiled by fusewire
(autotuned, benchmark-driven fusion on) and by torch.compile, both are timed alternately
(`--rounds` times each, CUDA-graph replay on a cold L2, as bench/kernels.py times them), and
the kernels of both sides are recorded: fusewire's launch configs, candidate times and sources,
Inductor's chosen configs and Triton sources (found among its CachingAutotuner objects), and the
GPU time of every kernel inside a replay of each side (torch.profiler, cold L2 as timed): whether
a gap lies in one kernel or between kernels. One JSON row per case, appended to `out` as it is
measured.

    python3 bench/where_it_loses.py out.jsonl bench/held_out:convnext_bw_div_mul_sum bench/cases:gpt2_fw_native_layer_norm
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import compiler  # noqa: E402
from bench.gpu_profile import kernel_times_us  # noqa: E402
from bench.kernels import _flatten, capture_graph, graph_time_ms, relative_error  # noqa: E402
from bench.model_cases import case_inputs, load_cases  # noqa: E402
from client.cubin import cuda_target  # noqa: E402
from client.runtime import load  # noqa: E402
from compiler.fx_import import to_fx  # noqa: E402


def parse_spec(spec: str) -> tuple[Path, str]:
    """'folder:name-substring' as (folder, substring)."""
    folder, sep, name = spec.partition(":")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{spec!r}: expected FOLDER:NAME, e.g. bench/cases:layer_norm")
    return Path(folder), name


def inductor_autotuners() -> list[Any]:
    """Inductor's live CachingAutotuner objects (one per Triton kernel it launched)."""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    found = []
    for obj in gc.get_objects():
        try:
            if isinstance(obj, CachingAutotuner):
                found.append(obj)
        except ReferenceError:  # a weak proxy whose object is gone
            pass
    return found


def inductor_kernels(known: set[int]) -> list[dict]:
    """Name, chosen config and source of each autotuner not in `known` (ids seen before a compile)."""
    kernels = []
    for tuner in inductor_autotuners():
        if id(tuner) in known:
            continue
        try:
            config = tuner.launchers[0].config if tuner.launchers else None
            kernels.append({"name": tuner.fn.__name__, "config": str(config), "source": getattr(tuner.fn, "src", None)})
        except ReferenceError:
            pass
    return kernels


PROFILED_REPLAYS = 20


def kernel_profile_us(fn: Callable, inputs: list[torch.Tensor]) -> dict[str, float]:
    """Mean GPU us per replay of each kernel in a CUDA-graph replay of fn(*inputs), each replay
    after an L2 flush (whose kernels are left out), and their sum as "total"."""
    graph = capture_graph(fn, inputs)
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    flush_kernels = set(kernel_times_us(flush.zero_))

    def replays() -> None:
        for _ in range(PROFILED_REPLAYS):
            flush.zero_()
            graph.replay()

    per_kernel = {name: round(sum(t) / PROFILED_REPLAYS, 2)
                  for name, t in kernel_times_us(replays).items() if name not in flush_kernels}
    return per_kernel | {"total": round(sum(per_kernel.values()), 2)}


def probe(folder: Path, name: str, rounds: int) -> list[dict]:
    rows = []
    for case in load_cases(folder, wanted=[name]):
        torch._dynamo.reset()
        inputs = case_inputs(case, seed=0, device="cuda")
        fn = to_fx(case.graph, "cuda")
        reference = _flatten(fn(*inputs))
        artifact = compiler.compile(case.graph, cuda_target(), {"autotune": True, "benchmark_fusion": True})
        run = load(artifact)
        error = relative_error(run(*inputs), reference)
        known = {id(t) for t in inductor_autotuners()}
        inductor = torch.compile(fn)
        inductor(*inputs)
        times: dict[str, list[float]] = {"fusewire": [], "inductor": []}
        for _ in range(rounds):
            times["fusewire"].append(round(graph_time_ms(run, inputs) * 1000, 2))
            times["inductor"].append(round(graph_time_ms(inductor, inputs) * 1000, 2))
        ours = [{"name": k["name"], "numel": k["numel"], "rnumel": k["rnumel"], "config": k["config"],
                 "autotune": k.get("autotune"), "source": artifact.kernel_source(k)} for k in artifact.manifest["kernels"]]
        profiles = {"fusewire": kernel_profile_us(run, inputs), "inductor": kernel_profile_us(inductor, inputs)}
        rows.append({"case": case.name, "rel_error": error, "us": times, "kernel_us": profiles, "fusewire": ours,
                     "inductor": inductor_kernels(known)})
        print(case.name, times, json.dumps(profiles), flush=True)
    return rows


def run_probes(description: str, probe_cases: Callable[[Path, str, int], list[dict]]) -> None:
    """The command line of a probe over FOLDER:NAME specs: each case's rows appended to `out` as
    JSON lines as they are measured."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("out", help="JSON lines, appended")
    parser.add_argument("cases", nargs="+", type=parse_spec, help="FOLDER:NAME-SUBSTRING")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for folder, name in args.cases:
        for row in probe_cases(folder, name, args.rounds):
            with open(args.out, "a") as f:
                f.write(json.dumps(row, default=str) + "\n")


if __name__ == "__main__":
    run_probes(__doc__.split("\n\n")[0], probe)
