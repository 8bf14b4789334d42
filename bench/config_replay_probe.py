"""Whether autotuning's timing of a kernel alone ranks its candidate configs as a CUDA-graph replay
of the whole case does, on a GPU: for each named single-kernel bench case, every candidate config
autotuning tries is compiled on its own (the candidate list forced to that one config), then all
of them and Inductor are timed in turn for `--rounds` rounds, as bench/kernels.py times a case
(replay on a cold L2). Each row: the config, its time alone (autotune.time_kernel, as tuning saw
it), the same launch timed as a replay of a CUDA graph holding it alone (`alone_graph_us`,
time_kernel's other mode), and its replay medians. One JSON row per case, appended to `out`.

    python3 bench/config_replay_probe.py out.jsonl bench/held_out:swin_fw_native_layer_norm_constant_pad_nd_32x28x28x192
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import compiler  # noqa: E402
import compiler.autotune as autotune  # noqa: E402
from bench.kernels import graph_time_ms  # noqa: E402
from bench.model_cases import case_inputs, load_cases  # noqa: E402
from bench.where_it_loses import run_probes  # noqa: E402
from client.cubin import cuda_target  # noqa: E402
from client.runtime import load  # noqa: E402
from compiler.fx_import import to_fx  # noqa: E402

OPTIONS = {"autotune": True, "benchmark_fusion": False}


def compile_with(graph, config: dict | None):
    """The case compiled with its kernel's candidates forced to [config] (None: autotuning's own)."""
    shipped = autotune.candidate_configs
    if config is not None:
        autotune.candidate_configs = lambda kernel, can_regenerate=False: [config]
    try:
        return compiler.compile(graph, cuda_target(), OPTIONS)
    finally:
        autotune.candidate_configs = shipped


def timed_both_ways(graph_us: dict[str, list[float]]):
    """A stand-in for autotune.time_kernel that also times each launch in time_kernel's other
    mode, recording those times by config."""
    shipped = autotune.time_kernel

    def timer(kernel, sizes):
        other = shipped(kernel, sizes, as_graph=not autotune.TIME_AS_GRAPH)
        graph_us.setdefault(json.dumps(kernel.config, sort_keys=True), []).append(round(other * 1000, 2))
        return shipped(kernel, sizes)

    return timer


def probe(folder: Path, name: str, rounds: int) -> list[dict]:
    rows = []
    for case in load_cases(folder, wanted=[name]):
        torch._dynamo.reset()
        inputs = case_inputs(case, seed=0, device="cuda")
        other_mode_us: dict[str, list[float]] = {}
        shipped_timer = autotune.time_kernel
        autotune.time_kernel = timed_both_ways(other_mode_us)
        try:
            tuned = compile_with(case.graph, None)
        finally:
            autotune.time_kernel = shipped_timer
        (kernel,) = tuned.manifest["kernels"]
        candidates = kernel["autotune"]["candidates"]
        runs = {json.dumps(config, sort_keys=True): load(compile_with(case.graph, config)) for config in candidates}
        runs["inductor"] = torch.compile(to_fx(case.graph, "cuda"))
        runs["inductor"](*inputs)
        replay_us: dict[str, list[float]] = {key: [] for key in runs}
        for _ in range(rounds):
            for key, run in runs.items():
                replay_us[key].append(round(graph_time_ms(run, inputs) * 1000, 2))
        other_key = "alone_plain_us" if autotune.TIME_AS_GRAPH else "alone_graph_us"
        configs = [{"config": config, "alone_us": None if kernel["autotune"]["ms"][j] is None else  # does not load
                    round(kernel["autotune"]["ms"][j] * 1000, 2),
                    other_key: statistics.median(other_mode_us.get(json.dumps(config, sort_keys=True), [0.0])),
                    "replay_us": replay_us[json.dumps(config, sort_keys=True)]} for j, config in enumerate(candidates)]
        row = {"case": case.name, "chosen": kernel["config"], "time_as_graph": autotune.TIME_AS_GRAPH,
               "configs": configs,
               "inductor_replay_us": replay_us["inductor"]}
        rows.append(row)
        print(case.name, "inductor", statistics.median(replay_us["inductor"]), flush=True)
        for entry in configs:
            print(f"  {entry['config']}  alone {entry['alone_us']}  {other_key} {entry[other_key]}  "
                  f"replay {statistics.median(entry['replay_us'])}", flush=True)
    return rows


if __name__ == "__main__":
    run_probes(__doc__.split("\n\n")[0], probe)
