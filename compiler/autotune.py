"""Stage 4b: launch configs and binaries. For cuda targets, `tune_and_build` times a few
launch configs per kernel on a GPU worker, keeps the fastest, builds every kernel's cubin and
rebuilds the launch plan; the cpu target keeps codegen's heuristic configs.

For each kernel a small, fixed list of candidates is built (the heuristic's config first,
then variants of XBLOCK, RBLOCK, num_warps and num_stages that keep the generated source
valid, none launching fewer than MIN_PROGRAMS programs unless the heuristic's does, and for a
mixed-order kernel some with its loads issued steps ahead, for a persistent reduction over 2048+
elements a looped one, for a looped column reduction over a short column persistent ones, for a
crossed reduction the other family's tiles, each written anew); the
candidates of all kernels are built as cubins in one parallel batch (compiler/codegen/aot.py), launched on random
data, and timed as the kernel benchmark and Inductor time: each launch on a cold L2, between its
own CUDA events, the median counts. The fastest wins if it beats the heuristic's config by
HEURISTIC_MARGIN; closer is within run-to-run noise (one layer_norm kernel, tuned in two
processes on one H200, ran 0.0366 and 0.0386 ms). Candidates within CLOSE_CALL of the fastest are
timed again, in turn, and each one's median counts. A tie keeps the earlier candidate, so decisions
are deterministic given the same timings. Results are cached by kernel source + target + the
candidate list + the timing method through a `TuningCache` (the worker backs it with Redis),
so a kernel shared by two graphs, from any team, is tuned once.

Without a GPU, or with `options.autotune` off, the heuristics decide and the manifest says so.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import statistics
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Protocol

from compiler.codegen import Generated, generate_kernel
from compiler.codegen.aot import AotError, build_cubins, fits_target, shared_bytes
from compiler.codegen.plan import build_plan, launch_grid
from compiler.codegen.heuristics import NARROW_TILE_COLUMNS, tiled_outer_config
from compiler.options import CompileOptions
from compiler.dependencies import ReadWrites
from compiler.graph import ITEMSIZES
from compiler.ir import Program
from compiler.scheduler import KernelGroup, Schedule

WARMUP = 3
COLD_LAUNCHES = 25  # timed launches per candidate, each after an L2 flush
L2_FLUSH_BYTES = 256 << 20
TIMING = "cold-l2 median, close calls retimed"  # part of the cache key: choices timed another way are not reused
# Each candidate's launch is timed as a replay of a CUDA graph holding it (see time_kernel).
TIME_AS_GRAPH = False
HEURISTIC_MARGIN = 0.02  # a candidate replaces the heuristic's config only when this much faster
# Candidates within CLOSE_CALL of the fastest are timed RETIME_ROUNDS more times, in turn, and the
# median of each one's timings counts: one timing of a 10 us kernel moves by a few percent, and Swin's
# LayerNorm + pad of 1568 x 768 took a different config in each of four runs (H100, 2026-11-27).
CLOSE_CALL = 0.03
RETIME_ROUNDS = 2
LOOPED_RBLOCK_MIN = 1024  # a persistent row of 2048+ elements is also tried as a loop
# No candidate launches fewer programs than this (or than the heuristic's config does): so few
# leave too few loads in flight on a cold L2. Timed on a warm L2 (as autotuning did before it
# timed cold) they looked fast and were chosen (H100, 2026-11-24, a column sum of 8 x 512 x 512
# bf16 split in 32: 128 programs of 128 columns on one warp 17.1 us in a cold replay, 1024
# programs 9.7); the floor stays as a trial not worth its time.
MIN_PROGRAMS = 256
# A looped column reduction over at most this many rows is also tried with its rows in registers.
SHORT_COLUMN_ROWS = 1024
# A crossed reduction (see _crossed_variants) tries these (columns, rows per step, warps) tiles, and
# persistent rows of at most CROSSED_PERSISTENT_RBLOCK elements, several to a program up to 8x that.
CROSSED_TILES = ((32, 64, 4), (64, 32, 4), (64, 64, 8), (16, 128, 4), (8, 128, 4))
CROSSED_PERSISTENT_RBLOCK = 2048
# ...and may launch as few programs as this: a crossed kernel over 1280 channels has no wide tile
# that gives 256 programs (EfficientNet's squeeze-and-excitation BatchNorm backward).
CROSSED_MIN_PROGRAMS = 128
# (rows per step, warps) tried for a mixed-order kernel (compiler/mixed_order.py); 1 row on 1 warp
# and 4 rows on 8 warps never came within 3 % of the fastest (H200, 2026-11-27, 34-35 kernels,
# bench/heuristic_fit.py).
MIXED_VARIANTS = ((1, 4), (2, 1), (2, 2), (2, 4), (4, 4), (8, 4))
# ...some also with their loop's loads issued 1 or 2 steps ahead (config "loop_stages" 2-3, Triton's
# software pipeliner; the kernel's num_stages pipelines only loads that feed a dot; which ones:
# _loop_stages_tried). H100, 2026-11-27, bench/heuristic_fit.py over every mixed kernel of the eight
# case sets (77): with these the fastest candidate was 1.057x faster than without over rows of
# 257-1024 (32 kernels, up to 1.22x: GPT-2's LayerNorm backward 26.7 -> 21.9 us), 1.008x over
# shorter rows (45; Swin's LayerNorm + pad backward over 100352 x 96, 90.2 -> 76.4 us). Looped row and column reductions
# gained 1.006x and 1.002x (38 and 573 kernels) and are not tried pipelined.
MIXED_LOOP_STAGES = (1, 2, 3)
PIPELINED_LOOPS = True  # the switch for bench/switch_ab.py
# ...on the heuristic's own step and steps of at most this many rows (_loop_stages_tried).
MIXED_PIPELINED_ROWS = 2
# A persistent reduction on one or two warps is also tried with this many of its elements per thread.
THREAD_ELEMENTS = 32


class TuningCache(Protocol):
    def get(self, key: str) -> dict | None: ...
    def put(self, key: str, value: dict) -> None: ...


class MemoryTuningCache:
    """A process-local cache (the worker uses a Redis-backed one)."""

    def __init__(self) -> None:
        self._entries: dict[str, dict] = {}

    def get(self, key: str) -> dict | None:
        return self._entries.get(key)

    def put(self, key: str, value: dict) -> None:
        self._entries.setdefault(key, value)


BufferSpec = tuple[int, str, "int | None"]  # elements of storage, dtype, bound of its values when they are indices
Timer = Callable[[Any, dict[str, BufferSpec]], float]  # (kernel with cubin, buffers to allocate) -> ms
Regenerate = Callable[[Any, dict], Any]  # (kernel, config) -> the kernel's source written for that config


def tune_and_build(generated: Generated, schedule: Schedule, target: str, options: CompileOptions,
                   cache: TuningCache | None = None, spent_s: float = 0.0) -> Generated:
    """`spent_s`: time benchmark-driven fusion already took from the graph's tuning budget."""
    if not target.startswith("cuda:"):
        return generated
    dtypes, sizes = schedule.program.buffer_dtypes(), benchmark_buffers(schedule.program, schedule.read_writes)
    remaining = options.model_copy(update={"autotune_budget_s": max(0.0, options.autotune_budget_s - spent_s)})
    groups = {step.name: step for step in schedule.steps if isinstance(step, KernelGroup)}

    def regenerate(kernel: Any, config: dict) -> Any:
        return generate_kernel(groups[kernel.name], schedule, dtypes, target, config)

    generated.autotune_note = autotune_kernels(generated.kernels, dtypes, sizes, target, remaining, cache,
                                               regenerate=regenerate)
    build_cubins([k for k in generated.kernels if k.cubin is None], dtypes, target)
    fit_to_target(generated.kernels, dtypes, target, regenerate)
    generated.plan = build_plan(schedule, {k.name: k for k in generated.kernels})  # grids follow the configs
    return generated


def benchmark_buffers(program: Program, read_writes: dict[str, ReadWrites]) -> dict[str, BufferSpec]:
    """What timing allocates per buffer. Floats are random normal; integers read as indices (as
    loaded, not computed on) are random below the smallest size they index, so gathers scatter as
    they do in training instead of all hitting one row; other integers are zeros."""
    bounds: dict[str, int] = {}
    for rw in read_writes.values():
        for buffer, size in rw.index_bounds.items():
            bounds[buffer] = min(size, bounds.get(buffer, size))
    # 0: some kernel computes on the values before indexing with them, so only zeros are known safe
    return {name: (b.layout.storage_numel(), b.dtype, bounds.get(name) or None) for name, b in program.buffers.items()}


def candidate_configs(kernel: Any, can_regenerate: bool = False) -> list[dict]:
    """The heuristic's config, then variants that the kernel's source allows, and with
    `can_regenerate` a looped variant of a persistent reduction, persistent ones of a looped column
    reduction over a short column (each needs its own source)."""
    base = kernel.config
    variants: list[dict] = []
    few_programs: list[dict] = []  # variants that may launch fewer programs than MIN_PROGRAMS and the base
    if base.get("phases") or base.get("parts"):  # phases or parts of one launch (compiler.single_programs,
        # compiler.parallel_passes): each one's config is fixed
        return [dict(base)]
    if base.get("lanes"):  # the pair's width is the source's (compiler.codegen.lane_loads): rows and warps only
        variants = [{"XBLOCK": x, "num_warps": w} for x, w in ((128, 2), (512, 8), (128, 4), (1024, 8))]
    elif base.get("tiled"):
        # narrow tiles too, as Inductor takes for small transposes (H100, 2026-11-27: ResNet's weight
        # copy of 256 x 128 x 3 x 3 to channels-last, Inductor's 16 x 64 5.6 us against our 32 x 32 5.7-6.4)
        variants = [{"XBLOCK": x, "RBLOCK": r} for x, r in ((32, 32), (32, 128), (128, 32), (16, 64), (64, 16))]
        variants += [{"num_warps": 8}]
        variants += [{"XBLOCK": x, "RBLOCK": r, "num_warps": 8} for x, r in ((64, 128), (128, 64))]
        if base["RBLOCK"] <= NARROW_TILE_COLUMNS:  # few columns: more or fewer rows, as many columns
            variants += [{"XBLOCK": x, "num_warps": w} for x in (64, 256, 512, 1024, 2048) for w in (4, 8)]
    elif base.get("mix_rows"):  # rows per step, warps and loads ahead; the rows per program are the split's
        shapes = [{}] + [{"XBLOCK": x, "num_warps": w} for x, w in MIXED_VARIANTS if base["mix_rows"] % x == 0]
        pipelined = can_regenerate and PIPELINED_LOOPS and getattr(kernel, "pipelinable", False)
        variants = [shape | {"loop_stages": ahead} for shape in shapes
                    for ahead in _loop_stages_tried(base, shape, pipelined)]
    elif base.get("outer") and not base["persistent"]:  # columns x rows per step; wide tiles want more warps
        variants = list(LOOPED_COLUMN_TILES)
        if can_regenerate and _next_power_of_2(kernel.rnumel) <= SHORT_COLUMN_ROWS:
            variants += _whole_columns(kernel.rnumel)
    elif base["persistent"] and base.get("outer") and base["RBLOCK"] > 64 and base["XBLOCK"] > 1:
        # a tile of short columns held whole (heuristics.SHORT_COLUMN_TILE_RULE): the other whole-column
        # tiles and warps, and with a new source the looped default it replaced and every looped tile
        variants = [v for v in _whole_columns(kernel.rnumel) if v["XBLOCK"] != base["XBLOCK"]] + [{"num_warps": 8}]
        if can_regenerate:
            variants += [tiled_outer_config(kernel.numel, kernel.rnumel)] + \
                [{"persistent": False} | v for v in LOOPED_COLUMN_TILES]
    elif base.get("unrolled"):  # cells of several outputs (compiler.unrolled_lanes): 1-4 cells a thread
        variants = [{"XBLOCK": x, "num_warps": w} for x, w in ((128, 2), (128, 4), (512, 4), (512, 8), (1024, 8))]
    elif kernel.rnumel == 1:
        variants = [{"XBLOCK": 2048, "num_warps": 8}, {"XBLOCK": 512, "num_warps": 4}, {"num_warps": 8}]
    elif base["persistent"] and base.get("outer") and base["RBLOCK"] > 64:  # whole columns, one a program
        # (heuristics.WHOLE_SHORT_COLUMNS_RULE): warps, and with a new source the looped tiles that
        # were the default before; none of them is held to the floor of programs the base does not reach
        variants = [{"num_warps": w} for w in (2, 8)]
        few_programs = [{"XBLOCK": 2}, {"XBLOCK": 4}]
        if can_regenerate:
            few_programs += [{"persistent": False, "XBLOCK": x, "RBLOCK": min(base["RBLOCK"] // 2, r)}
                             for x, r in ((4, 512), (4, 256), (8, 128))]
    elif base["persistent"] and base.get("outer"):  # few rows, many columns: columns per warp matter most
        x, warps = base["XBLOCK"], base["num_warps"]
        variants = [{"num_warps": w} for w in (1, 2, 4) if w != warps]
        variants += [{"XBLOCK": x * 2, "num_warps": min(16, warps * 2)}, {"XBLOCK": x * 4, "num_warps": min(16, warps * 4)},
                     {"XBLOCK": max(1, x // 2)}]
    elif base["persistent"]:  # RBLOCK must cover the row; rows per program and warps may vary
        variants = [{"num_warps": w} for w in (4, 8, 16) if w != base["num_warps"]]
        variants += [{"XBLOCK": base["XBLOCK"] * 2}, {"XBLOCK": max(1, base["XBLOCK"] // 2)}]
        if base["RBLOCK"] <= 256:  # short rows: more of them per program, on 8 warps
            variants += [{"XBLOCK": base["XBLOCK"] * 2, "num_warps": 8}, {"XBLOCK": base["XBLOCK"] * 4, "num_warps": 8}]
        # one or two warps, each thread holding up to 32 of the rows' elements: one row per program,
        # as Inductor runs LayerNorm over 768 (H100, 2026-11-24, BERT's GELU + LayerNorm of
        # 4096 x 768 bf16: 13.2 us against 14.3 for 2 rows on 4 warps), or as many rows as fill the
        # threads, as it runs LayerNorm over 192 (H100, 2026-11-27, Swin's 25088 x 192: 4 rows on
        # one warp, 12.7 us in a replay against our 8 rows on 4 warps' 12.8-13.1)
        variants += [{"XBLOCK": x, "num_warps": w} for w in (1, 2) if base["RBLOCK"] <= THREAD_ELEMENTS * 32 * w
                     for x in (1, THREAD_ELEMENTS * 32 * w // base["RBLOCK"])]
        if can_regenerate and not base.get("outer") and kernel.rnumel >= 2 * LOOPED_RBLOCK_MIN:
            rblock = min(2048, _next_power_of_2(kernel.rnumel) // 2)  # at least two steps per row
            variants.append({"persistent": False, "XBLOCK": 1, "RBLOCK": rblock, "num_warps": 8})
    else:  # a looped row: block length, warps, rows per program, pipelining
        rblock = base["RBLOCK"]
        # a longer step wants the warps to load it (H100, 2026-11-24, ResNet's BatchNorm of 128
        # channels x 25088, one row per program: 4096 on 16 warps 17.5 us, on 8 warps 20.8), and a
        # vocabulary-wide row wants all 32 (H100, 2026-11-24, GPT-2's softmax statistics of
        # 8192 x 50257 bf16 in two passes: 4096 on 32 warps 0.897 ms, 2048 on 32 warps 0.995)
        variants = [{"RBLOCK": rblock * 2}, {"RBLOCK": max(16, rblock // 2)}, {"num_warps": 16}, {"num_warps": 32},
                    {"RBLOCK": rblock * 2, "num_warps": 16}, {"RBLOCK": rblock * 2, "num_warps": 32},
                    {"XBLOCK": base["XBLOCK"] * 2}, {"num_stages": 2}]  # software-pipelined loads across loop steps
    configs = [dict(base)]
    crossed = _crossed_variants(kernel) if can_regenerate and getattr(kernel, "crossed", False) else []
    tried = [(v, MIN_PROGRAMS) for v in variants] + [(v, CROSSED_MIN_PROGRAMS) for v in crossed]
    for variant, floor in tried + [(v, 1) for v in few_programs]:
        config = _plain_loops_unmarked(base | variant)
        if config not in configs and config["XBLOCK"] <= max(1, _next_power_of_2(kernel.numel)) \
                and _programs(kernel, config) >= min(floor, _programs(kernel, base)):
            configs.append(config)
    return configs


def needs_own_source(config: dict, written_for: dict) -> bool:
    """Whether a candidate config needs its kernel written anew: persistent and looped kernels differ,
    and so do row and column kernels (a row kernel's row windows) and pipelined loops."""
    return config["persistent"] != written_for["persistent"] or \
        bool(config.get("outer")) != bool(written_for.get("outer")) or \
        config.get("loop_stages", 1) != written_for.get("loop_stages", 1)


def _loop_stages_tried(base: dict, shape: dict, pipelined: bool) -> tuple[int, ...]:
    """A mixed-order step shape's loop stages to try: all of MIXED_LOOP_STAGES on the heuristic's
    step, a plain loop and one step ahead on steps of at most MIXED_PIPELINED_ROWS rows (too few
    bytes in flight to hide the next step's loads), a plain loop on longer steps; without a new
    source, the base's own. Of 77 mixed kernels' fastest candidates and those within 3 % of them
    (H100, 2026-11-27, bench/heuristic_fit.py), none was a pipelined step of 4 or more rows but the
    heuristic's own, and none two steps ahead but the heuristic's."""
    if not pipelined:
        return (base.get("loop_stages", 1),)
    if not shape:
        return MIXED_LOOP_STAGES
    return MIXED_LOOP_STAGES[:2] if shape["XBLOCK"] <= MIXED_PIPELINED_ROWS else (1,)


def _plain_loops_unmarked(config: dict) -> dict:
    """A config whose loop issues no load ahead (loop_stages 1) carries no loop_stages, as the heuristics write it."""
    return {k: v for k, v in config.items() if k != "loop_stages"} if config.get("loop_stages") == 1 else config


def _crossed_variants(kernel: Any) -> list[dict]:
    """A crossed reduction (codegen.is_crossed: it reads or writes one tensor along its rows and
    another across them, as a BatchNorm backward reading channels-last and writing NCHW does) also
    tries the other family's configs, each written anew: a row kernel tiles of columns x rows per
    step, as a column kernel does, and rows held several to a program, so that a load across them
    spans a sector; a column kernel its rows whole in registers, one or a few to a program."""
    base, rblock = kernel.config, _next_power_of_2(kernel.rnumel)
    if base.get("outer"):
        if rblock > CROSSED_PERSISTENT_RBLOCK:
            return []
        return [{"persistent": True, "outer": False, "XBLOCK": x, "RBLOCK": rblock, "num_warps": w}
                for x, w in ((1, 4), (max(1, 2048 // rblock), 4), (max(1, 4096 // rblock), 8))]
    tiles = [{"persistent": False, "outer": True, "XBLOCK": x, "RBLOCK": r, "num_warps": w} for x, r, w in CROSSED_TILES]
    if base["persistent"]:
        tiles += [{"XBLOCK": x, "num_warps": w} for x, w in ((4, 8), (8, 8), (8, 16), (16, 16))
                  if x * rblock <= CROSSED_PERSISTENT_RBLOCK * 8]
    return tiles


# The looped tiles (columns x rows a step) tried for a column reduction; wide tiles want more warps.
# (H200, 2026-11-27, bench/heuristic_fit.py over 322 cases: a warp across 128-256 columns, a step's
# rows in its threads, on 1-2 warps, never came within 3 % of the fastest candidate in 74 and 39
# kernels, and is no longer tried.)
LOOPED_COLUMN_TILES = (
    {"XBLOCK": 64, "RBLOCK": 32}, {"XBLOCK": 64, "RBLOCK": 8}, {"XBLOCK": 16, "RBLOCK": 128},
    {"XBLOCK": 64, "RBLOCK": 64, "num_warps": 8}, {"XBLOCK": 128, "RBLOCK": 16, "num_warps": 8},
    # few columns (a mixed-order kernel's final pass): narrow blocks, more programs
    {"XBLOCK": 4, "RBLOCK": 256}, {"XBLOCK": 8, "RBLOCK": 128}, {"XBLOCK": 8, "RBLOCK": 64, "num_warps": 2},
    # short steps, twice the programs, as Inductor tiles them (H100, 2026-11-27: EfficientNet's
    # channels-last SE sum of 21504 x 196 bf16, Inductor's 16 x 32 15.1 us, our best 32 x 64 16.9)
    {"XBLOCK": 16, "RBLOCK": 32}, {"XBLOCK": 32, "RBLOCK": 32},
)


def _whole_columns(rnumel: int) -> list[dict]:
    """Persistent variants of a looped column reduction over a short column (the final pass of a
    split, a few hundred partials per output; a channels-last BatchNorm's chunks of a few hundred
    rows): every row in registers, so the loads are issued at
    once, and a second reduction over the same rows (welford's M2 after its mean) reads registers
    instead of looping over memory again."""
    rblock = _next_power_of_2(rnumel)
    # one column per program only where the column is long: over up to 128 rows it never came within
    # 3 % of the fastest (0 of 66 kernels); over 1024 it was the pick in 16 of 25 (H200, 2026-11-27,
    # bench/heuristic_fit.py)
    columns = sorted({max(1, 2048 // rblock), max(1, 4096 // rblock)} | ({1} if rblock > 128 else set()))
    return [{"persistent": True, "XBLOCK": x, "RBLOCK": rblock, "num_warps": 4} for x in columns]


def _programs(kernel: Any, config: dict) -> int:
    return math.prod(launch_grid(kernel.numel, kernel.rnumel, config))


def _next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def tuning_key(kernel: Any, target: str, candidates: list[dict]) -> str:
    payload = json.dumps({"source": kernel.source, "target": target, "candidates": candidates,
                          "timing": [TIMING, TIME_AS_GRAPH], "numel": kernel.numel, "rnumel": kernel.rnumel},
                         sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


@dataclass
class _Tuning:
    """One kernel's candidates, its cache entry (if any) and one trial kernel per candidate."""

    kernel: Any
    candidates: list[dict]
    key: str
    known: dict | None
    trials: list[Any]

    def to_build(self) -> list[Any]:
        return [self.trials[self.known["chosen"]]] if self.known is not None else self.trials


def fit_to_target(kernels: list[Any], dtypes: dict[str, str], target: str, regenerate: Regenerate | None) -> None:
    """Every built kernel whose cubin would not load on the target (more shared memory than a block
    may use) takes the first of its candidate configs that does, in place; AotError when none does."""
    for kernel in [k for k in kernels if not fits_target(k, target)]:
        trials = _candidate_trials(kernel, candidate_configs(kernel, can_regenerate=regenerate is not None),
                                   regenerate)[1:]  # [0] is the kernel's own config
        build_cubins(trials, dtypes, target)
        fitting = next((trial for trial in trials if fits_target(trial, target)), None)
        if fitting is None:
            raise _no_config_loads(kernel, target, f" ({kernel.config} needs {shared_bytes(kernel)} bytes)")
        _adopt(kernel, fitting)


def _no_config_loads(kernel: Any, target: str, detail: str = "") -> AotError:
    return AotError(f"kernel {kernel.name}: no launch config fits the shared memory of a block on {target}{detail}")


def autotune_kernels(kernels: list[Any], dtypes: dict[str, str], sizes: dict[str, BufferSpec], target: str,
                     options: CompileOptions, cache: TuningCache | None, timer: Timer | None = None,
                     regenerate: Regenerate | None = None) -> str:
    """Picks each kernel's config (and cubin) in place; returns the manifest's autotune note.

    Every candidate of every kernel is built in one parallel batch, then timed kernel by kernel,
    the kernels that move the most bytes first, until the budget is spent; a kernel the budget did
    not reach keeps its heuristic config (or its cached choice, which needs no timing)."""
    if not options.autotune:
        return "autotuning off (options.autotune=false): heuristic launch configs"
    timer = timer or gpu_timer(target)
    if timer is None:
        return "no GPU on this worker: heuristic launch configs"
    cache = cache or MemoryTuningCache()
    started = time.perf_counter()
    tunings = [_plan(kernel, target, cache, regenerate) for kernel in kernels]
    build_cubins([trial for t in tunings for trial in t.to_build()], dtypes, target)
    untimed = 0
    # the biggest kernels first: where the budget runs out (a large backward graph), the kernels left
    # on heuristic configs are the ones that move the fewest bytes
    for tuning in sorted(tunings, key=lambda t: -_moved_bytes(t.kernel, sizes)):
        if tuning.known is None and time.perf_counter() - started > options.autotune_budget_s:
            _adopt(tuning.kernel, tuning.trials[0])  # fit_to_target replaces it if it does not load
            untimed += 1
            continue
        _decide(tuning, sizes, cache, timer, target)
    took = time.perf_counter() - started
    if untimed:
        return (f"time budget of {options.autotune_budget_s} s spent: {len(kernels) - untimed} of {len(kernels)} "
                f"kernels tuned in {took:.1f} s, the rest use heuristics")
    return f"autotuned {len(kernels)} kernels on the GPU in {took:.1f} s"


def _moved_bytes(kernel: Any, sizes: dict[str, BufferSpec]) -> int:
    """Bytes of the buffers the kernel reads or writes, whole."""
    return sum(sizes[name][0] * ITEMSIZES[sizes[name][1]] for name in kernel.arguments if name in sizes)


def _plan(kernel: Any, target: str, cache: TuningCache, regenerate: Regenerate | None) -> _Tuning:
    candidates = candidate_configs(kernel, can_regenerate=regenerate is not None)
    key = tuning_key(kernel, target, candidates)
    return _Tuning(kernel, candidates, key, cache.get(key), _candidate_trials(kernel, candidates, regenerate))


def _candidate_trials(kernel: Any, candidates: list[dict], regenerate: Regenerate | None) -> list[Any]:
    """One trial kernel per candidate config, written anew where the config needs its own source."""
    return [regenerate(kernel, config) if needs_own_source(config, kernel.config)
            else replace(kernel, config=config) for config in candidates]


def _decide(tuning: _Tuning, sizes: dict[str, BufferSpec], cache: TuningCache, timer: Timer, target: str) -> None:
    """Times the candidates whose cubins load on the target (the others' timings are None)."""
    if tuning.known is not None:
        chosen, timings = tuning.known["chosen"], tuning.known["ms"]
    else:
        timings = [timer(trial, sizes) if fits_target(trial, target) else None for trial in tuning.trials]
        loadable = [j for j, ms in enumerate(timings) if ms is not None]
        if not loadable:
            raise _no_config_loads(tuning.kernel, target)
        fastest = min(timings[j] for j in loadable)
        contenders = [j for j in loadable if timings[j] <= fastest * (1 + CLOSE_CALL)]
        if len(contenders) > 1:
            steadier = retimed([(tuning.trials[j], sizes) for j in contenders], [timings[j] for j in contenders], timer)
            for j, ms in zip(contenders, steadier):
                timings[j] = ms
        chosen = min(loadable, key=lambda j: (timings[j], j))  # a tie keeps the earlier candidate
        if timings[0] is not None and timings[chosen] > timings[0] * (1 - HEURISTIC_MARGIN):
            chosen = 0  # not clearly faster than the heuristic's config: within the timing noise
        cache.put(tuning.key, {"chosen": chosen, "ms": timings})
    _adopt(tuning.kernel, tuning.trials[chosen])
    tuning.kernel.tuning = {"candidates": tuning.candidates, "ms": timings, "chosen": chosen,
                            "cached": tuning.known is not None}


def is_close_call(first_ms: float, second_ms: float) -> bool:
    """Whether two timings are too close for one timing of each to decide between them."""
    return abs(first_ms - second_ms) <= CLOSE_CALL * min(first_ms, second_ms)


def retimed(trials: list[tuple[Any, dict[str, BufferSpec]]], first_ms: list[float], timer: Timer) -> list[float]:
    """Each (trial, the buffers it is timed on)'s median over its first timing and RETIME_ROUNDS
    more, the trials timed in turn so that a drift of the GPU's clocks reaches all of them alike."""
    samples = [[ms] for ms in first_ms]
    for _ in range(RETIME_ROUNDS):
        for (trial, sizes), timings in zip(trials, samples):
            timings.append(timer(trial, sizes))
    return [statistics.median(timings) for timings in samples]


def _adopt(kernel: Any, trial: Any) -> None:
    kernel.config, kernel.cubin, kernel.cubin_metadata = trial.config, trial.cubin, trial.cubin_metadata
    kernel.source, kernel.arguments = trial.source, trial.arguments  # a looped trial has its own


def gpu_timer(target: str) -> Timer | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    from client.cubin import cuda_target

    if target != cuda_target():
        return None  # tuning on another arch would measure the wrong chip
    return time_kernel


def time_kernel(kernel: Any, sizes: dict[str, BufferSpec], as_graph: bool | None = None) -> float:
    """Median ms of one launch of the kernel's cubin on a cold L2, as the kernel benchmark and
    Triton's do_bench time: before each of COLD_LAUNCHES launches, a 256 MiB buffer is zeroed
    (more than any Hopper L2), and each launch is timed between its own two CUDA events. With
    `as_graph` (default TIME_AS_GRAPH) the launch is captured once into a CUDA graph and each timing
    is a replay of it, as a CUDA-graph step runs the kernel."""
    import torch

    from client.cubin import CubinKernel

    entry = {"name": kernel.name, "cubin_metadata": kernel.cubin_metadata}
    grid = tuple(launch_grid(kernel.numel, kernel.rnumel, kernel.config))
    launch = CubinKernel(entry, kernel.cubin).launcher(grid, use_hooks=False)
    tensors = [_random_buffer(*sizes[name]) for name in kernel.arguments]
    pointers = [t.data_ptr() for t in tensors]  # `tensors` keeps them alive
    for _ in range(WARMUP):
        launch(torch.cuda.current_stream().cuda_stream, *pointers)
    run = _captured(launch, pointers) if (TIME_AS_GRAPH if as_graph is None else as_graph) else (
        lambda: launch(torch.cuda.current_stream().cuda_stream, *pointers))
    flush = _l2_flush_buffer()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(COLD_LAUNCHES)]
    for start, end in events:
        flush.zero_()
        start.record()
        run()
        end.record()
    torch.cuda.synchronize()
    times = sorted(start.elapsed_time(end) for start, end in events)
    return times[len(times) // 2]


def _captured(launch: Callable, pointers: list[int]) -> Callable[[], None]:
    """A replay of one launch captured into a CUDA graph."""
    import torch

    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch(torch.cuda.current_stream().cuda_stream, *pointers)
    return graph.replay


@functools.lru_cache(maxsize=1)
def _l2_flush_buffer() -> Any:
    """One buffer per process, made at the first timing."""
    import torch

    return torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")


def _random_buffer(numel: int, dtype: str, index_bound: int | None = None) -> Any:
    import torch

    torch_dtype = getattr(torch, dtype)
    shape = (max(numel, 1),)
    if torch_dtype.is_floating_point:
        return torch.randn(shape, device="cuda", dtype=torch.float32).to(torch_dtype)
    if index_bound and torch_dtype != torch.bool:
        return torch.randint(0, index_bound, shape, device="cuda", dtype=torch_dtype)
    return torch.zeros(shape, device="cuda", dtype=torch_dtype)  # zeros are valid wherever they end up
