"""A/B on a GPU of the two ways fusewire handles reductions that read one tensor along their rows
and another across them: autotuning's column tiles for crossed reductions (compiler/autotune.py,
_crossed_variants) and the trial of transposed producers inlined (compiler/inline_gathers.py,
transposed_producers). Each bench case whose name contains one of the given substrings is
compiled (autotuned, benchmark-driven fusion on) under each mode and timed as bench/kernels.py
times it (a CUDA-graph replay on a cold L2), with Inductor and a copy of the same bytes beside it
(bench/side_by_side.py). Modes: "shipped" (both), "no-crossed", "no-transposed", "neither"; a
suffix after "_" repeats a mode. One JSON row per case, from every case folder given.

    python3 bench/transposing_ab.py batch_norm_backward,layer_norm out.jsonl [shipped,neither] [dir,dir...]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import compiler.autotune as autotune  # noqa: E402
import compiler.scheduler as scheduler  # noqa: E402
from bench.side_by_side import case_dirs, compare_modes  # noqa: E402

SHIPPED_CROSSED, SHIPPED_TRANSPOSED = autotune._crossed_variants, scheduler.transposed_producers


def set_mode(mode: str) -> None:
    mode = mode.split("_")[0]
    autotune._crossed_variants = (lambda kernel: []) if mode in ("no-crossed", "neither") else SHIPPED_CROSSED
    scheduler.transposed_producers = (lambda program: []) if mode in ("no-transposed", "neither") else SHIPPED_TRANSPOSED


def main() -> None:
    modes = (sys.argv[3] if len(sys.argv) > 3 else "shipped,neither").split(",")
    compare_modes(sys.argv[1].split(","), sys.argv[2], modes, set_mode, shipped="shipped",
                  folders=case_dirs(sys.argv[4] if len(sys.argv) > 4 else None))


if __name__ == "__main__":
    main()
