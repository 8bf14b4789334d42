"""Online softmax A/B on a GPU (compiler/codegen/kernel.py's online_softmax): each bench case
whose name contains one of the given substrings is compiled (autotuned, benchmark-driven fusion
on) with long rows' max and sum of exponentials in one online pass, and with two passes over the
row (a mode's suffix after "_" repeats it: online,twopass,online_2,twopass_2), and timed as
bench/kernels.py times it (a CUDA-graph replay on a cold L2); Inductor and a copy of the same
bytes beside them (bench/side_by_side.py). One JSON row per case.

    python3 bench/online_softmax_ab.py amax_sub_exp,constant_pad_nd out.jsonl [online,twopass]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import compiler.codegen as codegen  # noqa: E402
from bench.side_by_side import compare_modes  # noqa: E402

SHIPPED_MIN_ROW = codegen.ONLINE_SOFTMAX_MIN_ROW


def set_mode(mode: str) -> None:
    """online: every looped row pairs its max and sum; twopass: none does; shipped: the row-length
    threshold decides."""
    codegen.ONLINE_SOFTMAX_MIN_ROW = {"online": 0, "twopass": 1 << 62}.get(mode.split("_")[0], SHIPPED_MIN_ROW)


def main() -> None:
    modes = (sys.argv[3] if len(sys.argv) > 3 else "online,twopass").split(",")
    compare_modes(sys.argv[1].split(","), sys.argv[2], modes, set_mode, shipped="shipped")


if __name__ == "__main__":
    main()
