"""Stage 3, after the order is set: independent first passes of split reductions share one launch.

A split reduction to one value (compiler/split_reductions.py: a norm, a sum, a loss's mean) runs
a first pass that fills the GPU with programs, each reducing one chunk, then a single program
that reduces the partials. Several of them side by side, the norms of each gradient before a global norm
(`clip_grad_norm_`), each launch once more pays a ramp and a tail with the GPU part idle and, in
a step of many small parameters, a launch per parameter. Where such passes come close together
and none reads what another writes, they become one kernel (`KernelGroup.parts`): its programs
are the passes' programs end to end, and each program runs the part its number falls in, with
that part's own block sizes.

The global norm of a 4096 x 4096 and a 1024 x 4096 float32 gradient and a 4096-element one ran in
three kernels (the two first passes, then the final passes and the clip factor chained,
compiler/single_programs.py): 41.3 us on an H100, 38.9 with the first passes side by side
(Inductor 44.0; 2026-11-28, docs/PERF.md).

A part may run later than its place in the order, past steps that neither read what it writes
nor write what it reads; a step that does closes the run before it.
"""

from __future__ import annotations

from typing import Any

from compiler.dependencies import ReadWrites
from compiler.ir import Program
from compiler.single_programs import gather_runs
from compiler.split_reductions import SPLIT_SUFFIX

COMBINE_SPLIT_PASSES = True  # off: each first pass keeps its own launch (A/B runs)
MAX_PARTS = 16  # a longer run starts a new kernel (a long source compiles slowly)


def combine_split_passes(steps: list, read_writes: dict[str, ReadWrites], program: Program) -> list:
    """`steps` in run order, each run of independent first passes that can move together made one
    kernel group with parts, placed where its last member was."""
    from compiler.scheduler import KernelGroup  # the scheduler calls this module

    if not COMBINE_SPLIT_PASSES:
        return steps
    full = whole_reduction_partials(steps, read_writes)
    return gather_runs(steps, read_writes, lambda step, _: isinstance(step, KernelGroup) and
                       is_first_pass(step, read_writes, full), side_by_side, MAX_PARTS, independent=True)


def whole_reduction_partials(steps: list, read_writes: dict[str, ReadWrites]) -> set[str]:
    """The partials buffers that only single-program kernels read: the splits of reductions to one
    value (a norm, a loss's mean). A column sum's partials, which a pass over the columns reads,
    are left out: such first passes are autotuned each on its own, which parts are not."""
    readers: dict[str, list] = {}
    for step in steps:
        for name in step.node_names:
            for buffer in read_writes[name].read_buffers():
                if buffer.endswith(SPLIT_SUFFIX):
                    readers.setdefault(buffer, []).append(step)
    return {b for b, steps in readers.items() if all(getattr(s, "phases", ()) or getattr(s, "numel", 0) == 1
                                                     for s in steps)}


def is_first_pass(group: Any, read_writes: dict[str, ReadWrites], full: set[str]) -> bool:
    """A plain reduction kernel whose only results are partials of reductions to one value."""
    if not group.is_reduction or group.tiled or group.mix_rows or group.phases or group.parts \
            or group.reverse_programs or group.reread_later:
        return False
    writes = set().union(*(read_writes[n].write_buffers() for n in group.node_names)) - group.internal
    return bool(writes) and writes <= full


def side_by_side(members: list) -> Any:
    """One kernel group whose programs run `members`' programs (its nodes are theirs, in order)."""
    from compiler.scheduler import KernelGroup

    last = members[-1]
    return KernelGroup(f"parts_{last.name}", [n for m in members for n in m.nodes], last.mapping,
                       min(m.order for m in members), max(m.last for m in members),
                       internal=set().union(*(m.internal for m in members)), parts=tuple(members))
