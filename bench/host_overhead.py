"""Host time per launch: fusewire's runtime against Inductor's generated wrapper, on one graph of
many small kernels (the GPU is idle at the start of each call, so host time is what is measured).

    python bench/host_overhead.py [--softmaxes 100] [--size 64] [--calls 200] [--json out.json]

The graph is a chain of softmaxes over alternating dims of a small fp32 matrix (about two
kernels per softmax for both compilers: a reduction along rows and one along columns never
share a kernel). fusewire's artifact is compiled here (`compiler.compile` for this GPU) and
run by `client.runtime`; Inductor's is `torch.compile(fn)` (its call includes dynamo's guards).
Per compiler: kernels per call (torch.profiler), the median host time per call over --calls
calls, and that divided by the kernels.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from client.cubin import cuda_target  # noqa: E402
from gpu_profile import host_time_ms, profile_kernels  # noqa: E402


def chain(softmaxes: int):
    def fn(x: torch.Tensor) -> torch.Tensor:
        for i in range(softmaxes):
            x = torch.softmax(x * 1.5, dim=i % 2)
        return x
    return fn


def fusewire_call(fn, x: torch.Tensor):
    from torch.fx.experimental.proxy_tensor import make_fx

    import compiler
    from client.runtime import load
    from compiler.fx_import import from_fx

    graph = from_fx(make_fx(fn)(x), [x])
    run = load(compiler.compile(graph, cuda_target()))
    return lambda: run(x)


def measure(name: str, call, calls: int, expected: torch.Tensor) -> dict:
    got = call()
    got = got[0] if isinstance(got, list) else got
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    for _ in range(10):
        call()
    per_call = statistics.median(host_time_ms(call) for _ in range(calls))
    kernels = profile_kernels(call)["kernels"]
    return {"compiler": name, "kernels": kernels, "host_ms_per_call": round(per_call, 4),
            "host_us_per_kernel": round(per_call * 1e3 / kernels, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--softmaxes", type=int, default=100)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    fn = chain(args.softmaxes)
    x = torch.randn(args.size, args.size, device="cuda")
    expected = fn(x)
    inductor = torch.compile(fn)
    rows = [measure("fusewire", fusewire_call(fn, x), args.calls, expected),
            measure("inductor", lambda: inductor(x), args.calls, expected)]
    for row in rows:
        print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                         "softmaxes": args.softmaxes, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
