"""Kernel benchmark on a GPU: eager PyTorch, torch.compile (Inductor) and fusewire on
the corpus's functions at training sizes (fusewire autotuned and with benchmark-driven fusion
unless --no-autotune / --no-benchmark-fusion).

For each case: fusewire compiles the captured graph for this GPU's arch (cubins built
ahead of time, launched without the Triton compiler), checks the result against eager
(relative error in float64), then all three are timed as CUDA-graph replays (so host
launch overhead is out of the numbers) with triton.testing.do_bench's median.
Achieved GB/s counts the fewest bytes the graph must move (each input read once, each
output written once); %copy compares it with a measured device-to-device copy.

    python bench/kernels.py [--cases softmax,layer_norm] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

BF16 = torch.bfloat16


@dataclass
class Case:
    name: str
    fn: Callable
    make_inputs: Callable[[], list[torch.Tensor]]


def _randn(*shape, dtype=BF16):
    return lambda: torch.randn(*shape, device="cuda", dtype=dtype)


def softmax(x):
    return torch.softmax(x, -1)


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


def rms_norm(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w


def residual_layer_norm(x, r, w, b):
    h = x + r
    return h, F.layer_norm(h, (h.shape[-1],), w, b)


def bias_gelu(x, b):
    return F.gelu(x + b, approximate="tanh")


def column_sum(x):
    return x.sum(0)


def transpose_add(x, y):
    return x.t() + y


def cross_entropy(logits, target):
    return F.cross_entropy(logits, target)


def attention_softmax(scores, mask):
    return torch.softmax((scores * 0.125).masked_fill(mask, float("-inf")), -1)


def layer_norm_backward(x, w, b, grad):
    x = x.detach().requires_grad_(True)
    out = F.layer_norm(x, (x.shape[-1],), w, b)
    return torch.autograd.grad(out, [x], grad)


def _inputs(*makers):
    return lambda: [m() for m in makers]


CASES = [
    Case("softmax_8192x4096_bf16", softmax, _inputs(_randn(8192, 4096))),
    Case("layer_norm_8192x4096_bf16", layer_norm, _inputs(_randn(8192, 4096), _randn(4096), _randn(4096))),
    Case("rms_norm_8192x4096_bf16", rms_norm, _inputs(_randn(8192, 4096), _randn(4096))),
    Case("residual_layer_norm_8192x4096_bf16", residual_layer_norm,
         _inputs(_randn(8192, 4096), _randn(8192, 4096), _randn(4096), _randn(4096))),
    Case("bias_gelu_tanh_8192x8192_bf16", bias_gelu, _inputs(_randn(8192, 8192), _randn(8192))),
    Case("column_sum_8192x4096_fp32", column_sum, _inputs(_randn(8192, 4096, dtype=torch.float32))),
    Case("transpose_add_4096x4096_fp32", transpose_add,
         _inputs(_randn(4096, 4096, dtype=torch.float32), _randn(4096, 4096, dtype=torch.float32))),
    Case("cross_entropy_4096x32000_bf16", cross_entropy,
         _inputs(_randn(4096, 32000), lambda: torch.randint(0, 32000, (4096,), device="cuda"))),
    Case("attention_mask_softmax_16x16x1024x1024_bf16", attention_softmax,
         _inputs(_randn(16, 16, 1024, 1024),
                 lambda: torch.triu(torch.ones(1024, 1024, dtype=torch.bool, device="cuda"), 1))),
    Case("layer_norm_backward_8192x4096_bf16", layer_norm_backward,
         _inputs(_randn(8192, 4096), _randn(4096), _randn(4096), _randn(8192, 4096))),
]


def graph_time_ms(fn: Callable, inputs: list[torch.Tensor]) -> float:
    """Median time of a CUDA-graph replay of fn(*inputs)."""
    import triton.testing

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn(*inputs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(*inputs)
    return triton.testing.do_bench(graph.replay, warmup=25, rep=200, return_mode="median")


def copy_bandwidth_gbs() -> float:
    import triton.testing

    src = torch.empty(1 << 29, dtype=torch.float32, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    return 2 * src.numel() * 4 / ms / 1e6


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def relative_error(ours: list[torch.Tensor], ref: list[torch.Tensor]) -> float:
    worst = 0.0
    for a, b in zip(ours, ref):
        a, b = a.double(), b.double()
        if b.dtype.is_floating_point:
            worst = max(worst, ((a - b).norm() / max(b.norm().item(), 1e-30)).item())
        else:
            worst = max(worst, float((a != b).any()))
    return worst


def run_case(case: Case, target: str, copy_gbs: float, with_inductor: bool, autotune: bool = True,
             benchmark_fusion: bool = True) -> dict:
    import compiler
    from client.runtime import load
    from compiler.fx_import import from_fx
    from torch.fx.experimental.proxy_tensor import make_fx

    inputs = case.make_inputs()
    graph = from_fx(make_fx(case.fn)(*inputs), inputs)
    started = time.perf_counter()
    artifact = compiler.compile(graph, target, {"autotune": autotune, "benchmark_fusion": benchmark_fusion})
    compile_s = time.perf_counter() - started
    run = load(artifact)
    ours = run(*inputs)
    reference = [t for t in _flatten(case.fn(*inputs))]
    error = relative_error(ours, reference)
    moved = tensor_bytes(inputs) + tensor_bytes(reference)
    row = {"case": case.name, "kernels": len(artifact.manifest["kernels"]), "compile_s": round(compile_s, 2),
           "rel_error": error, "bytes": moved,
           "benchmarked": [f"{d['why_benchmarked'].split(':')[0]}: {'kept' if d['fused'] else 'overturned'}"
                           for d in artifact.manifest["fusion"]["benchmarked"]]}
    timings = {"eager": lambda: graph_time_ms(case.fn, inputs), "fusewire": lambda: graph_time_ms(run, inputs)}
    if with_inductor:
        compiled = torch.compile(case.fn)
        started = time.perf_counter()
        compiled(*inputs)
        row["inductor_compile_s"] = round(time.perf_counter() - started, 2)
        timings["inductor"] = lambda: graph_time_ms(compiled, inputs)
    for label, measure in timings.items():
        ms = measure()
        gbs = moved / ms / 1e6
        row[label] = {"ms": round(ms, 4), "GB/s": round(gbs, 1), "%copy": round(100 * gbs / copy_gbs, 1)}
    return row


def _flatten(value):
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _flatten(v)]
    return [value]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="", help="comma-separated substrings of case names (default: all)")
    parser.add_argument("--json", default="", help="write the rows to this file")
    parser.add_argument("--no-inductor", action="store_true", help="skip torch.compile (faster)")
    parser.add_argument("--no-autotune", action="store_true", help="fusewire with heuristic configs only")
    parser.add_argument("--no-benchmark-fusion", action="store_true", help="the fusion score alone decides fusions")
    args = parser.parse_args()
    major, minor = torch.cuda.get_device_capability()
    target = f"cuda:sm_{major}{minor}"
    copy_gbs = copy_bandwidth_gbs()
    print(f"device {torch.cuda.get_device_name()} ({target}), torch {torch.__version__}, "
          f"device-to-device copy {copy_gbs:.0f} GB/s")
    wanted = [w for w in args.cases.split(",") if w]
    rows = []
    for case in CASES:
        if wanted and not any(w in case.name for w in wanted):
            continue
        try:
            rows.append(run_case(case, target, copy_gbs, not args.no_inductor, not args.no_autotune,
                                 not args.no_benchmark_fusion))
        except Exception as exc:  # report and go on: one broken case must not hide the others
            rows.append({"case": case.name, "error": f"{type(exc).__name__}: {exc}"[:500]})
        print(json.dumps(rows[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "copy_GBs": copy_gbs, "rows": rows}, f, indent=1)
    _print_table(rows)


def _print_table(rows: list[dict]) -> None:
    print(f"\n{'case':46} {'eager ms':>9} {'inductor':>9} {'fusewire':>9} {'fw GB/s':>8} {'%copy':>6} {'vs ind':>7} k")
    ratios = []
    for row in rows:
        if "error" in row:
            print(f"{row['case']:46} ERROR {row['error'][:80]}")
            continue
        ind = row.get("inductor", {}).get("ms", math.nan)
        fw = row["fusewire"]["ms"]
        ratios.append(ind / fw)
        print(f"{row['case']:46} {row['eager']['ms']:9.4f} {ind:9.4f} {fw:9.4f} {row['fusewire']['GB/s']:8.0f} "
              f"{row['fusewire']['%copy']:6.1f} {ind / fw:7.2f} {row['kernels']}")
    finite = [r for r in ratios if r == r]
    if finite:
        print(f"geomean speedup over inductor: {math.exp(sum(map(math.log, finite)) / len(finite)):.3f}")


if __name__ == "__main__":
    main()
