"""Training steps of the model zoo (tests/models/zoo.py) at realistic sizes on a GPU: eager,
Inductor (torch.compile defaults) and fusewire through its real stack (redis-server, a GPU Celery
worker, the API; started here unless --url is given).

    python bench/models.py [--models gpt2,llama] [--modes eager,inductor,fusewire] [--steps 20] [--json out.json]

Models: the zoo's; its held-out ones (mistral, gpt_neox, bloom, opt, convnext, efficientnet, swin,
and zoo.HELD_OUT_2's: never tuned on, not run unless named); and `block` (not run unless named): issue 13's GPT-2-style transformer block
(tests/client/client_models.py `Block`: pre-norm, causal attention written out as matmul, mask and
softmax, GELU MLP), 1024 wide, 16 heads, batch 8 x 1024 tokens, loss = mean of its output squared.

Modes: eager, inductor, fusewire; `-cudagraphs` after inductor or fusewire replays CUDA graphs
(Inductor's mode="reduce-overhead", fusewire's cuda_graphs=True), `-save_all` after fusewire uses
aot_autograd's default partition instead of the min-cut partitioner (fusewire's default;
`-min_cut` names it explicitly, as runs before 2026-11-23 did), `-ungrouped` after fusewire turns
off the grouping of linears over one input (group_linears=False; on by default since 2026-11-24),
`-nchw` after fusewire leaves convolutions in eager's layout (channels_last="off"; "auto", which runs
half-precision convolutions on channels-last tensors, is the default since 2026-11-25).

Each model runs on CUDA under one training recipe (`--recipe`): "bf16" (the default: weights and
activations in bf16), "autocast" (float32 weights, the step under torch.autocast to bf16: mixed
precision as most training scripts run it) or "checkpointing" (bf16, activation checkpointing on:
transformers' gradient_checkpointing_enable, timm's set_grad_checkpointing). One step is forward, loss and backward of the compiled module
(gradients set to None before each step; no optimizer, which stays outside the compiled module).
Per mode:
  first_step_s   the first step, compile included (fusewire: a cold compile on the service)
  hit_step_s     fusewire only: the first step again after torch._dynamo.reset() with an empty
                 local cache, so every artifact comes from the service's cache (a "service hit")
  step_ms        median of --steps timed steps after 3 warm-up steps (CUDA-synchronized wall time),
                 taken in --rounds rounds that go through the modes in turn (side by side: a drift
                 of the machine's speed during the run affects every mode alike)
  kernels        GPU kernels launched by one step (torch.profiler)
  gpu_ms         GPU time of one step's kernels, summed (torch.profiler)
  host_ms        median CPU time to issue one step (no synchronization until it has returned), one
                 per round
  top_kernels    the step's kernels with the most GPU time: name, ms per step, launches
  peak_gib       peak GPU memory allocated while the mode was set up (compiles, first steps, CUDA-graph
                 captures; torch.cuda.max_memory_allocated), the other modes' memory left out
  steady_peak_gib  one step's peak as if the model were alone: other modes' gradients dropped, their
                 parameters and caches left out, this mode's own counted (its `resident_gib`)
  resident_gib   what the mode keeps allocated between steps, gradients dropped: the model's
                 parameters and buffers, its batch, and whatever its compiled code holds on to. Process-wide
                 state (cuBLAS workspaces) is made by an eager step before any mode is set up, so
                 it is nobody's
  fallbacks      graphs that ran eagerly (fusewire; on_error="raise" makes any fallback an error)
  loss           the first step's loss, a sanity check that the modes compute the same thing
A mode or a model that fails gets a row with its `error` instead; the models after it still run,
`--json` is rewritten after each model, and the command exits non-zero at the end.
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
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "models"), str(ROOT / "tests" / "client")]

from client.cubin import cuda_target  # noqa: E402
from client_models import Block  # noqa: E402
from gpu_profile import host_time_ms, profile_kernels  # noqa: E402
from zoo import HELD_OUT, ZOO, build, make_batch, step_loss, with_checkpointing  # noqa: E402

BLOCK_WIDTH, BLOCK_HEADS, BLOCK_BATCH = 1024, 16, (8, 1024)
RECIPES = ("bf16", "autocast", "checkpointing")


class BlockLoss(torch.nn.Module):
    """The `block` model: one transformer block and its loss, compiled as one module."""

    def __init__(self) -> None:
        super().__init__()
        self.block = Block(BLOCK_WIDTH, BLOCK_HEADS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x).float().square().mean()


def build_model(name: str, recipe: str = "bf16") -> torch.nn.Module:
    """The model on the GPU as `recipe` trains it (RECIPES)."""
    if name != "block":
        model = build(name, "bench")
    else:
        torch.manual_seed(0)
        model = BlockLoss().train()
    if recipe == "checkpointing":
        with_checkpointing(model)
    return model.to(device="cuda", dtype=torch.float32 if recipe == "autocast" else torch.bfloat16)


def model_batch(name: str) -> dict[str, torch.Tensor]:
    if name != "block":
        return make_batch(name, "bench")
    return {"x": torch.randn(*BLOCK_BATCH, BLOCK_WIDTH, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)}


def model_loss(runner, name: str, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return runner(batch["x"]) if name == "block" else step_loss(runner, name, batch)


def drop_gradients(model: torch.nn.Module) -> None:
    for parameter in model.parameters():
        parameter.grad = None


def one_step(runner, name: str, model, batch: dict, recipe: str = "bf16") -> torch.Tensor:
    drop_gradients(model)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=recipe == "autocast"):
        loss = model_loss(runner, name, batch)
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


class Mode:
    """One mode of one model, set up (compiled, first steps run) and ready to time."""

    def __init__(self, name: str, mode: str, url: str | None, partitioner: str, cuda_graphs: bool,
                 group_linears: bool = True, channels_last: str = "auto", recipe: str = "bf16") -> None:
        self.name, self.mode, self.recipe = name, mode, recipe
        self.model = build_model(name, recipe)
        self.batch = {k: v.cuda() for k, v in model_batch(name).items()}
        self.row: dict = {"model": name, "mode": mode, "recipe": recipe}
        self.times: list[float] = []
        self.hosts: list[float] = []
        base = mode.split("-")[0]
        self.backend = self.hit = None
        self.settings = dict(url=url, on_error="raise", partitioner=partitioner, cuda_graphs=cuda_graphs,
                             group_linears=group_linears, channels_last=channels_last)
        if base == "eager":
            self.runner = self.model
        elif base == "inductor":
            self.runner = torch.compile(self.model, mode="reduce-overhead" if cuda_graphs else None)
        else:
            from client.backend import backend as fusewire_backend

            self.backend = fusewire_backend(cache_dir=tempfile.mkdtemp(prefix="fw-bench-"), timeout_s=900, **self.settings)
            self.row["partitioner"] = partitioner
            self.runner = torch.compile(self.model, backend=self.backend)

    def step(self) -> torch.Tensor:
        return one_step(self.runner, self.name, self.model, self.batch, self.recipe)

    def set_up(self, resident: int) -> None:
        """First step (the compile), the service hit for fusewire, three warm-up steps. `resident`:
        the memory allocated before this mode's model was built (other modes'), left out of its peak."""
        torch.manual_seed(1)
        self.row["first_step_s"], loss = timed(self.step)
        self.row["loss"] = float(loss)
        if self.backend is not None:
            self.row["fallbacks"] = self.backend.stats.get("fallbacks", 0)
            self.row["backend_stats"] = dict(self.backend.stats)
            from client.backend import backend as fusewire_backend

            torch._dynamo.reset()  # every compiled frame: fusewire modes are set up before the others
            self.hit = fusewire_backend(cache_dir=tempfile.mkdtemp(prefix="fw-bench-"), **self.settings)
            self.runner = torch.compile(self.model, backend=self.hit)
            self.row["hit_step_s"], _ = timed(self.step)
        for _ in range(3):
            self.step()
        self.row["peak_gib"] = (torch.cuda.max_memory_allocated() - resident) / 2**30
        drop_gradients(self.model)
        gc.collect()
        torch.cuda.synchronize()
        self.resident = torch.cuda.memory_allocated() - resident
        self.row["resident_gib"] = self.resident / 2**30

    def time_round(self, steps: int) -> None:
        self.times += [timed(self.step)[0] * 1e3 for _ in range(steps)]
        self.hosts.append(host_time_ms(self.step))

    def steady_peak_gib(self, others: list["Mode"]) -> float:
        """One step's peak as if this model were alone on the GPU: the other modes' gradients are
        dropped first, and their resident memory (parameters, caches) is not counted; this mode's
        is (measured after its set-up)."""
        for mode in (*others, self):
            drop_gradients(mode.model)
        gc.collect()
        torch.cuda.synchronize()
        resident = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        self.step()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - resident + self.resident) / 2**30

    def finish(self, others: list["Mode"], top_kernels: int, cprofile: bool) -> dict:
        row = self.row
        row["step_ms"] = statistics.median(self.times)
        row["host_ms"] = statistics.median(self.hosts)
        row["steady_peak_gib"] = self.steady_peak_gib(others)
        row.update(profile_kernels(self.step, top=top_kernels))
        if cprofile:
            row["host_profile"] = host_profile(self.step)
        if self.backend is not None:
            row["hit_stats"], row["uncaptured"] = dict(self.hit.stats), dict(self.hit.uncaptured)
        return row


def measure_model(name: str, modes: list[str], steps: int, rounds: int, url: str | None,
                  top_kernels: int = 8, cprofile: bool = False, recipe: str = "bf16") -> list[dict]:
    """Every mode of one model, timed side by side: set up one after the other (fusewire first: its
    service-hit check resets dynamo), then `rounds` rounds in which each mode runs steps/rounds timed
    steps and one host-time step, so a drift of the machine's speed affects all modes alike."""
    ordered = sorted(modes, key=lambda m: not m.startswith("fusewire"))
    make_process_state(name, recipe)
    set_up: list[Mode] = []
    rows: dict[str, dict] = {}
    for mode in ordered:
        try:
            suffixes = mode.split("-")[1:]
            torch.cuda.reset_peak_memory_stats()
            resident = torch.cuda.memory_allocated()
            candidate = Mode(name, mode, url, "save_all" if "save_all" in suffixes else "min_cut",
                             "cudagraphs" in suffixes, "ungrouped" not in suffixes,
                             "off" if "nchw" in suffixes else "auto", recipe)
            candidate.set_up(resident)
            set_up.append(candidate)
        except Exception as exc:  # one mode's failure is a result too; the rest still run
            rows[mode] = {"model": name, "mode": mode, "error": f"{type(exc).__name__}: {str(exc)[:2000]}"}
    for mode in set_up:  # a later mode's dynamo reset dropped an earlier one's frames: compiled again here
        mode.step()
    per_round = max(1, steps // rounds)
    for _ in range(rounds):
        for mode in set_up:
            mode.time_round(per_round)
    for mode in set_up:
        rows[mode.mode] = mode.finish([m for m in set_up if m is not mode], top_kernels, cprofile)
    torch._dynamo.reset()
    return [rows[mode] for mode in modes]


def make_process_state(name: str, recipe: str) -> None:
    """One eager step of a throwaway copy of the model, so that what a process allocates once and
    keeps (cuBLAS workspaces) exists before the first mode's resident memory is measured."""
    model = build_model(name, recipe)
    batch = {key: value.cuda() for key, value in model_batch(name).items()}
    one_step(model, name, model, batch, recipe)
    del model, batch
    gc.collect()
    torch.cuda.synchronize()


def start_stack(state_dir: Path):
    from client.stack import Stack, StackConfig

    stack = Stack(StackConfig(port=0, state_dir=state_dir, targets=[cuda_target()],
                              trust_file=state_dir / "trusted_keys"))
    stack.start()
    os.environ["FUSEWIRE_TRUSTED_KEYS_FILE"] = str(stack.trusted_in)  # this run's dev key, not ~/.config's
    return stack


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(ZOO),
                        help="zoo models, held-out ones (" + ",".join(HELD_OUT) + ") and/or `block`")
    parser.add_argument("--modes", default="eager,inductor,fusewire",
                        help="eager, inductor, fusewire (the min-cut partitioner); suffixes: -save_all "
                             "(fusewire with aot_autograd's default partition), -cudagraphs (fusewire's CUDA-graph "
                             "mode; Inductor's mode='reduce-overhead'), -ungrouped (fusewire, linears not grouped), "
                             "-nchw (fusewire, convolutions in eager's layout), e.g. fusewire-save_all-cudagraphs")
    parser.add_argument("--recipe", choices=RECIPES, default="bf16",
                        help="bf16 weights and activations; float32 weights under autocast to bf16; or bf16 with "
                             "activation checkpointing")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5, help="rounds the timed steps are interleaved in")
    parser.add_argument("--url", help="a running fusewire service (default: start one here)")
    parser.add_argument("--cprofile", action="store_true", help="add each mode's top host functions (cProfile)")
    parser.add_argument("--top-kernels", type=int, default=8, help="how many of a step's kernels (by GPU time) to list")
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
            try:
                for row in measure_model(name, modes, args.steps, args.rounds, url, args.top_kernels, args.cprofile,
                                         args.recipe):
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            except Exception as error:  # one model's failure is its row; the models after it still run
                rows.append({"model": name, "error": f"{type(error).__name__}: {error}"[:2000]})
                print(json.dumps(rows[-1]), flush=True)
            gc.collect()  # the model's graphs and CUDA-graph pools go before the next model's peak is measured
            torch.cuda.empty_cache()
            if args.json:  # after each model, so a run cut short keeps what it measured
                args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                                 "rows": rows}, indent=1))
    finally:
        if stack is not None:
            stack.stop()
    if any("error" in row for row in rows):
        raise SystemExit(f"{sum('error' in row for row in rows)} model(s) failed: see their rows")


if __name__ == "__main__":
    main()
