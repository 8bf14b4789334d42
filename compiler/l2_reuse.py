"""Stage 3, last: which kernels launch their programs back to front.

A GPU runs a kernel's programs roughly in the order of their ids, so a kernel that walks a buffer
front to back leaves its tail in L2. The next kernel to read that buffer (a BatchNorm's normalize
after its statistics, a norm backward's second pass over its inputs) finds that tail in L2 only if
it starts there: walking front to back it misses the tail and evicts it on the way. So such a
kernel numbers its programs in reverse (`KernelGroup.reverse_programs`), and a third reader goes
forward again. A program's work does not depend on when it runs, so this changes no result.

H100, 2026-11-27, bench/l2_order_probe.py (a column-sum pass, then a pointwise pass over the same
bf16 input): reversing the second pass gained 7 % at 24 MiB, 4 % at 49 MiB, 2 % at 64 MiB and
about 1 % at 100-200 MiB. L2 holds less of the tail than its 50 MB: the second pass's own stores
take room too. On the 43 bench cases the rule changes (bench/switch_ab.py): geomean 1.9 % faster,
21 cases 2-12 % (ResNet's BatchNorm backward over 32x64x56x56: 32.6 -> 28.6 us); EfficientNet's
BatchNorm + SiLU forward 1.6 % slower in both layouts, and one case 6 % slower where benchmark-driven
fusion decided differently in the two compiles (docs/PERF.md).

For the same reason, a looped reduction does not stream out of L2 (evict_first) what a later kernel
reads again (`KernelGroup.reread_later`): in the probe, a first pass with evict_first loads left
the reversed second pass 1 % faster at 49 MiB instead of 4 %; on the 33 bench cases it changes,
geomean 1.4 % faster.

Only what a step of the same graph walked counts: where a graph input was last walked is not known
here, so the first kernel to read one goes front to back. Extern calls are taken to walk front to
back too.
"""

from __future__ import annotations

from compiler.dependencies import ReadWrites, buffers_read_and_written
from compiler.ir import Program

REVERSE_REREADS = True
KEEP_FOR_NEXT_READER = True  # reread_later: no evict_first on what the next reader starts with
# What a kernel rereads must come to this much for its order to matter: less stays in L2 (50 MB on
# an H100) whichever way the kernels walk. H100, 2026-11-27: ResNet's BatchNorm forward over
# 12.8 MB ran 1-2 % slower reversed; its backward, rereading two such tensors, 4-12 % faster.
REREAD_MIN_BYTES = 16 << 20


def plan_l2_reuse(steps: list, read_writes: dict[str, ReadWrites], program: Program) -> None:
    """Set `reverse_programs` on each kernel group of `steps` (in run order) that rereads, mostly,
    what was last walked front to back, and `reread_later` on the kernels whose last walk over a
    buffer the next reader starts from."""
    from compiler.scheduler import KernelGroup  # the scheduler calls this module

    if not REVERSE_REREADS:
        return
    last_walk: dict[str, tuple[object, bool]] = {}  # buffer -> (last step to touch it, front to back?)
    for step in steps:
        reads, writes = buffers_read_and_written(step.node_names, read_writes)
        forward = True  # extern calls, and kernels that reread little
        if isinstance(step, KernelGroup):
            walked = {buffer: last_walk[buffer] for buffer in reads if buffer in last_walk}
            rereads = {True: 0, False: 0}
            for buffer, (_, walked_forward) in walked.items():
                rereads[walked_forward] += program.buffers[buffer].layout.storage_bytes()
            if walked and max(rereads.values()) >= REREAD_MIN_BYTES:
                forward = rereads[False] > rereads[True]  # start where most of it was left
                step.reverse_programs = not forward
                for buffer, (walker, walked_forward) in walked.items():
                    if KEEP_FOR_NEXT_READER and walked_forward != forward and isinstance(walker, KernelGroup):
                        walker.reread_later = walker.reread_later | {buffer}
        for buffer in (reads | writes) - getattr(step, "internal", set()):
            last_walk[buffer] = (step, forward)
