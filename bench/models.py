"""Training steps of the model zoo (tests/models/zoo.py) at realistic sizes on a GPU: eager,
Inductor (torch.compile defaults) and fusewire through its real stack (redis-server, a GPU Celery
worker, the API; started here unless --url is given).

    python bench/models.py [--models gpt2,llama] [--modes eager,inductor,fusewire] [--steps 20] [--json out.json]

Modes: eager, inductor, fusewire; `-cudagraphs` after inductor or fusewire replays CUDA graphs
(Inductor's mode="reduce-overhead", fusewire's cuda_graphs=True), `-save_all` after fusewire uses
aot_autograd's default partition instead of the min-cut partitioner (fusewire's default;
`-min_cut` names it explicitly, as runs before 2026-11-23 did).

Each model runs in bf16 on CUDA. One step is forward, loss and backward of the compiled module
(gradients set to None before each step; no optimizer, which stays outside the compiled module).
Per mode:
  first_step_s   the first step, compile included (fusewire: a cold compile on the service)
  hit_step_s     fusewire only: the first step again after torch._dynamo.reset() with an empty
                 local cache, so every artifact comes from the service's cache (a "service hit")
  step_ms        median of --steps timed steps after 3 warm-up steps (CUDA-synchronized wall time)
  kernels        GPU kernels launched by one step (torch.profiler)
  gpu_ms         GPU time of one step's kernels, summed (torch.profiler)
  host_ms        median CPU time to issue one step (no synchronization until it has returned)
  top_kernels    the step's kernels with the most GPU time: name, ms per step, launches
  peak_gib       peak GPU memory allocated over the whole mode (torch.cuda.max_memory_allocated)
  steady_peak_gib  the same over the timed steps only (no compiles, no CUDA-graph captures)
  fallbacks      graphs that ran eagerly (fusewire; on_error="raise" makes any fallback an error)
  loss           the first step's loss, a sanity check that the modes compute the same thing
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "models")]

from gpu_profile import host_time_ms, profile_kernels  # noqa: E402
from zoo import ZOO, build, make_batch, step_loss  # noqa: E402


def one_step(runner, name: str, model, batch: dict) -> torch.Tensor:
    for parameter in model.parameters():
        parameter.grad = None
    loss = step_loss(runner, name, batch)
    loss.backward()
    return loss.detach()


def timed(fn) -> tuple[float, object]:
    torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start, result


def host_profile(fn, top: int = 25) -> list:
    """Where one step's host time goes: cProfile's top functions by own time (10 steps)."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(10):
        fn()
    profiler.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(profiler).sort_stats("tottime")
    rows = []
    for (path, line, function), (_, calls, own, cumulative, _) in list(stats.stats.items()):
        rows.append([f"{Path(path).name}:{line}:{function}", calls // 10, round(own * 100, 3), round(cumulative * 100, 3)])
    return sorted(rows, key=lambda r: -r[2])[:top]  # [where, calls per step, own ms per step, cumulative ms per step]


def measure(name: str, mode: str, steps: int, url: str | None, partitioner: str = "min_cut",
            cprofile: bool = False, cuda_graphs: bool = False) -> dict:
    model = build(name, "bench").to(device="cuda", dtype=torch.bfloat16)
    batch = {k: v.cuda() for k, v in make_batch(name, "bench").items()}
    row: dict = {"model": name, "mode": mode}
    backend = None
    if mode == "eager":
        runner = model
    elif mode == "inductor":
        runner = torch.compile(model, mode="reduce-overhead" if cuda_graphs else None)
    else:
        from client.backend import backend as fusewire_backend

        backend = fusewire_backend(url=url, cache_dir=tempfile.mkdtemp(prefix="fw-bench-"), on_error="raise",
                                   timeout_s=900, partitioner=partitioner, cuda_graphs=cuda_graphs)
        row["partitioner"] = partitioner
        runner = torch.compile(model, backend=backend)
    torch.manual_seed(1)
    row["first_step_s"], loss = timed(lambda: one_step(runner, name, model, batch))
    row["loss"] = float(loss)
    if backend is not None:
        row["fallbacks"] = backend.stats.get("fallbacks", 0)
        row["backend_stats"] = dict(backend.stats)
        torch._dynamo.reset()
        hit = fusewire_backend(url=url, cache_dir=tempfile.mkdtemp(prefix="fw-bench-"), on_error="raise",
                               partitioner=partitioner, cuda_graphs=cuda_graphs)
        runner = torch.compile(model, backend=hit)
        row["hit_step_s"], _ = timed(lambda: one_step(runner, name, model, batch))
    for _ in range(3):
        one_step(runner, name, model, batch)
    warm_peak = torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()  # the timed steps' own peak: the steady state, without compiles and captures
    times = [timed(lambda: one_step(runner, name, model, batch))[0] * 1e3 for _ in range(steps)]
    row["steady_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    row["step_ms"] = statistics.median(times)
    row["host_ms"] = statistics.median(host_time_ms(lambda: one_step(runner, name, model, batch)) for _ in range(5))
    row.update(profile_kernels(lambda: one_step(runner, name, model, batch)))
    if cprofile:
        row["host_profile"] = host_profile(lambda: one_step(runner, name, model, batch))
    row["peak_gib"] = max(warm_peak, torch.cuda.max_memory_allocated()) / 2**30
    if backend is not None:
        row["hit_stats"], row["uncaptured"] = dict(hit.stats), dict(hit.uncaptured)  # the hit step and all after it
    torch._dynamo.reset()
    return row


def start_stack(state_dir: Path):
    from client.stack import Stack, StackConfig

    major, minor = torch.cuda.get_device_capability()
    stack = Stack(StackConfig(port=0, state_dir=state_dir, targets=[f"cuda:sm_{major}{minor}"],
                              trust_file=state_dir / "trusted_keys"))
    stack.start()
    os.environ["FUSEWIRE_TRUSTED_KEYS_FILE"] = str(stack.trusted_in)  # this run's dev key, not ~/.config's
    return stack


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(ZOO))
    parser.add_argument("--modes", default="eager,inductor,fusewire",
                        help="eager, inductor, fusewire (the min-cut partitioner); suffixes: -save_all "
                             "(fusewire with aot_autograd's default partition), -cudagraphs (fusewire's CUDA-graph "
                             "mode; Inductor's mode='reduce-overhead'), e.g. fusewire-save_all-cudagraphs")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--url", help="a running fusewire service (default: start one here)")
    parser.add_argument("--cprofile", action="store_true", help="add each mode's top host functions (cProfile)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--state-dir", type=Path, help="the started stack's Redis data and logs (default: a temp dir)")
    args = parser.parse_args()
    stack = None
    url = args.url
    modes = args.modes.split(",")
    if any(m.startswith("fusewire") for m in modes) and url is None:
        stack = start_stack(args.state_dir or Path(tempfile.mkdtemp(prefix="fw-stack-")))
        url = stack.url
    rows = []
    try:
        for name in args.models.split(","):
            for mode in modes:
                torch.cuda.reset_peak_memory_stats()
                try:
                    base, *suffixes = mode.split("-")
                    partitioner = "save_all" if "save_all" in suffixes else "min_cut"
                    row = measure(name, base, args.steps, url, partitioner, args.cprofile,
                                  cuda_graphs="cudagraphs" in suffixes) | {"mode": mode}
                except Exception as exc:  # one model's failure is a result too; the rest still run
                    row = {"model": name, "mode": mode, "error": f"{type(exc).__name__}: {str(exc)[:2000]}"}
                rows.append(row)
                print(json.dumps(row), flush=True)
                gc.collect()  # the mode's graphs and CUDA-graph pools go before the next mode's peak is measured
                torch.cuda.empty_cache()
    finally:
        if stack is not None:
            stack.stop()
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                         "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
