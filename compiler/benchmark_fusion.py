"""Benchmark-driven fusion, as the seed's speedup_by_fusion: where the scheduler's score is
not decisive, build the fused kernel and its two parts, time them on the worker's GPU, and
keep the fusion only if the fused kernel is faster than the parts together.

Not decisive (`uncertain`):
- a horizontal fusion (neither part reads what the other writes): it saves one read of a shared
  input but makes one bigger kernel, which can cost registers and parallelism;
- a looped reduction (a row too long for registers) with a pointwise part that walks the row:
  the fused kernel may re-read the row in a second loop;
- a reduction with a part that loads a window of one buffer (a pooling backward, a stencil):
  the window's loads repeat in the reduction's access order (compiler/window_fusion.py, which
  keeps such a part apart when it is not timed);
- a column reduction (its loads contiguous along its outputs, a bias gradient) with pointwise work
  whose results are stored: the fused kernel writes them in the reduction's order, where alone they
  stream in memory order and the reduction re-reads one of them;
- recomputing instead of storing (compiler/inline_gathers.py): a result read only through
  gathers is recomputed at each gathered element, which saves writing and re-reading it but
  repeats its work (and its reads) once per gather. Here the whole program is scheduled both
  ways and `pick_schedule` times every kernel of each.

Each kernel's time counts one LAUNCH_COST_MS on top of its GPU time: a launch costs the runtime
host time and leaves the GPU a gap between kernels, which a kernel's timing in isolation does
not see. So a fusion that saves a launch is kept unless it makes the GPU slower by more than that.

Every decision is recorded with both timings (the manifest's fusion.benchmarked). Decisions
are deterministic given the timings: fuse iff fused + one launch < the parts + their launches
(strictly). When the two sides are within autotune.CLOSE_CALL, every kernel of both is timed again,
in turn, and each one's median counts (autotune.retimed): a single timing flipped the channels-last
CNN block's recompute-or-store trial, a 1.5 % call, between compiles of the same graph.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from compiler.autotune import Timer, benchmark_buffers, gpu_timer, is_close_call, retimed
from compiler.codegen import generate_kernel
from compiler.codegen.aot import build_cubins, fits_target
from compiler.codegen.heuristics import GPU_PERSISTENT_LIMIT, next_power_of_2
from compiler.dependencies import ReadWrites, buffers_read_and_written
from compiler.inline_gathers import GATHERED_TRIAL
from compiler.ir import Program
from compiler.options import CompileOptions
from compiler.scheduler import KernelGroup, Schedule, internal_buffers
from compiler.split_reductions import is_outer, rows_before_split
from compiler.strided_fusion import strided_bytes
from compiler.window_fusion import window_in_reduction

# What one more launch costs a step beyond its kernel's GPU time: about the runtime's host time per
# launch (bench/host_overhead.py: 5-9 us on an H100 host) less what overlaps with the GPU's work.
LAUNCH_COST_MS = 0.003


# Configs a looped reduction is also timed with, its best time counting: autotuning tries them
# later, and a fusion judged on the heuristic's config alone can lose to parts that it would beat
# once tuned (a log_softmax's three loops: 0.49 ms with 8 warps, 0.35 with 16, against 0.39 ms
# for its two parts). 32 warps (1024 threads) leave room for fewer programs per SM, so fewer rows are
# in flight and a fused second pass over a long row finds it still in L2 (H100, 2026-11-24, GPT-2's
# log-softmax over 50257 in one kernel: 1256 us on 16 warps, 1064 on 32; its two parts 1203).
LOOPED_TRIALS = ({"num_warps": 16}, {"num_warps": 32})
# A mixed-order kernel (compiler/mixed_order.py) is also timed with other rows per step and warps:
# with its few programs, the step decides its speed more than anything else autotuning varies.
# Which: the configs that came within 3 % of the fastest most often in autotuning besides the
# heuristic's (H200, 2026-11-27, bench/heuristic_fit.py over 35 mixed kernels; 4 rows on 8 warps, a
# trial before, never did).
MIXED_TRIALS = ({"XBLOCK": 2, "num_warps": 4}, {"XBLOCK": 1, "num_warps": 4}, {"XBLOCK": 8, "num_warps": 4})
FUSION_SHARE = 0.5  # of autotune_budget_s
# ...asked where each column is reduced over this many rows or more
WHOLE_COLUMN_ROWS = 2048
COLUMN_STORES_TIMED = True  # stores_pointwise_in_column_order is a question (off: the score decides; A/B runs)
# ...also where the columns are reduced in chunks (a split's first pass): Hiera's q/k/v gradients
# stacked into its fused projection's layout beside their bias's column sum over 100352 rows, 256-row
# chunks (H200, 2026-11-28: 88 us fused, Inductor 66). Off: whole columns only (A/B runs)
SPLIT_COLUMN_STORES_TIMED = True


def with_launches(kernel_ms: list[float]) -> float:
    """The kernels' GPU time plus one LAUNCH_COST_MS each: what they cost a step."""
    return sum(kernel_ms) + LAUNCH_COST_MS * len(kernel_ms)


def uncertain(first: KernelGroup, second: KernelGroup, fused: KernelGroup, read_writes: dict[str, ReadWrites],
              program: Program | None = None) -> str | None:
    """Why the score alone should not decide this fusion, or None when it may. `program`: where
    buffers are seen from outside the fused group (without it, that question is not asked)."""
    first_reads, first_writes = buffers_read_and_written(first.node_names, read_writes)
    second_reads, second_writes = buffers_read_and_written(second.node_names, read_writes)
    if fused.mix_rows:
        return "mixed-order reduction: row and column sums in one kernel of fewer programs"
    if not (first_writes & second_reads or second_writes & first_reads):
        return "horizontal fusion: the parts only share inputs"
    looped = fused.is_reduction and next_power_of_2(fused.rnumel) > GPU_PERSISTENT_LIMIT
    if looped and any(not n.is_reduction and fused.mapping.uses_rindex(n) for n in fused.nodes):
        return "looped reduction fused with work over the whole row"
    if window_in_reduction(first.nodes, second.nodes, fused.is_reduction, read_writes):
        return "reduction fused with a window's loads (pooling, a stencil): compiler/window_fusion.py"
    if COLUMN_STORES_TIMED and program is not None \
            and stores_pointwise_in_column_order(first, second, fused, read_writes, program):
        return "column reduction fused with pointwise work whose results are stored"
    return None


def stores_pointwise_in_column_order(first: KernelGroup, second: KernelGroup, fused: KernelGroup,
                                     read_writes: dict[str, ReadWrites], program: Program) -> bool:
    """A reduction along long columns (its loads contiguous along the outputs) takes pointwise work whose
    results other kernels or the caller read: the fused kernel stores them in the column reduction's
    order, a tile of rows at a time, where a pointwise kernel alone streams them in memory order and
    the reduction re-reads one of them. ALBERT's vocabulary-wide cross-entropy backward with its
    decoder bias's gradient (4096 x 30000 bf16, H200, 2026-11-28): fused 539 us autotuned; Inductor's
    pointwise kernel + column sum 373 us. Where the columns are cut in chunks (a split's first pass),
    only when the stored work also accesses some buffer strided along both tile axes (Hiera's stack
    of a transposed key gradient): a bias gradient beside its elementwise producer, in the same
    layout, is left to the score."""
    outer = [n for n in fused.nodes if n.is_reduction and is_outer(n)]
    if not fused.is_reduction or not any(_column_rows(n) >= WHOLE_COLUMN_ROWS for n in outer):
        return False
    internal = internal_buffers(fused.node_names, read_writes, program)
    stored = [part for part in (first, second)
              if not part.is_reduction and any(fused.mapping.uses_rindex(n) for n in part.nodes)
              and buffers_read_and_written(part.node_names, read_writes)[1] - internal]
    if not stored or any(n.rnumel >= WHOLE_COLUMN_ROWS for n in outer):
        return bool(stored)
    itemsize, sizes = program.buffer_itemsizes(), program.buffer_bytes()
    return any(strided_bytes(set(part.node_names), fused, read_writes, sizes, itemsize, internal)[0]
               for part in stored)


def _column_rows(node: Any) -> int:
    return rows_before_split(node) if SPLIT_COLUMN_STORES_TIMED else node.rnumel


class FusionBenchmarker:
    """The `judge` that compiler.scheduler.schedule consults on a GPU worker."""

    def __init__(self, target: str, options: CompileOptions, timer: Timer) -> None:
        self.target, self.timer = target, timer
        # at most half of the graph's budget, so that autotuning always has the rest: a BERT or
        # ResNet graph makes 15-30 uncertain fusions, which took all of a 10 s budget, and none
        # of their kernels was autotuned
        self.budget_s = options.autotune_budget_s * FUSION_SHARE
        self.spent_s = 0.0

    @classmethod
    def for_target(cls, target: str, options: CompileOptions) -> "FusionBenchmarker | None":
        timer = gpu_timer(target) if options.benchmark_fusion and target.startswith("cuda:") else None
        return cls(target, options, timer) if timer is not None else None

    def __call__(self, first: Any, second: Any, fused: KernelGroup, read_writes: dict[str, ReadWrites],
                 program: Program) -> tuple[bool, dict] | None:
        why = uncertain(first, second, fused, read_writes, program)
        if why is None or self.spent_s > self.budget_s:
            return None
        started = time.perf_counter()
        dtypes, sizes = program.buffer_dtypes(), benchmark_buffers(program, read_writes)
        kernels = [self._kernel(group, read_writes, program, dtypes) for group in (fused, first, second)]
        best = self._best_trials(kernels, dtypes, sizes)
        if best is None:
            return None  # a kernel with no config that loads on the target: the score decides
        trials, times = best
        if is_close_call(with_launches(times[:1]), with_launches(times[1:])):
            times = retimed([(trial, sizes) for trial in trials], times, self.timer)
        fused_ms, *parts_ms = times
        self.spent_s += time.perf_counter() - started
        keep = with_launches([fused_ms]) < with_launches(parts_ms)
        verdict = "faster" if keep else "not faster"
        record = {"node1": first.name, "node2": second.name, "why_benchmarked": why, "fused_ms": fused_ms,
                  "unfused_ms": parts_ms, "fused": keep,
                  "reason": f"benchmark: fused {fused_ms:.4f} ms is {verdict} than the parts' {sum(parts_ms):.4f} ms "
                            f"(one launch counts {LAUNCH_COST_MS} ms)"}
        return keep, record

    def pick_schedule(self, recomputed: Schedule, stored: Schedule, producers: list[str],
                      trial: tuple[str, str] = GATHERED_TRIAL, prefer_recomputed: bool = True) -> Schedule:
        """The faster of two whole schedules: `producers` recomputed by their readers, or stored once
        and read back. `trial`: (who recomputes, why it was timed), for the manifest. The preferred
        one (recomputing gathered results, the heuristic's choice; storing transposed results) is
        kept unless the other is strictly faster, and when the budget is spent."""
        if self.spent_s > self.budget_s:
            return recomputed if prefer_recomputed else stored
        started = time.perf_counter()
        both_timed = self._trials(recomputed), self._trials(stored)
        if None in both_timed:  # a kernel with no config that loads on the target
            return recomputed if prefer_recomputed else stored
        (recomputed_trials, recomputed_ms), (stored_trials, stored_ms) = both_timed
        if is_close_call(with_launches(recomputed_ms), with_launches(stored_ms)):
            both = retimed(recomputed_trials + stored_trials, recomputed_ms + stored_ms, self.timer)
            recomputed_ms, stored_ms = both[:len(recomputed_ms)], both[len(recomputed_ms):]
        self.spent_s += time.perf_counter() - started
        if prefer_recomputed:
            recompute = not with_launches(stored_ms) < with_launches(recomputed_ms)
        else:
            recompute = with_launches(recomputed_ms) < with_launches(stored_ms)
        chosen = recomputed if recompute else stored
        readers, why = trial
        chosen.fusion_log["benchmarked"].append({
            "node1": ", ".join(producers), "node2": readers, "why_benchmarked": why,
            "fused_ms": sum(recomputed_ms), "unfused_ms": stored_ms, "fused": recompute,
            "recomputed_kernels_ms": recomputed_ms,
            "reason": f"benchmark: recomputing takes {sum(recomputed_ms):.4f} ms in {len(recomputed_ms)} kernels, "
                      f"storing {sum(stored_ms):.4f} ms in {len(stored_ms)} (one launch counts {LAUNCH_COST_MS} ms)"})
        return chosen

    def _trials(self, schedule: Schedule) -> tuple[list[tuple[Any, dict]], list[float]] | None:
        """The best trial of each of the schedule's kernels with the buffers it is timed on (the
        schedule's own: a stored result is a buffer only one of two schedules has), and its time;
        None when a kernel has no trial that loads on the target."""
        from compiler.codegen import generate

        dtypes, sizes = schedule.program.buffer_dtypes(), benchmark_buffers(schedule.program, schedule.read_writes)
        best = self._best_trials(generate(schedule, self.target).kernels, dtypes, sizes)
        return None if best is None else ([(trial, sizes) for trial in best[0]], best[1])

    def _best_trials(self, kernels: list[Any], dtypes: dict[str, str],
                     sizes: dict) -> tuple[list[Any], list[float]] | None:
        """Each kernel's fastest trial (its own config and, for a looped reduction, LOOPED_TRIALS)
        and that trial's time, of the trials that load on the target; None when a kernel has none
        (autotune.fit_to_target finds its final config)."""
        groups = [[kernel] + [replace(kernel, config=kernel.config | variant) for variant in _trial_variants(kernel)]
                  for kernel in kernels]
        build_cubins([trial for group in groups for trial in group], dtypes, self.target)
        loadable = [[trial for trial in group if fits_target(trial, self.target)] for group in groups]
        if not all(loadable):
            return None
        timed = [min(((self.timer(trial, sizes), j, trial) for j, trial in enumerate(group)), key=lambda t: t[:2])
                 for group in loadable]
        return [trial for _, _, trial in timed], [ms for ms, _, _ in timed]

    def _kernel(self, group: KernelGroup, read_writes: dict[str, ReadWrites], program: Program,
                dtypes: dict[str, str]) -> Any:
        """The group's kernel as codegen would write it (named for the benchmark only)."""
        internal = internal_buffers(group.node_names, read_writes, program) if len(group.nodes) > 1 else set()
        probe = replace(group, name="benchmarked", internal=internal)
        return generate_kernel(probe, Schedule(program, [probe], read_writes, {}), dtypes, self.target)


def _trial_variants(kernel: Any) -> list[dict]:
    config = kernel.config
    if config.get("mix_rows"):
        return [v for v in MIXED_TRIALS if config["mix_rows"] % v["XBLOCK"] == 0 and config | v != config]
    looped = kernel.rnumel > 1 and not config["persistent"] and not config.get("outer") and not config.get("tiled")
    return [v for v in LOOPED_TRIALS if config | v != config] if looped else []
