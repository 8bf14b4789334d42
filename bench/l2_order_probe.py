"""Does a kernel that rereads a large buffer gain from walking its programs in reverse?

A BatchNorm's statistics kernel reads its input front to back; the normalize kernel after it reads
the input again. At the end of the first kernel L2 holds the input's tail; a second kernel that
starts at the front misses all of it (and evicts it on the way), one that starts at the tail hits
it. This probe times the pair (a column-sum pass, then a pointwise pass over the same input), as
the cases are timed (a CUDA-graph replay on a cold L2), with the second kernel forward or reversed
and the first kernel's loads evict_first or normal, over input sizes around the L2's 50 MB.

    python3 bench/l2_order_probe.py [out.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.kernels import graph_time_ms  # noqa: E402


@triton.jit
def _block_sums(x_ptr, out_ptr, numel, BLOCK: tl.constexpr, EVICT_FIRST: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    if EVICT_FIRST:
        values = tl.load(x_ptr + offsets, offsets < numel, other=0, eviction_policy="evict_first")
    else:
        values = tl.load(x_ptr + offsets, offsets < numel, other=0)
    tl.store(out_ptr + pid, tl.sum(values.to(tl.float32), 0))


@triton.jit
def _normalize(x_ptr, y_ptr, numel, scale, BLOCK: tl.constexpr, REVERSE: tl.constexpr):
    pid = tl.program_id(0)
    if REVERSE:
        pid = tl.num_programs(0) - 1 - pid
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < numel
    values = tl.load(x_ptr + offsets, mask, other=0).to(tl.float32)
    tl.store(y_ptr + offsets, (values * scale).to(tl.bfloat16), mask)


def pair(x: torch.Tensor, y: torch.Tensor, sums: torch.Tensor, reverse: bool, evict_first: bool) -> None:
    sum_block, block = 8192, 1024
    _block_sums[(triton.cdiv(x.numel(), sum_block),)](x, sums, x.numel(), BLOCK=sum_block,
                                                       EVICT_FIRST=evict_first, num_warps=8)
    _normalize[(triton.cdiv(x.numel(), block),)](x, y, x.numel(), 0.5, BLOCK=block, REVERSE=reverse, num_warps=4)


def main() -> None:
    rows = []
    for mib in (24, 40, 49, 64, 77, 100, 200):
        numel = mib * 2**20 // 2
        x = torch.randn(numel, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        sums = torch.empty(triton.cdiv(numel, 8192), device="cuda", dtype=torch.float32)
        row = {"MiB": mib}
        for reverse in (False, True):
            for evict_first in (True, False):
                key = f"{'reverse' if reverse else 'forward'}_{'evict_first' if evict_first else 'normal'}_us"
                row[key] = round(1000 * graph_time_ms(
                    lambda a, b, s, r=reverse, e=evict_first: pair(a, b, s, r, e), [x, y, sums]), 2)
        row["copy_us"] = round(1000 * graph_time_ms(lambda a, b: b.copy_(a), [x, y]), 2)
        print(json.dumps(row), flush=True)
        rows.append(row)
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
