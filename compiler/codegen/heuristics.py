"""Launch configs by problem size and target, before any autotuning: block sizes, warps,
and whether a reduction is persistent (the whole row in registers, no loop).

Reductions come in two shapes: *inner* (the reduced elements are contiguous in memory,
like a row sum) wants a wide RBLOCK; *outer* (the outputs are contiguous, like a column
sum) wants a wide XBLOCK and a short RBLOCK so each load is a coalesced row segment.
On the CPU target (Triton's interpreter) big blocks just mean fewer Python-level
program instances, so it uses its own, simpler sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.mixed_order import MIX_MIN_PROGRAMS
from compiler.row_order import MAX_BLOCK_ELEMENTS

CPU_PERSISTENT_LIMIT = 1024
GPU_PERSISTENT_LIMIT = 8192
CPU_BLOCK_ELEMENTS = 4096
# Persistent rows of 257-1024 elements (LayerNorm and RMSNorm over 768 or 1024) run one row per
# program on one warp, as Inductor runs them. H100, 2026-11-24, cold-L2 graph replays of a grid of
# configs: GPT-2's LayerNorm of 8192 x 768 bf16 14.6 us (2 rows on 4 warps, the old default, 14.8),
# with the residual add 22.6 (23.3), LLaMA's RMSNorm of 4096 x 1024 16.2 (best 16.1), ViT's
# 6304 x 768 19.1 (best 18.0, 4 rows on 1 warp): the best or within 6 %; autotuning still varies it.
ONE_WARP_ROWS = (256, 1024)
OUTER_MIN_PROGRAMS = 256
# A looped row reduction with this many rows or fewer (a program each: about two per SM or fewer)
# walks its row 4096 elements a step on 32 warps, to keep bytes enough in flight. H200, 2026-11-27,
# bench/heuristic_fit.py: over the 9 such kernels of the case sets (BatchNorm statistics of NCHW
# tensors over 128-256 channels, ResNet's, the CNN block's, EfficientNet's), the default 2048 on 8
# warps ran 1.12-1.63x the fastest candidate's time, 4096 on 32 warps 1.00-1.04x. With more rows the
# best config depends on the kernel (vocabulary-wide softmax statistics want 32 warps, their
# backwards 8-16) and the default stays.
FEW_LOOPED_ROWS = 256
FEW_LOOPED_ROWS_RULE = True  # the switch for bench/switch_ab.py --untuned
# A mixed-order kernel's [XBLOCK, RBLOCK] step (compiler/mixed_order.py): 2 rows of 1024 on 4 warps,
# of 8 configs the best for GPT-2's LayerNorm backward, 4 % and 8 % behind the best for BERT's and
# ViT's (H100, 2026-11-24; autotuning tries the others).
MIXED_STEP_ELEMENTS = 2048
# ...except rows of 129-256 elements, which take 2 rows on 1 warp: autotuning picked exactly that for 14
# of the 20 distinct mixed kernels over such rows in the measured sets (the LayerNorm backwards of
# CrossViT, GC ViT, SAM's ViT, Twins, EVA-02, VOLO and DaViT; H100 and H200, 2026-11-27 to 29), 2 rows on
# 2-4 warps for 4 more, where the default (8 rows on 4 warps) ran 1.0-2.7x the tuned time (geomean 1.72x).
# A/B'd untuned over the 20 cases with such a kernel (H200, 2026-11-29, bench/switch_ab.py --untuned): the
# cases ran 0.735x the old default's time (geomean), 16 faster by 3 % or more (up to 1.9x: SAM's ViT,
# Twins, GC ViT), 3 slower (DaViT's and FocalNet's LayerNorm backwards 1.09x, one ConvNeXt case 1.03x).
# Autotuning still tries 8 rows on 4 warps.
MIXED_SHORT_ROWS = (128, 256)
MIXED_SHORT_ROWS_RULE = True  # the switch for bench/switch_ab.py --untuned
# ...except rows of 257-1024 elements, which take 2 rows on 2 warps. Fitted over every mixed kernel
# of the four case sets (H200, 2026-11-27, bench/heuristic_fit.py: each kernel's autotuning
# candidates timed): 2 rows on 4 warps ran 1.154x the fastest candidate's time (geomean of 17
# kernels), up to 2.3x where a kernel does more per row (dropout backwards, several column sums);
# 2 rows on 2 warps 1.045x, at most 1.19x, 1.030x on the sets fitted and 1.061x on the held-out
# ones (BERT, GPT-2 and ViT's LayerNorm backwards; GPT-NeoX's, Mistral's and Swin's).
MIXED_MID_ROWS = (256, 1024)
MIXED_MID_ROWS_RULE = True  # the switch for bench/switch_ab.py --untuned
# ...with their loop's loads issued two steps ahead (codegen.group.loop_header) where the program
# walks 8 steps or more, or the grid is no more than MIX_MIN_PROGRAMS programs (about four per SM):
# the pipeliner's shared memory leaves fewer programs resident, and a larger grid then runs in two
# waves. H100, 2026-11-27, bench/heuristic_fit.py, the 32 mixed kernels over rows of 257-1024 of the
# eight case sets, the heuristic's config with and without: BERT's, GPT-2's, Swin's, Phi's and
# Qwen2's LayerNorm and RMSNorm backwards (512 programs, or 784 of 16 steps) 1.02-1.23x faster,
# ViT's and MLP-Mixer's (784-788 programs of 4 steps) 0.84-1.03x, left out by the rule; those with a
# dropout backward 0.90-1.07x.
MIXED_MID_ROWS_STAGES = 3
MIXED_PIPELINED_MIN_STEPS = 8
MIXED_PIPELINED_RULE = True  # the switch for bench/switch_ab.py --untuned


# Columns of 65-1024 rows, 64 of them or fewer (the final pass of a BatchNorm's statistics or of a weight
# gradient over partial sums of 16-64 channels), are held whole, one a program on 4 warps: the looped
# default (4 columns x 512 rows a step) launches a quarter as many programs. Autotuning picked exactly that for
# 154 of the 175 such kernels in the stored rows of the measured sets (docs/bench-*.json, H100 and
# H200, 2026-11-23 to 29), where the looped default ran, against the tuned time (geomean): 1.29x over
# 62 kernels of 513-1024 rows, 1.14x over 94 of 257-512, 1.10x over 19 of 65-256. Over 65-256 columns
# of 513-1024 rows (the pick for 44 of 68) it was tried too and left out: untuned, CrossViT's, CaiT's,
# DaViT's and EVA-02's LayerNorm backwards ran 4-8 % slower (H200, 2026-11-29, bench/switch_ab.py), the
# only cases of a sample of 47 to lose 3 % or more; the form kept was not timed again.
WHOLE_COLUMN_ROWS = (64, 1024)
WHOLE_COLUMNS = 64
WHOLE_SHORT_COLUMNS_RULE = True  # the switch for bench/switch_ab.py --untuned
# Columns of 129-256 rows, 4096-16383 of them (the first pass of a channels-last BatchNorm's statistics
# over 14 x 14 or 7 x 7 maps, split into chunks of 196 rows; an SE block's channel means), are held
# 16 a program with their rows whole, on 4 warps. Over 96 such kernels of 4096-8191 columns in the
# stored rows of the measured sets (docs/bench-*.json, H100 and H200, 2026-11-23 to 29) the looped
# default (16 or 32 columns x 128 or 64 rows a step) ran 1.20x the tuned time, and this tile was
# autotuning's most frequent pick (38, 8 more at 8 columns); where every candidate was timed
# (bench/heuristic_fit.py, H200, 2026-11-27, 25 kernels) it ran 1.016x the fastest, the looped
# default 1.161x. Over 8192-16383 columns it shared the most picks with 16 x 32 looped (24 and 26 of 63).
# A/B'd untuned over 61 of the 122 cases it changes (H200, 2026-11-29, bench/switch_ab.py --untuned): the
# cases ran 1.117x faster (geomean), 39 by 3 % or more (Res2Net's BatchNorm 88.8 -> 45.9 us, DPN's 27.3 ->
# 16.7, HGNetV2's 41.2 -> 29.4), 3 slower by 4-10 % (MobileNetV3's and EdgeNeXt's channel sums of a
# backward, MixNet's BatchNorm backward). Autotuning tries every tile it tried before (tuned, 6 of
# them moved by 1 % or less).
SHORT_COLUMN_TILE_ROWS = (128, 256)
SHORT_COLUMN_TILE_COLUMNS = (4096, 16384)
SHORT_COLUMN_TILE = 16
SHORT_COLUMN_TILE_RULE = True  # the switch for bench/switch_ab.py --untuned


def is_whole_short_column(columns: int, rows: int) -> bool:
    """Whether a column reduction's columns are held whole, one a program (WHOLE_COLUMN_ROWS)."""
    return WHOLE_SHORT_COLUMNS_RULE and columns <= WHOLE_COLUMNS and \
        WHOLE_COLUMN_ROWS[0] < next_power_of_2(rows) <= WHOLE_COLUMN_ROWS[1]


def is_short_column_tile(columns: int, rows: int) -> bool:
    """Whether a column reduction's columns are held whole, SHORT_COLUMN_TILE a program."""
    return SHORT_COLUMN_TILE_RULE and SHORT_COLUMN_TILE_COLUMNS[0] <= columns < SHORT_COLUMN_TILE_COLUMNS[1] and \
        SHORT_COLUMN_TILE_ROWS[0] < next_power_of_2(rows) <= SHORT_COLUMN_TILE_ROWS[1]


# A 2D tile's rows (XBLOCK): 64, or for a tile of at most NARROW_TILE_COLUMNS columns as many as keep the
# tile at TILE_ELEMENTS, up to NARROW_TILE_ROWS. A permute copy whose output's last dim is short (NesT's
# heads moved last: 1536 x 196 x 32 fp32 to [..., 3] bf16; an image's 3 channels moved last) walked 64 x 4
# tiles, 192 elements a program: NesT's ran 34.5 us against a same-bytes copy's 19.4 (H200, 2026-11-29).
NARROW_TILE_RULE = True  # the switch for bench/switch_ab.py
NARROW_TILE_COLUMNS = 16
TILE_ELEMENTS = 64 * 64
NARROW_TILE_ROWS = 1024


def tile_rows(rnumel: int) -> int:
    """A 2D-tiled pointwise kernel's rows per tile for `rnumel` columns (NARROW_TILE_RULE)."""
    columns = min(64, next_power_of_2(rnumel))
    if not NARROW_TILE_RULE or columns > NARROW_TILE_COLUMNS:
        return 64
    return min(NARROW_TILE_ROWS, TILE_ELEMENTS // columns)


@dataclass(frozen=True)
class KernelShape:
    numel: int
    rnumel: int
    is_reduction: bool
    outer: bool = False  # the reduction reads along x contiguously (column-like)
    tiled: bool = False  # a 2D-tiled pointwise kernel
    row_block: int = 1  # rows a program needs at least (their accesses are contiguous across rows)
    mix_rows: int = 0  # a mixed-order kernel's rows per program (compiler/mixed_order.py)
    lanes: bool = False  # a pointwise kernel walked in pairs of outputs (compiler/paired_lanes.py)
    unrolled: int = 1  # outputs a point of a kernel over cells (compiler/unrolled_lanes.py)


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def launch_config(shape: KernelShape, target: str) -> dict:
    if shape.mix_rows:
        return _mixed_config(shape, target)
    if shape.lanes:  # [XBLOCK, 2] blocks, two pairs a thread (H100, 2026-11-28: a hand-written kernel of
        # ResNet's 3x3 stride-2 max pool in pairs, 32.8 us at 256 pairs on 4 warps, as at 128 on 2 and 512 on 8;
        # 38.4 at 1024 on 8)
        return _config(min(256, next_power_of_2(shape.numel)), 2, 4, True) | {"tiled": True, "lanes": 2}
    if shape.tiled:
        return _config(min(tile_rows(shape.rnumel), next_power_of_2(shape.numel)), min(64, next_power_of_2(shape.rnumel)),
                       4, True) | {"tiled": True}
    if shape.unrolled > 1:  # about 1024 outputs a program, as a 1D kernel's
        cells = 1 << ((1024 // shape.unrolled).bit_length() - 1)  # a power of two (3 lanes: 256 cells)
        return _config(min(cells, next_power_of_2(shape.numel)), 1, 4, False) | {"unrolled": shape.unrolled}
    if target == "cpu":
        return _cpu_config(shape)
    if not shape.is_reduction:
        return _config(min(1024, next_power_of_2(shape.numel)), 1, 4 if shape.numel >= 1024 else 2, False)
    if shape.outer:
        return _outer_config(shape)
    return _inner_config(shape)


def _config(xblock: int, rblock: int, num_warps: int, persistent: bool) -> dict:
    return {"XBLOCK": xblock, "RBLOCK": rblock, "num_warps": num_warps, "num_stages": 1, "persistent": persistent}


def _cpu_config(shape: KernelShape) -> dict:
    if not shape.is_reduction:
        return _config(min(1024, next_power_of_2(shape.numel)), 1, 4, False)
    persistent = next_power_of_2(shape.rnumel) <= CPU_PERSISTENT_LIMIT
    rblock = next_power_of_2(shape.rnumel) if persistent else 1024
    xblock = max(1, min(next_power_of_2(shape.numel), CPU_BLOCK_ELEMENTS // rblock))
    return _config(xblock, rblock, 4, persistent)


def _inner_config(shape: KernelShape) -> dict:
    rows = next_power_of_2(shape.numel)
    row_block = min(rows, next_power_of_2(shape.row_block))
    whole_rows = row_block * next_power_of_2(shape.rnumel) <= MAX_BLOCK_ELEMENTS  # else a block of rows loops
    if next_power_of_2(shape.rnumel) <= GPU_PERSISTENT_LIMIT and whole_rows:
        rblock = next_power_of_2(shape.rnumel)
        if ONE_WARP_ROWS[0] < rblock <= ONE_WARP_ROWS[1] and row_block == 1:
            return _config(1, rblock, 1, True)
        xblock = max(1, row_block, min(rows, 2048 // rblock))
        num_warps = min(16, max(2, xblock * rblock // 512))
        return _config(xblock, rblock, num_warps, True)
    if FEW_LOOPED_ROWS_RULE and row_block == 1 and shape.numel <= FEW_LOOPED_ROWS:
        return _config(1, 4096, 32, False)
    # A looped row, one per program. 8 warps or 16 depends on the kernel (H100, 2026-11-23: a
    # log_softmax of 4096 x 32000 bf16 in one kernel 0.49 ms with 8 warps, 0.35 with 16; with 16
    # as the default, ResNet's BatchNorm forward of 128 channels x 25088 went from 0.011 ms to
    # 0.015, its fusions decided on that config too): autotuning tries both,
    # and so does benchmark-driven fusion (LOOPED_TRIALS), whose decisions would otherwise rest
    # on a config that autotuning later replaces.
    return _config(row_block, max(64, 2048 // row_block), 8, False)


def _outer_config(shape: KernelShape) -> dict:
    if is_whole_short_column(shape.numel, shape.rnumel):
        return _config(1, next_power_of_2(shape.rnumel), 4, True) | {"outer": True}
    if is_short_column_tile(shape.numel, shape.rnumel):
        return _config(SHORT_COLUMN_TILE, next_power_of_2(shape.rnumel), 4, True) | {"outer": True}
    return tiled_outer_config(shape.numel, shape.rnumel)


def tiled_outer_config(numel: int, rnumel: int) -> dict:
    """A column reduction's config where no rule holds its columns whole: a wide block of columns
    over a few rows, else a block of columns x rows a step."""
    columns = next_power_of_2(numel)
    if next_power_of_2(rnumel) <= 64:  # a few rows: a wide block of columns, ~2K elements per program
        rblock = next_power_of_2(rnumel)
        # at least ~128 programs where there are columns enough (a second pass over split sums is small)
        xblock = min(columns, 1024, max(32, 2048 // rblock), max(32, columns // 128))
        return _config(xblock, rblock, outer_warps(xblock), True) | {"outer": True}
    # 32 columns x 64 rows per step measured best for a column sum of 8192x4096 fp32 on an H200.
    # Fewer columns than 32 x OUTER_MIN_PROGRAMS (the final pass over a mixed-order kernel's
    # partial sums: 768 columns x 512 partials) take narrower blocks, so that the GPU still gets
    # programs enough, and longer steps (H100, 2026-11-24: 32 columns, 24 programs, 8.4-9.8 us).
    xblock = min(columns, 32, max(4, columns // OUTER_MIN_PROGRAMS))
    rblock = max(64, min(next_power_of_2(rnumel), 2048 // xblock))
    return _config(xblock, rblock, 4, False) | {"outer": True}


def outer_warps(xblock: int) -> int:
    """Warps for an outer reduction that keeps its rows in registers: one per 256 columns, so
    that each warp spans its columns with full-width vector loads and a row's elements meet in
    one thread; a warp more splits the rows across warps, and the sum then goes through shared
    memory (H100, 2026-11-23, a sum over 8 rows of 8 x 1024 x 768 bf16: 256 columns with 1 warp
    21.6 us, with 4 warps 39.9 us; 1024 columns with 4 warps 21.4 us)."""
    return max(1, min(8, xblock // 256))


def _mixed_config(shape: KernelShape, target: str) -> dict:
    """A mixed-order kernel: its whole row in registers (RBLOCK), XBLOCK of its program's mix_rows
    rows per step (a power of two that divides them)."""
    rblock = next_power_of_2(shape.rnumel)
    if MIXED_MID_ROWS_RULE and target != "cpu" and MIXED_MID_ROWS[0] < rblock <= MIXED_MID_ROWS[1]:
        xblock = min(2, shape.mix_rows & -shape.mix_rows)
        programs = -(-shape.numel // shape.mix_rows)
        pipelined = programs <= MIX_MIN_PROGRAMS or shape.mix_rows // xblock >= MIXED_PIPELINED_MIN_STEPS
        ahead = {"loop_stages": MIXED_MID_ROWS_STAGES} if MIXED_PIPELINED_RULE and pipelined else {}
        return _config(xblock, rblock, 2, True) | {"mix_rows": shape.mix_rows} | ahead
    if MIXED_SHORT_ROWS_RULE and target != "cpu" and MIXED_SHORT_ROWS[0] < rblock <= MIXED_SHORT_ROWS[1]:
        return _config(min(2, shape.mix_rows & -shape.mix_rows), rblock, 1, True) | {"mix_rows": shape.mix_rows}
    elements = CPU_BLOCK_ELEMENTS if target == "cpu" else MIXED_STEP_ELEMENTS
    xblock = max(1, min(shape.mix_rows & -shape.mix_rows, elements // rblock))
    num_warps = 4 if target == "cpu" else min(16, max(1, xblock * rblock // 512))
    return _config(xblock, rblock, num_warps, True) | {"mix_rows": shape.mix_rows}
