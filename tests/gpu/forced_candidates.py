"""A graph compiled with one kind of kernel's autotuning candidates forced to one config, for the
GPU tests that run every candidate of a kernel (tests/gpu/test_gpu_pipelined.py,
tests/gpu/test_gpu_paired_lanes.py)."""

from __future__ import annotations

from typing import Callable

import compiler
import compiler.autotune as autotune
from client.cubin import cuda_target


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
