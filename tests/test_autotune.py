"""Autotuning decisions (compiler/autotune.py). Timing needs a GPU; here a deterministic fake
timer stands in for the GPU so that the choice, the tie rule, the cache and the budget can be
checked on CPU. tests/gpu/test_gpu_autotune.py times real candidates."""

from __future__ import annotations

import types

import pytest

import compiler
from compiler.autotune import MemoryTuningCache, autotune_kernels, benchmark_buffers, candidate_configs
from compiler.codegen import generate_kernel
from compiler.codegen.aot import MAX_SHARED_BYTES, AotError, shared_bytes
from compiler.lowering import lower
from compiler.options import CompileOptions
from compiler.scheduler import KernelGroup, schedule
from tests.corpus import load_graph

TARGET = "cuda:sm_90"
HEURISTIC = {"autotune": False, "benchmark_fusion": False}


def softmax_kernel():
    program = lower(load_graph("softmax_fp32"))
    scheduled = schedule(program, CompileOptions())
    dtypes, sizes = program.buffer_dtypes(), benchmark_buffers(program, scheduled.read_writes)
    group = next(s for s in scheduled.steps if isinstance(s, KernelGroup))
    return generate_kernel(group, scheduled, dtypes, TARGET), dtypes, sizes


def test_the_fastest_candidate_wins_and_is_built():
    kernel, dtypes, sizes = softmax_kernel()
    candidates = candidate_configs(kernel)
    assert len(candidates) >= 3 and candidates[0] == kernel.config
    ranking = {i: 5.0 - i for i in range(len(candidates))}  # the last candidate is fastest
    timer = lambda trial, _: ranking[candidates.index(trial.config)]  # noqa: E731
    note = autotune_kernels([kernel], dtypes, sizes, TARGET, CompileOptions(), MemoryTuningCache(), timer)
    assert "autotuned 1 kernels" in note
    assert kernel.config == candidates[-1]
    assert kernel.tuning["chosen"] == len(candidates) - 1 and kernel.tuning["cached"] is False
    assert kernel.cubin_metadata["metadata"]["num_warps"] == candidates[-1]["num_warps"]


def test_ties_keep_the_earlier_candidate_and_the_cache_answers_the_second_time():
    kernel, dtypes, sizes = softmax_kernel()
    cache = MemoryTuningCache()
    calls = []

    def flat_timer(trial, _):
        calls.append(trial.config)
        return 1.0

    autotune_kernels([kernel], dtypes, sizes, TARGET, CompileOptions(), cache, flat_timer)
    first_choice = kernel.config
    assert first_choice == candidate_configs(kernel)[0]
    again, _, _ = softmax_kernel()
    timed = len(calls)
    autotune_kernels([again], dtypes, sizes, TARGET, CompileOptions(), cache, flat_timer)
    assert len(calls) == timed  # the cache answered: nothing was timed
    assert again.config == first_choice and again.tuning["cached"] is True and again.cubin


def _first_kernel(fn, *inputs):
    from compiler.codegen import generate

    return generate(schedule(lower(_trace(fn, *inputs)), CompileOptions()), TARGET).kernels[0]


def test_no_candidate_launches_fewer_programs_than_a_wave_or_the_heuristic():
    import torch

    from compiler.autotune import MIN_PROGRAMS, _programs

    # a column sum split into partial sums: 32 x 512 outputs, whose variants of 128 columns per
    # program would launch only 128 programs
    kernel = _first_kernel(lambda a: a.sum((0, 1)), torch.randn(8, 512, 512, dtype=torch.bfloat16))
    assert kernel.config.get("outer") and _programs(kernel, kernel.config) >= MIN_PROGRAMS
    candidates = candidate_configs(kernel)
    assert len(candidates) >= 3
    assert all(_programs(kernel, c) >= MIN_PROGRAMS for c in candidates)
    assert {"XBLOCK": 128, "RBLOCK": 8, "num_warps": 1} not in [
        {k: c[k] for k in ("XBLOCK", "RBLOCK", "num_warps")} for c in candidates]
    # a kernel with few rows keeps its own count as the floor: nothing launches fewer
    few = _first_kernel(lambda a: torch.softmax(a, -1), torch.randn(6, 700))
    assert all(_programs(few, c) >= _programs(few, few.config) for c in candidate_configs(few))


def test_a_looped_column_reduction_is_also_tried_in_short_steps_of_narrow_tiles():
    import torch

    # EfficientNet's squeeze-and-excitation sum over 14 x 14, channels-last: 21504 columns x 196 rows
    kernel = _first_kernel(lambda a, b: (a * b).sum((2, 3)),
                           torch.randn(32, 672, 14, 14).to(memory_format=torch.channels_last),
                           torch.randn(32, 672, 14, 14).to(memory_format=torch.channels_last))
    assert kernel.config.get("outer") and not kernel.config["persistent"]
    tiles = {(c["XBLOCK"], c["RBLOCK"]) for c in candidate_configs(kernel)}
    assert {(16, 32), (32, 32)} <= tiles


def test_a_narrow_transpose_is_tried_in_tiles_of_as_many_columns_and_64_to_2048_rows():
    import torch

    # NesT's heads moved last: a 2D tile of 3 columns (4 with the mask), 1024 rows by the heuristic
    kernel = _first_kernel(lambda a: a.to(torch.bfloat16).permute(0, 2, 3, 4, 1).contiguous(),
                           torch.randn(8, 3, 32, 65, 32))  # 532480 rows: 260 programs of 2048
    assert kernel.config.get("tiled") and (kernel.config["XBLOCK"], kernel.config["RBLOCK"]) == (1024, 4)
    tiles = {(c["XBLOCK"], c["RBLOCK"], c["num_warps"]) for c in candidate_configs(kernel)}
    assert {(x, 4, w) for x in (64, 256, 512, 1024, 2048) for w in (4, 8)} <= tiles


@pytest.mark.parametrize("width, warps", [(768, {1, 2}), (2048, {2}), (8192, set())])
def test_a_persistent_row_is_tried_one_per_program_on_few_warps_while_it_fits_in_registers(width, warps):
    import torch

    kernel = _first_kernel(lambda a: torch.softmax(a, -1), torch.randn(4096, width))
    assert kernel.config["persistent"]
    one_row = {c["num_warps"] for c in candidate_configs(kernel) if c["XBLOCK"] == 1 and c["num_warps"] < 4}
    assert one_row == warps


def test_a_looped_row_is_tried_with_a_step_twice_as_long_on_16_warps():
    import torch

    kernel = _first_kernel(lambda a: torch.softmax(a, -1), torch.randn(256, 20000))
    assert not kernel.config["persistent"]
    rblock = kernel.config["RBLOCK"]
    assert kernel.config | {"RBLOCK": 2 * rblock, "num_warps": 16} in candidate_configs(kernel)


def test_a_looped_row_is_tried_on_32_warps():
    """Fewer programs per SM keep a long row in L2 for its second pass (benchmark_fusion.LOOPED_TRIALS)."""
    import torch

    kernel = _first_kernel(lambda a: torch.log_softmax(a.float(), -1), torch.randn(64, 20000).to(torch.bfloat16))
    assert not kernel.config["persistent"]
    assert kernel.config | {"num_warps": 32} in candidate_configs(kernel)


@pytest.mark.parametrize("options, expected", [
    ({"autotune": False}, "autotuning off"),
    ({"autotune_budget_s": 0}, "time budget"),
])
def test_options_turn_tuning_off_or_bound_it(options, expected):
    kernel, dtypes, sizes = softmax_kernel()
    heuristic = dict(kernel.config)
    note = autotune_kernels([kernel], dtypes, sizes, TARGET, CompileOptions(**options), None, lambda t, s: 1.0)
    assert expected in note and kernel.config == heuristic and kernel.tuning is None


def test_where_the_budget_runs_out_the_biggest_kernels_were_tuned_first(monkeypatch):
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from compiler import autotune
    from compiler.fx_import import from_fx

    inputs = [torch.randn(4, 300), torch.randn(64, 300)]  # two kernels, the second 16 times the bytes
    graph = from_fx(make_fx(lambda a, b: (a.sum(-1), b.sum(-1)))(*inputs), inputs)
    program = lower(graph)
    scheduled = schedule(program, CompileOptions())
    dtypes, sizes = program.buffer_dtypes(), benchmark_buffers(program, scheduled.read_writes)
    small, big = [generate_kernel(g, scheduled, dtypes, TARGET) for g in scheduled.steps if isinstance(g, KernelGroup)]
    clock = [0.0]
    monkeypatch.setattr(autotune, "time", type("Clock", (), {"perf_counter": staticmethod(lambda: clock[0])}))

    def timer(trial, _):
        clock[0] += 10.0  # the first kernel's timings spend the whole budget
        return 1.0

    note = autotune_kernels([small, big], dtypes, sizes, TARGET, CompileOptions(autotune_budget_s=5.0), None, timer)
    assert "1 of 2 kernels tuned" in note
    assert big.tuning is not None and small.tuning is None


def test_without_a_gpu_the_heuristics_decide_and_the_manifest_says_so():
    artifact = compiler.compile(load_graph("softmax_fp32"), TARGET)
    assert "no GPU" in artifact.manifest["autotune"]
    assert all("autotune" not in k for k in artifact.manifest["kernels"])


# --- benchmark-driven fusion (compiler/benchmark_fusion.py) ---------------------------------------

def _bench_schedule(fn, inputs, fused_ms, parts_ms, options=CompileOptions(), spent_s=0.0):
    """Schedules fn with a FusionBenchmarker whose 'GPU' answers fused_ms for a fused kernel and
    parts_ms for each part (a kernel with fewer nodes), so the decision can be checked on CPU;
    `spent_s`: seconds the benchmarker has already spent."""
    import torch  # noqa: F401
    from torch.fx.experimental.proxy_tensor import make_fx

    from compiler.benchmark_fusion import FusionBenchmarker
    from compiler.fx_import import from_fx

    graph = from_fx(make_fx(fn)(*inputs), inputs)
    program = lower(graph)
    most_nodes = [0]

    def timer(kernel, sizes):
        assert set(kernel.arguments) <= set(sizes), "timed without a size for each of its buffers"
        most_nodes[0] = max(most_nodes[0], len(kernel.nodes))
        return fused_ms if len(kernel.nodes) == most_nodes[0] and len(kernel.nodes) > 1 else parts_ms

    judge = FusionBenchmarker(TARGET, options, timer)
    judge.spent_s = spent_s
    return schedule(program, options, judge)


def test_benchmarking_overturns_a_horizontal_fusion_the_score_would_take():
    import torch

    def fn(a):
        return a * 2, a.sum(-1)  # siblings sharing only their input: the score would fuse them

    heuristic = schedule(lower(_trace(fn, torch.randn(8, 300))), CompileOptions())
    assert len([s for s in heuristic.steps if isinstance(s, KernelGroup)]) == 1
    scheduled = _bench_schedule(fn, [torch.randn(8, 300)], fused_ms=3.0, parts_ms=1.0)
    decision = scheduled.fusion_log["benchmarked"][0]
    assert decision["fused"] is False and decision["fused_ms"] == 3.0 and decision["unfused_ms"] == [1.0, 1.0]
    assert "horizontal" in decision["why_benchmarked"]
    assert len([s for s in scheduled.steps if isinstance(s, KernelGroup)]) == 2
    assert any("benchmark: fused" in r["reason"] for r in scheduled.fusion_log["refused"])


def test_a_reduction_over_a_pooling_backward_is_timed_and_stays_apart_when_slower():
    import torch

    def fn(grad, x):  # PoolFormer's shape of work: an average-pool backward, then sums over its result
        pooled = torch.ops.aten.avg_pool2d_backward(grad, x, [3, 3], [1, 1], [1, 1], False, False, None)
        return (pooled * x).sum([2, 3])

    inputs = [torch.randn(2, 4, 9, 9), torch.randn(2, 4, 9, 9)]
    scheduled = _bench_schedule(fn, inputs, fused_ms=3.0, parts_ms=1.0)
    decision = next(d for d in scheduled.fusion_log["benchmarked"] if d["why_benchmarked"].startswith("reduction fused"))
    assert "window" in decision["why_benchmarked"] and decision["fused"] is False
    assert len([s for s in scheduled.steps if isinstance(s, KernelGroup)]) == 2
    plain = _bench_schedule(lambda g, x: (g * x).sum([2, 3]), inputs, fused_ms=3.0, parts_ms=1.0)
    assert not any(d["why_benchmarked"].startswith("reduction fused") for d in plain.fusion_log["benchmarked"])


def test_a_long_column_sum_over_stored_pointwise_results_is_timed_and_split_when_slower(monkeypatch):
    import torch

    import compiler.split_reductions as split_reductions

    monkeypatch.setattr(split_reductions, "FULL_PROGRAMS", 1)  # 40 columns reduced whole, as a vocabulary's are

    def fn(logits, grad):  # a bias gradient beside the logits' gradient, which is stored (ALBERT's decoder)
        dlogits = (logits.float().exp() * grad.float()).to(torch.bfloat16)
        return dlogits, dlogits.sum(0)

    inputs = [torch.randn(2048, 40, dtype=torch.bfloat16), torch.randn(2048, 40, dtype=torch.bfloat16)]
    question = "column reduction fused with pointwise work whose results are stored"
    scheduled = _bench_schedule(fn, inputs, fused_ms=3.0, parts_ms=1.0)
    decision = next(d for d in scheduled.fusion_log["benchmarked"] if d["why_benchmarked"] == question)
    assert decision["fused"] is False
    kernels = [s for s in scheduled.steps if isinstance(s, KernelGroup)]
    assert len(kernels) == 2 and not kernels[0].is_reduction and kernels[1].is_reduction
    kept = _bench_schedule(fn, inputs, fused_ms=1.0, parts_ms=1.0)
    assert len([s for s in kept.steps if isinstance(s, KernelGroup)]) == 1
    # not asked: results that are not stored, short columns, or a row (not column) sum
    for other, shape in ((lambda a, g: (a.float().exp() * g.float()).sum(0), (2048, 40)),
                         (fn, (512, 40)), (lambda a, g: (lambda d: (d, d.sum(1)))(a * g), (40, 2048))):
        args = [torch.randn(*shape, dtype=torch.bfloat16) for _ in range(2)]
        log = _bench_schedule(other, args, fused_ms=3.0, parts_ms=1.0).fusion_log["benchmarked"]
        assert not any(d["why_benchmarked"] == question for d in log), shape


def test_a_column_sum_in_chunks_is_timed_only_where_its_stored_work_reads_across_the_tiles():
    import torch

    def stacked(q, k, v):  # Hiera: q, a transposed k and v stacked into one layout, their bias's column sum
        pieces = torch.stack([q, k.transpose(2, 3), v], 3).permute(0, 2, 1, 3, 4)
        out = pieces.reshape(-1, 3 * q.shape[-1]).to(torch.bfloat16)
        return out, out.sum(0)

    def scaled(q, k, v):  # a bias gradient beside its elementwise producer, in the same layout
        out = (q * v * 2).permute(0, 2, 1, 3).reshape(-1, q.shape[-1]).to(torch.bfloat16)
        return out, out.sum(0)

    question = "column reduction fused with pointwise work whose results are stored"
    inputs = [torch.randn(16, 8, 16, 32), torch.randn(16, 8, 32, 16), torch.randn(16, 8, 16, 32)]
    scheduled = _bench_schedule(stacked, inputs, fused_ms=3.0, parts_ms=1.0)  # 2048 rows, in chunks
    assert any(d["why_benchmarked"] == question and not d["fused"] for d in scheduled.fusion_log["benchmarked"])
    kernels = [s for s in scheduled.steps if isinstance(s, KernelGroup)]
    assert not kernels[0].is_reduction and kernels[1].is_reduction  # the stack stored apart, then the sum
    log = _bench_schedule(scaled, inputs, fused_ms=3.0, parts_ms=1.0).fusion_log["benchmarked"]
    assert not any(d["why_benchmarked"] == question for d in log)


def test_benchmarking_keeps_a_fusion_that_is_faster_and_records_both_timings():
    import torch

    scheduled = _bench_schedule(lambda a: (a * 2, a.sum(-1)), [torch.randn(8, 300)], fused_ms=1.0, parts_ms=1.0)
    decision = scheduled.fusion_log["benchmarked"][0]
    assert decision["fused"] is True and decision["unfused_ms"] == [1.0, 1.0]
    assert len([s for s in scheduled.steps if isinstance(s, KernelGroup)]) == 1


def test_a_fusion_that_saves_a_launch_may_cost_the_gpu_up_to_one_launch():
    import torch

    from compiler.benchmark_fusion import LAUNCH_COST_MS

    def kernels(fused_ms):
        scheduled = _bench_schedule(lambda a: (a * 2, a.sum(-1)), [torch.randn(8, 300)], fused_ms=fused_ms, parts_ms=0.01)
        return len([s for s in scheduled.steps if isinstance(s, KernelGroup)]), scheduled.fusion_log["benchmarked"][0]

    count, decision = kernels(0.02 + 0.9 * LAUNCH_COST_MS)  # slower than both parts, by less than a launch
    assert count == 1 and decision["fused"] is True and "launch counts" in decision["reason"]
    count, decision = kernels(0.02 + 1.1 * LAUNCH_COST_MS)
    assert count == 2 and decision["fused"] is False


def test_benchmarking_stops_at_half_the_budget_and_leaves_the_rest_to_autotuning():
    import torch

    from compiler.benchmark_fusion import FUSION_SHARE

    options = CompileOptions(autotune_budget_s=4.0)
    share = options.autotune_budget_s * FUSION_SHARE

    def scheduled(spent_s):  # fused 9 ms against parts of 1 ms: timed, the fusion is refused
        return _bench_schedule(lambda a: (a * 2, a.sum(-1)), [torch.randn(8, 300)], fused_ms=9.0, parts_ms=1.0,
                               options=options, spent_s=spent_s)

    past = scheduled(share + 0.01)  # past its share: the score decides
    assert past.fusion_log["benchmarked"] == []
    assert len([s for s in past.steps if isinstance(s, KernelGroup)]) == 1
    assert scheduled(share - 0.5).fusion_log["benchmarked"]


def test_producer_consumer_fusions_are_left_to_the_score():
    import torch

    scheduled = _bench_schedule(lambda a: torch.relu(a * 2) + 1, [torch.randn(8, 300)], fused_ms=9.0, parts_ms=1.0)
    assert scheduled.fusion_log["benchmarked"] == []
    assert len([s for s in scheduled.steps if isinstance(s, KernelGroup)]) == 1


def _trace(fn, *inputs):
    from torch.fx.experimental.proxy_tensor import make_fx

    from compiler.fx_import import from_fx

    return from_fx(make_fx(fn)(*inputs), list(inputs))


def test_benchmarked_fusions_may_involve_buffers_that_split_reductions_added():
    import torch

    # a sum over 4 rows of 65536 is split into partial sums (new buffers, added while scheduling)
    scheduled = _bench_schedule(lambda a: (a.sum(-1), a * 2), [torch.randn(4, 65536)], fused_ms=1.0, parts_ms=1.0)
    split_buffers = [name for name in scheduled.program.buffers if name.endswith("_split")]
    assert split_buffers
    decisions = scheduled.fusion_log["benchmarked"]
    assert decisions and all(d["fused_ms"] == 1.0 for d in decisions)


def _recompute_schedule(recomputing_ms: float, storing_ms: float):
    """Schedules exp(x * 2)[idx] with a fake GPU: kernels that read the stored exp(x * 2) back cost
    storing_ms, every other kernel (the gather recomputing exp at each index, the producer) recomputing_ms
    or storing_ms as its schedule says."""
    import torch

    from compiler.benchmark_fusion import FusionBenchmarker

    x, idx = torch.randn(50, 16), torch.randint(0, 50, (200,))
    program = lower(_trace(lambda a, i: torch.exp(a * 2)[i], x, idx))
    stored_buffer = "buf1"  # exp(x * 2): read only through the gather

    def timer(kernel, sizes):
        assert set(kernel.arguments) <= set(sizes), "timed without a size for each of its buffers"
        in_stored_schedule = f"ptr_{stored_buffer}" in kernel.source
        return storing_ms if in_stored_schedule else recomputing_ms

    return schedule(program, CompileOptions(), FusionBenchmarker(TARGET, CompileOptions(), timer)), stored_buffer


def test_recomputing_a_gathered_result_is_timed_against_storing_it_and_the_faster_kept():
    recomputed, buffer = _recompute_schedule(recomputing_ms=1.0, storing_ms=1.0)
    decision = recomputed.fusion_log["benchmarked"][-1]
    assert decision["why_benchmarked"].startswith("recompute") and decision["fused"] is True
    assert decision["fused_ms"] == 1.0 and decision["unfused_ms"] == [1.0, 1.0]  # one kernel against two
    assert len([s for s in recomputed.steps if isinstance(s, KernelGroup)]) == 1

    stored, _ = _recompute_schedule(recomputing_ms=5.0, storing_ms=1.0)
    decision = stored.fusion_log["benchmarked"][-1]
    assert decision["fused"] is False and decision["fused_ms"] == 5.0 and sum(decision["unfused_ms"]) == 2.0
    groups = [s for s in stored.steps if isinstance(s, KernelGroup)]
    assert len(groups) == 2 and buffer in {st.buffer.name for g in groups for n in g.nodes for st in n.stores}


def test_recompute_choice_matches_eager_either_way():
    import torch

    from client.runtime import load
    from compiler.artifact import build_artifact
    from compiler.codegen import generate
    from compiler.fx_import import run_eager
    from tests.compare import assert_close_outputs

    x, idx = torch.randn(50, 16), torch.randint(0, 50, (200,))
    graph = _trace(lambda a, i: torch.exp(a * 2)[i], x, idx)
    for recomputing_ms in (1.0, 5.0):
        scheduled, _ = _recompute_schedule(recomputing_ms=recomputing_ms, storing_ms=1.0)
        artifact = build_artifact(graph, "cpu", CompileOptions(), generate(scheduled, "cpu"))
        assert_close_outputs(load(artifact)(x, idx), run_eager(graph, [x, idx]))


def test_explain_shows_decisions_made_by_timing():
    import torch

    from compiler.artifact import build_artifact
    from compiler.codegen import generate
    from compiler.explain import describe

    graph = _trace(lambda a, i: torch.exp(a * 2)[i], torch.randn(50, 16), torch.randint(0, 50, (200,)))
    scheduled, _ = _recompute_schedule(recomputing_ms=5.0, storing_ms=1.0)
    text = describe(build_artifact(graph, "cpu", CompileOptions(), generate(scheduled, "cpu")))
    assert "uncertain fusions: uncertain fusions timed on the GPU" in text
    assert "recomputing takes 5.0000 ms in 1 kernels, storing 2.0000 ms in 2 (one launch counts" in text


def test_a_persistent_reduction_is_also_tried_as_a_loop_with_its_own_source(monkeypatch):
    import torch

    from compiler.autotune import tune_and_build
    from compiler.codegen import generate

    program = lower(_trace(lambda a: torch.softmax(a, -1), torch.randn(8, 3000)))
    scheduled = schedule(program, CompileOptions())
    generated = generate(scheduled, TARGET)
    kernel = generated.kernels[0]
    assert kernel.config["persistent"] and "for roffset" not in kernel.source
    candidates = candidate_configs(kernel, can_regenerate=True)
    looped = [c for c in candidates if not c["persistent"]]
    assert len(looped) == 1 and looped[0]["RBLOCK"] < 3000

    def prefer_loops(trial, _sizes):
        return 1.0 if not trial.config["persistent"] else 2.0

    monkeypatch.setattr("compiler.autotune.gpu_timer", lambda target: prefer_loops)  # the fake GPU
    tune_and_build(generated, scheduled, TARGET, CompileOptions())
    assert kernel.config == looped[0] and "for roffset" in kernel.source
    assert kernel.cubin_metadata["constants"]["RBLOCK"] == looped[0]["RBLOCK"]
    step = next(s for s in generated.plan["steps"] if s["op"] == "kernel")
    assert step["config"] == looped[0] and step["args"] == kernel.arguments


def test_a_short_looped_column_reduction_is_also_tried_with_its_rows_in_registers(monkeypatch):
    import torch

    from compiler.autotune import SHORT_COLUMN_ROWS, tune_and_build
    from compiler.codegen import generate

    # a column sum of a tall matrix splits; its final pass sums a few hundred partials per column
    program = lower(_trace(lambda a: a.sum(0), torch.randn(65536, 8)))
    scheduled = schedule(program, CompileOptions())
    generated = generate(scheduled, TARGET)
    final = next(k for k in generated.kernels if k.config.get("outer") and k.rnumel < 65536)
    assert not final.config["persistent"] and "for roffset" in final.source and final.rnumel <= SHORT_COLUMN_ROWS
    assert all(not c["persistent"] for c in candidate_configs(final))  # without a new source, none
    whole = [c for c in candidate_configs(final, can_regenerate=True) if c["persistent"]]
    assert whole and all(c["RBLOCK"] >= final.rnumel and c["outer"] for c in whole)

    def prefer_registers(trial, _sizes):
        return 1.0 if trial.config["persistent"] else 2.0

    monkeypatch.setattr("compiler.autotune.gpu_timer", lambda target: prefer_registers)  # the fake GPU
    tune_and_build(generated, scheduled, TARGET, CompileOptions())
    assert final.config == whole[0] and "for roffset" not in final.source
    assert final.cubin_metadata["constants"]["RBLOCK"] == whole[0]["RBLOCK"]


@pytest.mark.parametrize("speedup, replaces", [(0.01, False), (0.03, True)])
def test_a_candidate_replaces_the_heuristic_only_when_clearly_faster(speedup, replaces):
    kernel, dtypes, sizes = softmax_kernel()
    candidates = candidate_configs(kernel)
    timer = lambda trial, _: 1.0 - speedup if trial.config == candidates[1] else 1.0  # noqa: E731
    autotune_kernels([kernel], dtypes, sizes, TARGET, CompileOptions(), MemoryTuningCache(), timer)
    assert kernel.config == (candidates[1] if replaces else candidates[0])


def test_close_candidates_are_timed_again_in_turn_and_their_medians_decide():
    """A candidate that one timing puts 2.5 % ahead but that is slower when timed again loses; one
    clearly slower is not timed again."""
    from compiler.autotune import CLOSE_CALL, RETIME_ROUNDS

    kernel, dtypes, sizes = softmax_kernel()
    candidates = candidate_configs(kernel)
    lucky, steady, slow = candidates[1], candidates[2], candidates[3]
    calls: dict[int, int] = {}

    def timer(trial, _):
        j = candidates.index(trial.config)
        calls[j] = calls.get(j, 0) + 1
        if trial.config == lucky:
            return 0.950 if calls[j] == 1 else 1.0  # fast once, by luck
        if trial.config == steady:
            return 0.974
        return 2.0 if trial.config == slow else 1.0

    autotune_kernels([kernel], dtypes, sizes, TARGET, CompileOptions(), MemoryTuningCache(), timer)
    assert 0.974 <= 0.950 * (1 + CLOSE_CALL)  # within the close call of the lucky first timing
    assert kernel.config == steady and kernel.tuning["ms"][1] == 1.0
    assert calls[1] == calls[2] == 1 + RETIME_ROUNDS
    assert calls[3] == 1 and calls[0] == 1  # 2x and 5 % slower than the best: timed once


def test_a_close_fusion_call_is_timed_again_and_the_medians_decide():
    """The fused kernel times faster once and slower after: its medians refuse the fusion."""
    import torch

    from compiler.autotune import RETIME_ROUNDS
    from compiler.benchmark_fusion import FusionBenchmarker
    from compiler.fx_import import from_fx
    from torch.fx.experimental.proxy_tensor import make_fx

    inputs = [torch.randn(8, 300)]
    program = lower(from_fx(make_fx(lambda a: (a * 2, a.sum(-1)))(*inputs), inputs))
    fused_timings = iter([0.0245, 0.0300, 0.0300])  # a lucky first timing (1.8 % ahead), then its real time

    def timer(kernel, _sizes):
        return next(fused_timings) if len(kernel.nodes) > 1 else 0.0110

    scheduled = schedule(program, CompileOptions(), FusionBenchmarker(TARGET, CompileOptions(), timer))
    decision = scheduled.fusion_log["benchmarked"][0]
    assert decision["fused"] is False and decision["fused_ms"] == 0.0300 and RETIME_ROUNDS == 2
    assert len([s for s in scheduled.steps if isinstance(s, KernelGroup)]) == 2


def test_a_short_persistent_row_is_tried_on_one_warp_with_as_many_rows_as_fill_its_threads():
    """Inductor's LayerNorm over 192 (Swin): 4 rows of 256 lanes on one warp, 32 elements a thread."""
    import torch

    kernel = _first_kernel(lambda a: torch.nn.functional.layer_norm(a, (192,)), torch.randn(25088, 192))
    assert kernel.config["persistent"] and kernel.config["RBLOCK"] == 256
    shapes = {(c["XBLOCK"], c["num_warps"]) for c in candidate_configs(kernel)}
    assert {(4, 1), (8, 2), (1, 1), (1, 2)} <= shapes


def test_timing_gives_index_buffers_random_values_below_the_size_they_index():
    import torch
    import torch.nn.functional as F

    weight, idx, shifted, counts = (torch.randn(37, 8), torch.randint(0, 37, (100,)), torch.randint(0, 30, (6,)),
                                    torch.randint(0, 5, (6,)))
    fn = lambda w, i, s, c: (F.embedding(i, w), w[i[:6]], w[s + 3], c + 1)  # noqa: E731
    program = lower(_trace(fn, weight, idx, shifted, counts))
    specs = benchmark_buffers(program, schedule(program, CompileOptions()).read_writes)
    weight_spec, idx_spec, shifted_spec, counts_spec = [specs[b.name] for b in program.inputs]
    assert weight_spec[2] is None and weight_spec[1] == "float32"  # floats: random normal
    assert idx_spec[2] == 37  # rows of the 37-row weight, twice
    assert shifted_spec[2] is None  # computed on (s + 3) before indexing: random values could overflow
    assert counts_spec[2] is None  # an integer input that indexes nothing


def test_layer_norm_rows_start_one_per_program_on_one_warp():
    """The heuristic (before tuning) for persistent rows of 257-1024 elements; shorter rows still
    share a program."""
    from compiler.codegen.heuristics import KernelShape, launch_config

    config = launch_config(KernelShape(8192, 768, True), "cuda:sm_90")
    assert (config["XBLOCK"], config["num_warps"], config["persistent"]) == (1, 1, True)
    assert launch_config(KernelShape(8192, 128, True), "cuda:sm_90")["XBLOCK"] > 1


@pytest.mark.parametrize("widths,start,also_tried", [
    ((384, 768, 1024), (2, 2), {(2, 4), (4, 4)}),  # heuristics.MIXED_MID_ROWS: the former 2 rows on 4 warps tried
    ((192, 256), (2, 1), {(2, 2), (8, 4)}),  # heuristics.MIXED_SHORT_ROWS: the former 8 rows on 4 warps tried
])
def test_a_mixed_kernel_starts_at_the_step_fitted_to_its_row_length_and_tries_the_former_one(widths, start, also_tried):
    """The mixed-order heuristics fitted over the measured mixed kernels: rows of 257-1024 start at 2 rows
    on 2 warps, rows of 129-256 at 2 on 1; the former defaults stay candidates, and rows of 128 or fewer
    keep their wider steps."""
    from compiler.codegen.heuristics import KernelShape, launch_config

    for width in widths:
        config = launch_config(KernelShape(4096, width, True, mix_rows=8), "cuda:sm_90")
        assert (config["XBLOCK"], config["num_warps"], config["mix_rows"]) == (*start, 8)
        kernel = types.SimpleNamespace(config=config, numel=4096, rnumel=width)
        assert {(c["XBLOCK"], c["num_warps"]) for c in candidate_configs(kernel)} >= {start, *also_tried}
    for rows, width in ((100352, 96), (12832, 128)):
        short = launch_config(KernelShape(rows, width, True, mix_rows=128), "cuda:sm_90")
        assert (short["XBLOCK"], short["num_warps"]) == (16, 4)


def test_a_looped_row_reduction_with_few_rows_starts_on_long_steps_of_32_warps():
    """heuristics.FEW_LOOPED_ROWS: a BatchNorm's statistics over 128 NCHW channels have a program per
    channel, too few to keep memory busy on 8 warps; with more rows the default stays."""
    from compiler.codegen.heuristics import KernelShape, launch_config

    few = launch_config(KernelShape(128, 25088, True), "cuda:sm_90")
    assert (few["XBLOCK"], few["RBLOCK"], few["num_warps"], few["persistent"]) == (1, 4096, 32, False)
    many = launch_config(KernelShape(4096, 32000, True), "cuda:sm_90")
    assert (many["RBLOCK"], many["num_warps"]) == (2048, 8)


@pytest.mark.parametrize("columns,rows,whole", [
    (64, 784, True), (48, 300, True), (33, 100, True), (384, 1568 // 2, False), (256, 1000, False), (200, 400, False),
    (64, 50, False), (64, 2048, False), (1024, 1000, False),
])
def test_a_few_short_columns_are_held_whole_and_the_former_looped_tiles_still_tried(columns, rows, whole):
    """heuristics.WHOLE_SHORT_COLUMNS_RULE: up to 64 columns of 65-1024 rows, one column a program in
    registers; autotuning also tries 2 and 4 columns, and with a new source the looped tiles of before
    (4 columns x 512 rows a step), though they launch fewer programs."""
    from compiler.codegen.heuristics import KernelShape, launch_config, next_power_of_2

    config = launch_config(KernelShape(columns, rows, True, outer=True), "cuda:sm_90")
    assert config["outer"] and (config["persistent"] and config["XBLOCK"] == 1) is whole
    if not whole:
        return
    assert config["RBLOCK"] == next_power_of_2(rows) and config["num_warps"] == 4
    kernel = types.SimpleNamespace(config=config, numel=columns, rnumel=rows)
    tried = {(c["XBLOCK"], c["RBLOCK"], c["persistent"]) for c in candidate_configs(kernel, can_regenerate=True)}
    looped = min(512, next_power_of_2(rows) // 2)
    assert tried >= {(2, config["RBLOCK"], True), (4, config["RBLOCK"], True), (4, looped, False)}
    assert all(persistent for *_, persistent in {(c["XBLOCK"], c["RBLOCK"], c["persistent"])
                                                   for c in candidate_configs(kernel)})  # without a new source


@pytest.mark.parametrize("columns, rows, tile", [
    (8192, 196, True), (4096, 129, True), (16383, 256, True),  # a channels-last BatchNorm's first pass
    (16384, 196, False), (4095, 196, False), (8192, 128, False), (8192, 257, False),
])
def test_short_columns_of_many_outputs_are_held_whole_16_a_program(columns, rows, tile, monkeypatch):
    """heuristics.SHORT_COLUMN_TILE_RULE: 4096-16383 columns of 129-256 rows, 16 columns a program with
    their rows in registers; autotuning tries every tile a looped base would, with a new source, and
    the looped default of before among them."""
    from compiler.codegen import heuristics
    from compiler.codegen.heuristics import KernelShape, launch_config

    config = launch_config(KernelShape(columns, rows, True, outer=True), "cuda:sm_90")
    assert (config["persistent"] and config["XBLOCK"] == 16 and config["RBLOCK"] == 256) is tile
    if not tile:
        return
    kernel = types.SimpleNamespace(config=config, numel=columns, rnumel=rows)
    key = lambda c: (c["XBLOCK"], c["RBLOCK"], c["num_warps"], c["persistent"])  # noqa: E731
    tried = {key(c) for c in candidate_configs(kernel, can_regenerate=True)}
    monkeypatch.setattr(heuristics, "SHORT_COLUMN_TILE_RULE", False)
    looped = launch_config(KernelShape(columns, rows, True, outer=True), "cuda:sm_90")
    assert not looped["persistent"]
    before = {key(c) for c in candidate_configs(types.SimpleNamespace(config=looped, numel=columns, rnumel=rows),
                                                can_regenerate=True)}
    assert key(looped) in tried and tried >= before
    assert all(c["persistent"] for c in candidate_configs(kernel))  # without a new source


def test_a_crossed_reduction_also_tries_column_tiles_with_their_own_source(monkeypatch):
    """A BatchNorm backward reading channels-last and writing NCHW (EfficientNet's squeeze-and-
    excitation tail) is crossed: a row kernel that also tries tiles of columns x rows, written anew
    as a column kernel, and adopts one when it is faster."""
    import torch

    from compiler.autotune import CROSSED_TILES, needs_own_source, tune_and_build
    from compiler.codegen import generate

    aten = torch.ops.aten

    def fn(g, x, w, mean, invstd):
        grad = aten.silu_backward.default(aten.div.Scalar(aten.expand.default(g, [32, 256, 7, 7]), 49), x)
        return aten.native_batch_norm_backward.default(grad, x, w, None, None, mean, invstd, True, 1e-5, [True] * 3)

    inputs = [torch.randn(32, 256, 1, 1, dtype=torch.bfloat16),
              torch.randn(32, 256, 7, 7, dtype=torch.bfloat16).to(memory_format=torch.channels_last),
              torch.randn(256), torch.randn(256), torch.rand(256) + 0.5]
    scheduled = schedule(lower(_trace(fn, *inputs)), CompileOptions())
    generated = generate(scheduled, TARGET)
    crossed = [k for k in generated.kernels if k.crossed]
    assert crossed and all(not k.config.get("outer") for k in crossed)
    kernel = crossed[0]
    tiles = [c for c in candidate_configs(kernel, can_regenerate=True) if c.get("outer")]
    assert tiles and {(c["XBLOCK"], c["RBLOCK"]) for c in tiles} <= {(x, r) for x, r, _ in CROSSED_TILES}
    assert all(needs_own_source(c, kernel.config) for c in tiles)
    assert not [c for c in candidate_configs(kernel) if c.get("outer")]  # without a new source, none

    def prefer_tiles(trial, _sizes):
        return 1.0 if trial.config.get("outer") else 2.0

    monkeypatch.setattr("compiler.autotune.gpu_timer", lambda target: prefer_tiles)  # the fake GPU
    tune_and_build(generated, scheduled, TARGET, CompileOptions())
    assert kernel.config == tiles[0] and "for roffset" in kernel.source


def test_a_layer_norm_over_a_transposed_patch_embedding_is_crossed_and_tries_rows_per_program():
    """ViT's class token `cat` onto patches read across their NCHW layout, + positions, LayerNorm (at
    ViT-B's sizes; nothing runs): the rows are written along the channels and the patches read across
    them, so autotuning also tries 4-16 rows per program on 8-16 warps (4 on 8 won on an H100) and
    column tiles; a plain LayerNorm is not crossed."""
    import torch
    import torch.nn.functional as F

    from compiler.codegen import generate

    def fn(patches, cls, pos, w, b):
        x = torch.cat([cls.expand(patches.shape[0], -1, -1), patches.flatten(2).transpose(1, 2)], 1) + pos
        return F.layer_norm(x, (x.shape[-1],), w, b)

    inputs = [torch.randn(32, 768, 14, 14, dtype=torch.bfloat16), torch.randn(1, 1, 768, dtype=torch.bfloat16),
              torch.randn(1, 197, 768, dtype=torch.bfloat16), torch.randn(768, dtype=torch.bfloat16),
              torch.randn(768, dtype=torch.bfloat16)]
    (kernel,) = generate(schedule(lower(_trace(fn, *inputs)), CompileOptions()), TARGET).kernels
    assert kernel.crossed and kernel.config["persistent"] and kernel.config["XBLOCK"] < 4
    candidates = candidate_configs(kernel, can_regenerate=True)
    assert kernel.config | {"XBLOCK": 4, "num_warps": 8} in candidates
    assert any(c.get("outer") and not c["persistent"] for c in candidates)
    assert not any(c.get("outer") for c in candidate_configs(kernel))  # a column tile needs its own source
    layer_norm = lambda x, w, b: F.layer_norm(x, (768,), w, b)  # noqa: E731
    (plain,) = generate(schedule(lower(_trace(layer_norm, *inputs[2:])), CompileOptions()), TARGET).kernels
    assert not plain.crossed


def test_a_tiled_transpose_is_also_tried_in_narrow_tiles():
    import torch

    # ResNet's weight copied to channels-last: 256 x 128 x 3 x 3, small enough that tile shape shows
    kernel = _first_kernel(lambda w: w.contiguous(memory_format=torch.channels_last), torch.randn(256, 128, 3, 3))
    assert kernel.config.get("tiled")
    tiles = {(c["XBLOCK"], c["RBLOCK"]) for c in candidate_configs(kernel)}
    assert {(16, 64), (64, 16), (32, 32)} <= tiles



def _limit_shared(monkeypatch, limit: int) -> None:
    """A target whose blocks may use `limit` bytes of shared memory (an H100's may use 232448)."""
    monkeypatch.setitem(MAX_SHARED_BYTES, 90, limit)


def _needs(manifest_kernel: dict) -> int:
    """The shared memory a manifest's kernel needs per block."""
    return manifest_kernel["cubin_metadata"]["metadata"]["shared"]


def _softmax_rows():
    """Rows of 2000: the heuristic holds each in registers on 4 warps, which meet in shared memory."""
    import torch

    return _trace(lambda a: torch.softmax(a, -1), torch.randn(64, 2000))


def test_candidates_that_would_not_load_are_not_timed_and_the_fastest_that_loads_wins(monkeypatch):
    """A candidate whose cubin needs more shared memory than a block may use builds but does not load
    (PoolFormer's GroupNorm statistics asked for 512 KiB on an H100): it gets no timing, None in the
    manifest, and cannot be chosen however fast it would be."""
    from compiler.autotune import tune_and_build
    from compiler.codegen import generate

    scheduled = schedule(lower(_softmax_rows()), CompileOptions())
    generated = generate(scheduled, TARGET)
    (kernel,) = generated.kernels
    heuristic_needs = _needs(compiler.compile(_softmax_rows(), TARGET, HEURISTIC).manifest["kernels"][0])
    _limit_shared(monkeypatch, heuristic_needs - 1)
    timed = []

    def prefer_many_warps(trial, _sizes):
        timed.append(shared_bytes(trial))
        return 1.0 / trial.config["num_warps"]

    monkeypatch.setattr("compiler.autotune.gpu_timer", lambda target: prefer_many_warps)  # the fake GPU
    tune_and_build(generated, scheduled, TARGET, CompileOptions())
    assert timed and max(timed) < heuristic_needs
    assert kernel.tuning["ms"][0] is None and kernel.tuning["ms"][kernel.tuning["chosen"]] is not None
    assert shared_bytes(kernel) < heuristic_needs


def test_a_heuristic_config_that_would_not_load_gives_way_to_a_candidate_that_does(monkeypatch):
    """Without a GPU (no timing), a kernel whose heuristic config needs more shared memory than a
    block may use takes the first of its candidates that fits; none fitting is a clear error."""
    (heuristic,) = compiler.compile(_softmax_rows(), TARGET, HEURISTIC).manifest["kernels"]
    needs = _needs(heuristic)
    assert 0 < needs <= MAX_SHARED_BYTES[90]
    _limit_shared(monkeypatch, needs - 1)
    (fitted,) = compiler.compile(_softmax_rows(), TARGET, HEURISTIC).manifest["kernels"]
    assert fitted["config"] != heuristic["config"] and _needs(fitted) < needs
    _limit_shared(monkeypatch, -1)
    with pytest.raises(AotError, match="no launch config fits the shared memory of a block"):
        compiler.compile(_softmax_rows(), TARGET, HEURISTIC)


def test_a_fusion_whose_kernel_would_not_load_is_not_timed_and_the_score_decides(monkeypatch):
    """Benchmark-driven fusion times no kernel that would not load (here: none would, a block may use
    no shared memory at all and every trial needs some): the judge gives no opinion."""
    import torch

    _limit_shared(monkeypatch, -1)
    scheduled = _bench_schedule(lambda a: (a * 2, a.sum(-1)), [torch.randn(8, 300)], fused_ms=3.0, parts_ms=1.0)
    assert scheduled.fusion_log["benchmarked"] == []
    assert len([s for s in scheduled.steps if isinstance(s, KernelGroup)]) == 1  # the score's fusion
