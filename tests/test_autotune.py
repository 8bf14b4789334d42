"""Autotuning decisions (compiler/autotune.py). Timing needs a GPU; here a deterministic fake
timer stands in for the GPU so that the choice, the tie rule, the cache and the budget can be
checked on CPU. tests/gpu/test_gpu_autotune.py times real candidates."""

from __future__ import annotations

import pytest

import compiler
from compiler.autotune import MemoryTuningCache, autotune_kernels, candidate_configs
from compiler.codegen import generate_kernel
from compiler.lowering import lower
from compiler.options import CompileOptions
from compiler.scheduler import KernelGroup, schedule
from tests.corpus import load_graph

TARGET = "cuda:sm_90"


def softmax_kernel():
    program = lower(load_graph("softmax_fp32"))
    scheduled = schedule(program, CompileOptions())
    dtypes = {name: b.dtype for name, b in program.buffers.items()}
    sizes = {name: (b.layout.storage_numel(), b.dtype) for name, b in program.buffers.items()}
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


@pytest.mark.parametrize("options, expected", [
    ({"autotune": False}, "autotuning off"),
    ({"autotune_budget_s": 0}, "time budget"),
])
def test_options_turn_tuning_off_or_bound_it(options, expected):
    kernel, dtypes, sizes = softmax_kernel()
    heuristic = dict(kernel.config)
    note = autotune_kernels([kernel], dtypes, sizes, TARGET, CompileOptions(**options), None, lambda t, s: 1.0)
    assert expected in note and kernel.config == heuristic and kernel.tuning is None


def test_without_a_gpu_the_heuristics_decide_and_the_manifest_says_so():
    artifact = compiler.compile(load_graph("softmax_fp32"), TARGET)
    assert "no GPU" in artifact.manifest["autotune"]
    assert all("autotune" not in k for k in artifact.manifest["kernels"])
