"""How a column sum over narrow rows ([N, C] contiguous, C of 32-384, the bias gradient of a
Linear over few features) is best cut, timed on a GPU with hand-written Triton kernels (not
fusewire's codegen): the first pass of a split sum as fusewire writes it (programs over
(chunk, column) pairs, a tile of XBLOCK columns x RBLOCK rows per step), against programs that
each walk a chunk of CH whole rows in steps of RSTEP rows, all columns at once (as a mixed-order
kernel walks its rows). Each kernel writes one partial sum per chunk and column; the second pass
is not timed. Times are triton.testing.do_bench's (L2 cleared before each launch), in us, with a
copy of the input's bytes beside them.

    python3 bench/column_sum_probe.py [out.jsonl]
"""

from __future__ import annotations

import itertools
import json
import sys

import torch
import triton
import triton.language as tl

SHAPES = ((100352, 96), (25088, 192), (6272, 384), (100352, 64), (50176, 160), (200704, 32))


@triton.jit
def column_tiles(x_ptr, out_ptr, xnumel, C: tl.constexpr, CH: tl.constexpr, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    chunk = xindex // C
    col = xindex % C
    acc = tl.zeros([XBLOCK, RBLOCK], tl.float32)
    for r0 in range(0, CH, RBLOCK):
        r = r0 + tl.arange(0, RBLOCK)[None, :]
        mask = xmask & (r < CH)
        value = tl.load(x_ptr + C * r + C * CH * chunk + col, mask, other=0, eviction_policy="evict_first")
        acc += value.to(tl.float32)
    tl.store(out_ptr + xindex, tl.sum(acc, 1)[:, None], xmask)


@triton.jit
def whole_rows(x_ptr, out_ptr, C: tl.constexpr, CH: tl.constexpr, RSTEP: tl.constexpr, CBLOCK: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, CBLOCK)[None, :]
    acc = tl.zeros([RSTEP, CBLOCK], tl.float32)
    for r0 in range(0, CH, RSTEP):
        r = r0 + tl.arange(0, RSTEP)[:, None]
        mask = (cols < C) & (r < CH)
        value = tl.load(x_ptr + (pid * CH + r) * C + cols, mask, other=0, eviction_policy="evict_first")
        acc += value.to(tl.float32)
    out_cols = tl.arange(0, CBLOCK)
    tl.store(out_ptr + pid * C + out_cols, tl.sum(acc, 0), out_cols < C)


def largest_chunk_dividing(rows: int, most: int) -> int:
    return max(c for c in range(1, most + 1) if rows % c == 0)


def time_us(fn) -> float:
    return triton.testing.do_bench(fn, warmup=10, rep=50) * 1000


def probe(rows: int, cols: int) -> list[dict]:
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    want = x.float().sum(0)
    copy_dst = torch.empty(rows * cols // 2, device="cuda", dtype=torch.bfloat16)
    flat = x.view(-1)[: rows * cols // 2]
    results = [{"kind": "copy of the input's bytes", "us": time_us(lambda: copy_dst.copy_(flat))}]
    results.append({"kind": "torch.sum", "us": time_us(lambda: x.sum(0))})
    cblock = triton.next_power_of_2(cols)
    for ch in sorted({largest_chunk_dividing(rows, 196), 64, 128, 256} & {c for c in (64, 128, 196, 256, 98) if rows % c == 0}):
        chunks = rows // ch
        out = torch.empty(chunks * cols, device="cuda", dtype=torch.float32)
        for xblock, rblock, warps in ((16, 32, 4), (32, 64, 4), (64, 32, 4), (128, 16, 8), (64, 64, 8), (16, 128, 4)):
            grid = (triton.cdiv(chunks * cols, xblock),)
            launch = lambda: column_tiles[grid](x, out, chunks * cols, cols, ch, xblock, rblock, num_warps=warps)
            launch()
            ok = torch.allclose(out.view(chunks, cols).sum(0), want, rtol=1e-3, atol=1e-2)
            results.append({"kind": "column tiles", "CH": ch, "XBLOCK": xblock, "RBLOCK": rblock, "warps": warps,
                            "programs": grid[0], "us": time_us(launch), "ok": ok})
        for rstep, warps in itertools.product((8, 16, 32), (2, 4, 8)):
            if rstep * cblock > 8192 or rstep > ch:
                continue
            launch = lambda: whole_rows[(chunks,)](x, out, cols, ch, rstep, cblock, num_warps=warps)
            launch()
            ok = torch.allclose(out.view(chunks, cols).sum(0), want, rtol=1e-3, atol=1e-2)
            results.append({"kind": "whole rows", "CH": ch, "RSTEP": rstep, "warps": warps, "programs": chunks,
                            "us": time_us(launch), "ok": ok})
    return results


def main() -> None:
    out = open(sys.argv[1], "w") if len(sys.argv) > 1 else None
    for rows, cols in SHAPES:
        results = probe(rows, cols)
        copy_us = results[0]["us"]
        print(f"== {rows} x {cols} bf16: copy {copy_us:.2f} us, torch.sum {results[1]['us']:.2f} us")
        for kind in ("column tiles", "whole rows"):
            best = sorted((r for r in results if r["kind"] == kind), key=lambda r: r["us"])[:4]
            for r in best:
                shape = {k: v for k, v in r.items() if k not in ("kind", "us")}
                print(f"  {kind:13s} {r['us']:7.2f} us ({copy_us / r['us'] * 100:5.1f} % of copy) {shape}")
        if out:
            out.write(json.dumps({"rows": rows, "cols": cols, "results": results}) + "\n")


if __name__ == "__main__":
    main()
