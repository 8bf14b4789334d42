"""Launch configs by problem size, before any autotuning: block sizes, warps, and
whether a reduction is persistent (the whole row in registers, no loop)."""

from __future__ import annotations

PERSISTENT_RBLOCK_LIMIT = 1024  # rows up to this many elements stay in registers
MAX_BLOCK_ELEMENTS = 4096  # XBLOCK * RBLOCK


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def launch_config(numel: int, rnumel: int, is_reduction: bool) -> dict:
    if not is_reduction:
        xblock = min(1024, next_power_of_2(numel))
        return {"XBLOCK": xblock, "RBLOCK": 1, "num_warps": 4 if xblock >= 512 else 2, "num_stages": 1,
                "persistent": False}
    persistent = next_power_of_2(rnumel) <= PERSISTENT_RBLOCK_LIMIT
    rblock = next_power_of_2(rnumel) if persistent else 1024
    xblock = max(1, min(next_power_of_2(numel), MAX_BLOCK_ELEMENTS // rblock))
    return {"XBLOCK": xblock, "RBLOCK": rblock, "num_warps": 8 if rblock >= 1024 else 4, "num_stages": 1,
            "persistent": persistent}
