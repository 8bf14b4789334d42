"""Window loads and reductions: a pointwise step that loads one buffer at several offsets (a
pooling backward, a stencil) joins a reduction kernel only when timing says it is faster.

Fused into a reduction, the window's loads repeat at every element the reduction visits, in
the reduction's access order, not the window's. PoolFormer's average-pool backward inside its
GroupNorm backward took 87.8 us as one kernel (H100, 2026-11-27); stored by a pointwise kernel
and reduced after, as Inductor does, 23.7 + 18.8 us (H200). Inductor's rule is the same in
kind: it realizes a pointwise value of many reads before a reduction reads it.

So such a fusion is one that benchmark-driven fusion times (compiler/benchmark_fusion.py).
When it is not timed (no GPU, benchmark-driven fusion off, or its budget spent: a PoolFormer
backward asks about 250 other fusions first), a window of UNTIMED_WINDOW_LOADS or more (a 3x3
window at stride 1) stays out of the reduction. Smaller ones are left to the score: ResNet's
and DenseNet's 3x3 max-pool at stride 2, whose backward gathers from 4 windows, ran 0.19-0.21
ms inside the channels-last BatchNorm backward's reduction against Inductor's 0.30 (H100,
2026-11-27). REFUSE_UNTIMED off lets the score decide every untimed one, for A/B runs.
"""

from __future__ import annotations

from collections import Counter

from compiler.dependencies import MemoryDep, ReadWrites

WINDOW_LOADS = 4  # loads of one buffer at different offsets that make a window (a 2x2 pool has 4)
UNTIMED_WINDOW_LOADS = 9  # a window this large stays out of a reduction when the fusion is not timed
REFUSE_UNTIMED = True
REASON = "a window's loads (pooling, a stencil) stay out of a reduction unless timing says otherwise"


def reads_a_window(nodes: list, read_writes: dict[str, ReadWrites], loads: int = WINDOW_LOADS) -> bool:
    """Whether a pointwise node among `nodes` loads one buffer at `loads` or more offsets."""
    for node in nodes:
        if not node.is_reduction:
            per_buffer = Counter(dep.buffer for dep in read_writes[node.name].reads if isinstance(dep, MemoryDep))
            if any(count >= loads for count in per_buffer.values()):
                return True
    return False


def window_in_reduction(first_nodes: list, second_nodes: list, fused_is_reduction: bool,
                        read_writes: dict[str, ReadWrites], loads: int = WINDOW_LOADS) -> bool:
    """Whether fusing two steps puts a window of `loads` or more loads into a reduction kernel."""
    return fused_is_reduction and any(reads_a_window(nodes, read_writes, loads)
                                      for nodes in (first_nodes, second_nodes))
