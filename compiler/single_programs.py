"""Stage 3, after the order is set: single-program kernels share one launch, one after another.

A kernel with one output element (the final pass of a full reduction, a global norm, a loss's
mean, scalar bookkeeping) runs as one program of a few microseconds, and each such launch costs
as much again: a gap on the GPU between dependent kernels, and the runtime's launch on the host.
Where several come close together, they become one kernel (`KernelGroup.phases`) whose single
program runs each of them in turn, a barrier between phases so that a phase reads what the ones
before it stored (one block: its threads see each other's global stores after the barrier).

`clip_grad_norm_` before AdamW: the final passes of two split norms, a small parameter's norm, and
the norm of their stack with the clip factor were four launches; now one (H200, 2026-11-27: the
case 35.3 -> 31.9 us, Inductor 35.2; docs/PERF.md). Inductor runs the final passes with the last
sum in one kernel there; this does the same for any run of single-program kernels, whatever their
shapes.

A phase may run later than its place in the order, past steps that neither read what it writes
nor write what it reads; a step that does closes the chain before it.
"""

from __future__ import annotations

from typing import Any, Callable

from compiler.dependencies import ReadWrites, buffers_read_and_written
from compiler.ir import Program

CHAIN_SINGLE_PROGRAMS = True
MAX_PHASES = 16  # a longer chain starts a new kernel (a long source compiles slowly)
# A phase's buffers, whole, at most this much: a phase that moves later keeps its inputs alive
# until then, which must cost nothing worth counting.
PHASE_MAX_BYTES = 1 << 20


def chain_single_programs(steps: list, read_writes: dict[str, ReadWrites], program: Program) -> list:
    """`steps` in run order, each run of single-program kernels that can move together made one
    kernel group with phases, placed where its last member was."""
    from compiler.scheduler import KernelGroup  # the scheduler calls this module

    if not CHAIN_SINGLE_PROGRAMS:
        return steps
    return gather_runs(steps, read_writes, lambda step, touched: isinstance(step, KernelGroup) and
                       is_single_program(step, touched, program), chained, MAX_PHASES, independent=False)


def gather_runs(steps: list, read_writes: dict[str, ReadWrites], is_member: Callable[[Any, set[str]], bool],
                build: Callable[[list], Any], most: int, independent: bool) -> list:
    """`steps` in run order, each run of members (`is_member(step, buffers it touches)`) that can
    move together made one step by `build`, placed where the run's last member was; a run of one
    stays where it was. A step that reads what the run writes, or writes what it reads or writes,
    closes the run before it. `independent`: a member may not read what earlier members write
    either (the built step runs them side by side, not in turn)."""
    ordered: list = []
    run: list = []
    run_reads: set[str] = set()
    run_writes: set[str] = set()
    start = 0  # where the run's first member stood in `ordered`

    def close() -> None:
        if len(run) > 1:
            ordered.append(build(list(run)))
        elif run:
            ordered.insert(start, run[0])
        run.clear()
        run_reads.clear()
        run_writes.clear()

    for step in steps:
        reads, writes = buffers_read_and_written(step.node_names, read_writes)
        conflicts = bool(reads & run_writes or writes & (run_reads | run_writes))
        if is_member(step, reads | writes):
            if len(run) == most or (independent and conflicts):
                close()
            if not run:
                start = len(ordered)
            run.append(step)
            run_reads.update(reads)
            run_writes.update(writes)
            continue
        if run and conflicts:
            close()
        ordered.append(step)
    close()
    return ordered


def is_single_program(group: Any, touched: set[str], program: Program) -> bool:
    """A kernel group of one output element that moves little and is no special kind of kernel."""
    if group.numel != 1 or group.tiled or group.mix_rows or group.phases or group.parts:
        return False
    return sum(program.buffers[b].layout.storage_bytes() for b in touched) <= PHASE_MAX_BYTES


def chained(members: list) -> Any:
    """One kernel group that runs `members` in turn (its nodes are theirs, in order)."""
    from compiler.scheduler import KernelGroup

    last = members[-1]
    return KernelGroup(f"chain_{last.name}", [n for m in members for n in m.nodes], last.mapping,
                       min(m.order for m in members), max(m.last for m in members),
                       internal=set().union(*(m.internal for m in members)), phases=tuple(members))

