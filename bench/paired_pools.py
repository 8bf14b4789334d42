"""Pointwise kernels that read two input elements per output (compiler/paired_lanes.py) beyond the
bench sets, on a GPU: stride-2 max pools with eager's int64 indices and without indices, halving
average pools in bf16 and float32 (DenseNet's NCHW transitions), and |z|^2 of interleaved real and
imaginary parts. Each is compiled with PAIRED_LANES on and off (autotuned; no fusions to judge),
checked against eager, and timed as bench/kernels.py times cases (a CUDA-graph replay on a cold
L2), beside Inductor, eager and a copy of the same bytes. One JSON row per case.

    python3 bench/paired_pools.py --json pools.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

import compiler  # noqa: E402
from bench.kernels import graph_time_ms, same_bytes_copy_ms  # noqa: E402
from client.cubin import cuda_target  # noqa: E402
from client.runtime import load  # noqa: E402
from compiler import paired_lanes  # noqa: E402
from compiler.fx_import import from_fx  # noqa: E402

BF16 = torch.bfloat16


def _cases() -> dict[str, tuple[Callable, list[torch.Tensor]]]:
    def randn(*shape, dtype=BF16):
        return torch.randn(*shape, device="cuda", dtype=dtype)

    return {
        "max_pool_with_int64_indices_32x64x112x112_bf16": (
            lambda x: torch.ops.aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1]), [randn(32, 64, 112, 112)]),
        "max_pool_values_32x64x112x112_bf16": (lambda x: F.max_pool2d(x, 3, 2, 1), [randn(32, 64, 112, 112)]),
        "avg_pool_2x2_32x256x56x56_bf16": (lambda x: F.avg_pool2d(x, 2, 2), [randn(32, 256, 56, 56)]),
        "avg_pool_2x2_32x128x56x56_fp32": (lambda x: F.avg_pool2d(x, 2, 2), [randn(32, 128, 56, 56, dtype=torch.float32)]),
        "complex_abs2_8x1024x4096_bf16": (lambda x: x[..., ::2] ** 2 + x[..., 1::2] ** 2, [randn(8, 1024, 4096)]),
    }


def _as_tuple(value) -> tuple:
    return value if isinstance(value, tuple) else (value,)


def measure(name: str, fn: Callable, inputs: list[torch.Tensor]) -> dict:
    graph = from_fx(make_fx(fn)(*inputs), inputs)
    eager = _as_tuple(fn(*inputs))
    moved = sum(t.numel() * t.element_size() for t in [*inputs, *eager])
    row: dict = {"case": name, "bytes": moved}
    for mode in ("on", "off"):
        paired_lanes.PAIRED_LANES = mode == "on"
        try:
            artifact = compiler.compile(graph, cuda_target(), {"autotune": True, "benchmark_fusion": False})
        finally:
            paired_lanes.PAIRED_LANES = True
        run = load(artifact)
        got = run(*inputs)
        row[mode] = {"us": round(1000 * graph_time_ms(run, inputs), 2),
                     "max_abs_diff": max(float((g.double() - e.double()).abs().max()) for g, e in zip(got, eager)),
                     "configs": [k["config"] for k in artifact.manifest["kernels"]]}
    inductor = torch.compile(fn)
    inductor(*inputs)
    row["inductor_us"] = round(1000 * graph_time_ms(inductor, inputs), 2)
    row["eager_us"] = round(1000 * graph_time_ms(fn, inputs), 2)
    row["same_bytes_copy_us"] = round(1000 * same_bytes_copy_ms(moved), 2)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default="", help="write the rows to this file")
    args = parser.parse_args()
    rows = []
    for name, (fn, inputs) in _cases().items():
        rows.append(measure(name, fn, inputs))
        r = rows[-1]
        print(f"{name:50s} paired {r['on']['us']:7.2f}  1D {r['off']['us']:7.2f}  inductor {r['inductor_us']:7.2f}  "
              f"copy {r['same_bytes_copy_us']:7.2f} us", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
