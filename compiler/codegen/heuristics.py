"""Block sizes and warps by problem size (before any autotuning)."""

from __future__ import annotations


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def launch_config(numel: int, rnumel: int, is_reduction: bool) -> dict:
    if not is_reduction:
        xblock = min(1024, next_power_of_2(numel))
        return {"XBLOCK": xblock, "RBLOCK": 1, "num_warps": 4 if xblock >= 512 else 2, "num_stages": 1}
    rblock = min(1024, next_power_of_2(rnumel))
    xblock = max(1, min(next_power_of_2(numel), 4096 // rblock))
    return {"XBLOCK": xblock, "RBLOCK": rblock, "num_warps": 8 if rblock >= 1024 else 4, "num_stages": 1}
