"""The fusewire compiler: wire graph -> lowering -> scheduler -> codegen -> autotune -> artifact.

`compile()` below is the whole pipeline, one stage per line. The stages are imported
inside it because the API process imports `compiler.graph` and must not pay for (or
even have) torch and triton.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from compiler.gc_pause import paused_gc
from compiler.options import CompileOptions

if TYPE_CHECKING:
    from compiler.artifact import Artifact
    from compiler.bounds import WorkLimits
    from compiler.graph import Graph

__all__ = ["compile", "CompileOptions"]


@paused_gc
def compile(graph: "Graph", target: str = "cpu", options: CompileOptions | dict | None = None, progress=None,
            tuning_cache=None, limits: "WorkLimits | None" = None) -> "Artifact":
    """Compiles a validated wire graph for `target` ("cpu" or "cuda:sm_90") into an Artifact.

    `progress(stage, fraction)` is called as stages finish, for job reporting; `tuning_cache`
    (get/put of autotuning results, see compiler/autotune.py) is shared across compiles.
    `limits` bound every tensor and the plan's peak (compiler/bounds.py; LimitExceeded past them).
    """
    from compiler import graph as wire
    from compiler.artifact import build_artifact
    from compiler.bounds import WorkLimits, check_plan
    from compiler.autotune import tune_and_build
    from compiler.benchmark_fusion import FusionBenchmarker
    from compiler.codegen import generate
    from compiler.lowering import lower
    from compiler.scheduler import schedule

    report = progress or (lambda stage, fraction: None)
    options = options if isinstance(options, CompileOptions) else CompileOptions.model_validate(options or {})
    wire.validate_target(target)
    wire.validate_released_inputs(graph, options)
    report("lowering", 0.0)
    limits = limits or WorkLimits()
    program = lower(graph, limits, eager_random=options.eager_random)
    report("scheduling", 0.25)
    judge = FusionBenchmarker.for_target(target, options)
    scheduled = schedule(program, options, judge)
    report("codegen", 0.5)
    generated = generate(scheduled, target)
    check_plan(generated.plan, limits)  # before autotuning allocates anything on a GPU
    report("autotuning", 0.6)
    tuned = tune_and_build(generated, scheduled, target, options, tuning_cache, judge.spent_s if judge else 0.0)
    report("packaging", 0.9)
    artifact = build_artifact(graph, target, options, tuned)
    report("done", 1.0)
    return artifact
