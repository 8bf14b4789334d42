"""A/B on a GPU of one of the compiler's boolean switches, e.g.
compiler.split_reductions.EXACT_CHUNKS (chunks of a power-of-two length that divides the row) or
compiler.codegen.group.POINTWISE_KEEP_REREAD (evict_last on what a pointwise kernel reads more
than once). Each bench case whose name contains one of the given substrings is compiled
(autotuned, benchmark-driven fusion on) with the switch on and off and timed as bench/kernels.py
times it (a CUDA-graph replay on a cold L2), with Inductor and a copy of the same bytes beside it
(bench/side_by_side.py). One JSON row per case, modes "on" and "off"; then the switch is put back.

    python3 bench/switch_ab.py compiler.split_reductions.EXACT_CHUNKS sum_25088x768,batch_norm out.jsonl [dir,dir...]

A switch of a heuristic (compiler.codegen.heuristics.FEW_LOOPED_ROWS_RULE) wants `--untuned` at the
end: both sides compile with the heuristics' configs and the score's fusions, as a large graph's
kernels run where its tuning budget runs out (autotuned, both sides would pick among the same
candidates).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.census import resolve_switch  # noqa: E402
from bench.side_by_side import TUNED, UNTUNED, case_dirs, compare_modes  # noqa: E402


def main() -> None:
    untuned = "--untuned" in sys.argv
    args = [a for a in sys.argv if a != "--untuned"]
    module, attribute = resolve_switch(args[1])
    shipped = "on" if getattr(module, attribute) else "off"

    def set_mode(mode: str) -> None:
        setattr(module, attribute, mode == "on")

    compare_modes(args[2].split(","), args[3], ["on", "off"], set_mode, shipped=shipped,
                  folders=case_dirs(args[4] if len(args) > 4 else None), options=UNTUNED if untuned else TUNED)


if __name__ == "__main__":
    main()
