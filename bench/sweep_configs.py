"""Times a few launch configs (XBLOCK, RBLOCK, num_warps) per benchmark case on a GPU, by
overriding the heuristic for each case's largest kernel. Used to pick the heuristics in
compiler/codegen/heuristics.py; autotuning proper belongs to the workers.

    python3 -m bench.sweep_configs      (from the repository root)
"""

from __future__ import annotations

from torch.fx.experimental.proxy_tensor import make_fx

import compiler
import compiler.codegen as codegen
from bench.kernels import CASES, Case, _flatten, graph_time_ms, relative_error
from client.cubin import cuda_target
from client.runtime import load
from compiler.codegen import heuristics
from compiler.fx_import import from_fx

SWEEPS = {
    "transpose_add": [{}, {"XBLOCK": 32, "RBLOCK": 32}, {"XBLOCK": 64, "RBLOCK": 64, "num_warps": 8},
                      {"XBLOCK": 32, "RBLOCK": 128, "num_warps": 8}, {"XBLOCK": 128, "RBLOCK": 32}],
    "attention": [{}, {"XBLOCK": 1, "num_warps": 4}, {"XBLOCK": 1, "num_warps": 8}, {"XBLOCK": 2, "num_warps": 8},
                  {"XBLOCK": 4, "num_warps": 8}],
    "column_sum": [{}, {"XBLOCK": 128, "RBLOCK": 16}, {"XBLOCK": 32, "RBLOCK": 64},
                   {"XBLOCK": 64, "RBLOCK": 64, "num_warps": 8}, {"XBLOCK": 256, "RBLOCK": 8, "num_warps": 8}],
    "softmax_8192": [{}, {"num_warps": 16}, {"num_warps": 4}],
    "layer_norm_8192": [{}, {"num_warps": 16}, {"num_warps": 4}],
    "bias_gelu": [{}, {"XBLOCK": 2048, "num_warps": 8}, {"XBLOCK": 512, "num_warps": 4}],
}
LARGE_KERNEL = 1 << 20  # elements: only the case's big kernel gets the override


def time_with(case: Case, override: dict) -> tuple[float, float]:
    """(median ms, relative error) of the case compiled with `override` on its big kernel."""
    def patched(shape, target):
        config = heuristics.launch_config(shape, target)
        return config | override if shape.numel * shape.rnumel >= LARGE_KERNEL else config

    codegen.launch_config = patched
    try:
        inputs = case.make_inputs()
        graph = from_fx(make_fx(case.fn)(*inputs), inputs)
        run = load(compiler.compile(graph, cuda_target()))
        error = relative_error(run(*inputs), _flatten(case.fn(*inputs)))
        return graph_time_ms(run, inputs), error
    finally:
        codegen.launch_config = heuristics.launch_config


def main() -> None:
    for key, overrides in SWEEPS.items():
        case = next(c for c in CASES if key in c.name)
        for override in overrides:
            ms, error = time_with(case, override)
            print(f"{case.name:45} {str(override):55} {ms:.4f} ms  rel err {error:.1e}", flush=True)


if __name__ == "__main__":
    main()
