"""A graph compiled with one kind of kernel's autotuning candidates forced to one config, for the
GPU tests that run every candidate of a kernel (tests/gpu/test_gpu_pipelined.py,
tests/gpu/test_gpu_paired_lanes.py, tests/gpu/test_gpu_unrolled_lanes.py)."""

from __future__ import annotations

from typing import Callable, Iterator

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import compiler
import compiler.autotune as autotune
from client.cubin import cuda_target
from client.runtime import load
from compiler.codegen import generate
from compiler.fx_import import from_fx
from compiler.lowering import lower
from compiler.options import CompileOptions
from compiler.scheduler import schedule


def compiled_with(graph, config: dict, is_target: Callable[[dict], bool]):
    """`graph` compiled for this GPU with the candidates of every kernel whose heuristic config
    `is_target` accepts forced to [config]; every other kernel keeps its heuristic config."""
    shipped = autotune.candidate_configs
    autotune.candidate_configs = lambda kernel, can_regenerate=False: \
        [config] if is_target(kernel.config) else shipped(kernel, can_regenerate)[:1]
    try:
        return compiler.compile(graph, cuda_target(), {"benchmark_fusion": False})
    finally:
        autotune.candidate_configs = shipped


def every_candidate(fn: Callable, inputs: list[torch.Tensor], config_key: str) -> Iterator[tuple[dict, list]]:
    """`fn` traced on `inputs`, then run once per autotuning candidate of its one kernel whose config
    has `config_key` (the others on their heuristic configs): (config, outputs) of each run, after
    checking that the kernel was built with that config. There must be two candidates at least."""
    graph = from_fx(make_fx(fn)(*inputs), inputs)
    kernels = generate(schedule(lower(graph), CompileOptions(benchmark_fusion=False)), cuda_target()).kernels
    (target,) = [k for k in kernels if k.config.get(config_key)]
    configs = autotune.candidate_configs(target)
    assert len(configs) > 1
    for config in configs:
        artifact = compiled_with(graph, config, lambda c: bool(c.get(config_key)))
        (built,) = [k for k in artifact.manifest["kernels"] if k["config"].get(config_key)]
        assert built["config"] == config
        yield config, load(artifact)(*inputs)
