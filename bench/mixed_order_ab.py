"""Mixed-order reductions A/B on a GPU (compiler/mixed_order.py): each bench case whose name
contains one of the given substrings is compiled (autotuned, benchmark-driven fusion on) with
mixed-order fusion off, with the judge deciding, and forced, and timed as bench/kernels.py times
it (a CUDA-graph replay on a cold L2); Inductor and a same-bytes copy beside them (bench/side_by_side.py).
One JSON row per case.

    python3 bench/mixed_order_ab.py layer_norm_backward out.jsonl [nomix,judge,force]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.side_by_side import compare_modes  # noqa: E402
from compiler import benchmark_fusion, mixed_order, scheduler, split_reductions  # noqa: E402

REAL_CHUNK, REAL_UNCERTAIN = mixed_order.mix_chunk, benchmark_fusion.uncertain


def set_mode(mode: str) -> None:
    """nomix: no column sum is split for a mixed kernel; judge: as shipped; force: the judge never
    times a mixed-order fusion, so it is always kept."""
    chunk = REAL_CHUNK if mode != "nomix" else (lambda rows, length: None)
    split_reductions.mix_chunk = scheduler.mix_chunk = chunk
    benchmark_fusion.uncertain = REAL_UNCERTAIN if mode != "force" else (
        lambda a, b, fused, rw: None if fused.mix_rows else REAL_UNCERTAIN(a, b, fused, rw))


def main() -> None:
    modes = (sys.argv[3] if len(sys.argv) > 3 else "nomix,judge").split(",")
    compare_modes(sys.argv[1].split(","), sys.argv[2], modes, set_mode, shipped="judge")


if __name__ == "__main__":
    main()
