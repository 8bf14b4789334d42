"""Stage 3, last: reorder the scheduled steps where that lowers the plan's peak memory.

The scheduler emits its steps in program order (ties of `topological_order` keep the graph's
order), and that order can keep a big buffer alive across the peak for nothing: a step writes
it, and nobody reads it until after the peak. GPT-2's backward, for one, computed the tied
embedding's weight gradient (74 MiB) before making the padded copy of the weight that the other
GEMM reads, so both were live next to the 786 MiB padded gradient of the logits.

Like Inductor's `reorder_for_peak_memory`, but local and checked: simulate the order's memory
(a buffer is live from the step that first writes it to the last step that touches it; graph
outputs to the end), find the peak, and sink a step that writes a buffer first read after the
peak to just after it; keep the move only when the simulated peak falls. Repeat while moves
help. Graph inputs are not counted: whether one is freed at its last read depends on the caller
(a backward's saved activations are, its incoming gradients are not). A move that makes a step
the last reader of an input, keeping it alive longer, pays that input's bytes out of its gain
as if it were alive at the new peak. Steps that draw from torch's random generator never move:
the draws would change places.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from compiler.dependencies import ReadWrites
from compiler.graph import ITEMSIZES
from compiler.ir import ExternNode, Program

# At most MAX_MOVES x CANDIDATES_PER_PEAK simulations, each linear in the steps: bounded for
# whole-model graphs. Each accepted move lowers the peak; a handful usually suffice.
MAX_MOVES = 16
CANDIDATES_PER_PEAK = 4  # the biggest buffers alive across the peak that nobody reads there
MIN_GAIN_BYTES = 1 << 20  # smaller gains are not worth a changed order


@dataclass
class _StepBuffers:
    touched: set[str]  # buffers the step reads or writes that the plan or an extern call allocates
    written: set[str]
    movable: bool
    inputs: set[str]  # graph inputs it reads


def reorder_for_peak_memory(steps: list, predecessors: dict[str, set[str]], read_writes: dict[str, ReadWrites],
                            program: Program) -> list:
    """`steps` (topologically ordered) with producers sunk past the peak where that lowers it.
    `predecessors`: node name -> the nodes that must run first (scheduler.node_dependencies)."""
    if len(steps) < 3:
        return steps
    sizes = _buffer_bytes(program)
    inputs = {b.name for b in program.inputs}
    info = [_step_buffers(step, read_writes, sizes, inputs) for step in steps]
    step_of = {name: i for i, step in enumerate(steps) for name in step.node_names}
    successors: list[set[int]] = [set() for _ in steps]
    for i, step in enumerate(steps):
        for name in step.node_names:
            for before in predecessors.get(name, ()):
                if step_of[before] != i:
                    successors[step_of[before]].add(i)
    memory = _Memory(sizes, {o.buffer.name for o in program.outputs}, info,
                     {b.name: b.layout.storage_numel() * ITEMSIZES[b.dtype] for b in program.inputs})
    order = list(range(len(steps)))
    peak, at = memory.simulate(order)
    for _ in range(MAX_MOVES):
        moved = _best_sink(order, at, peak, memory, successors)
        if moved is None:
            break
        order, peak, at = moved
    return [steps[i] for i in order]


def _buffer_bytes(program: Program) -> dict[str, int]:
    """Bytes of each buffer the plan allocates or an extern call returns."""
    return {name: buffer.layout.storage_numel() * ITEMSIZES[buffer.dtype]
            for name, buffer in program.buffers.items() if buffer.kind in ("computed", "extern")}


def _step_buffers(step, read_writes: dict[str, ReadWrites], sizes: dict[str, int], inputs: set[str]) -> _StepBuffers:
    touched: set[str] = set()
    written: set[str] = set()
    for name in step.node_names:
        touched |= read_writes[name].read_buffers() | read_writes[name].write_buffers()
        written |= read_writes[name].write_buffers()
    internal = getattr(step, "internal", set())
    node = getattr(step, "node", None)
    random = isinstance(node, ExternNode) and draws_random_numbers(node.target)
    return _StepBuffers({b for b in touched - internal if b in sizes}, {b for b in written - internal if b in sizes},
                        not random, touched & inputs)


@functools.lru_cache(maxsize=None)
def draws_random_numbers(target: str) -> bool:
    """Whether the ATen op draws from torch's generator (tagged nondeterministic_seeded). torch is
    imported here, not with the module: the scheduler stays importable without it."""
    import torch

    from compiler.fx_import import resolve_op

    return torch.Tag.nondeterministic_seeded in resolve_op(target).tags


@dataclass
class _Memory:
    """The memory model of an order: a buffer is live from its first step through the last step
    that touches it (graph outputs: to the end)."""

    sizes: dict[str, int]
    keep_alive: set[str]  # graph outputs
    info: list[_StepBuffers]
    input_sizes: dict[str, int]

    def simulate(self, order: list[int]) -> tuple[int, int]:
        """(peak bytes, position of the first step at the peak) of `order`."""
        first: dict[str, int] = {}
        last: dict[str, int] = {}
        for position, i in enumerate(order):
            for name in self.info[i].touched:
                first.setdefault(name, position)
                last[name] = position
        change = [0] * (len(order) + 1)
        for name, start in first.items():
            change[start] += self.sizes[name]
            if name not in self.keep_alive:
                change[last[name] + 1] -= self.sizes[name]
        live = peak = at = 0
        for position in range(len(order)):
            live += change[position]
            if live > peak:
                peak, at = live, position
        return peak, at


def _best_sink(order: list[int], at: int, peak: int, memory: _Memory,
               successors: list[set[int]]) -> tuple[list[int], int, int] | None:
    """The first of the candidate moves (biggest idle buffer first) that lowers the peak by
    MIN_GAIN_BYTES: (new order, its peak, its peak's position); None when none does."""
    info = memory.info
    position_of = {i: p for p, i in enumerate(order)}
    last_touch: dict[str, int] = {}  # up to the peak
    for position in range(at + 1):
        for name in info[order[position]].touched:
            last_touch[name] = position
    input_last_read: dict[str, int] = {}
    for position, i in enumerate(order):
        for name in info[i].inputs:
            input_last_read[name] = position
    candidates = []
    for position in range(at):
        i = order[position]
        if not info[i].movable or any(position_of[j] <= at for j in successors[i]):
            continue
        idle_bytes = sum(memory.sizes[b] for b in info[i].written if last_touch[b] == position)
        kept_longer = sum(memory.input_sizes[b] for b in info[i].inputs if input_last_read[b] <= at)
        if idle_bytes - kept_longer >= MIN_GAIN_BYTES:
            candidates.append((-idle_bytes, kept_longer, position))
    for _, kept_longer, position in sorted(candidates)[:CANDIDATES_PER_PEAK]:
        moved = order[:position] + order[position + 1:at + 1] + [order[position]] + order[at + 1:]
        new_peak, new_at = memory.simulate(moved)
        if new_peak + kept_longer <= peak - MIN_GAIN_BYTES:
            return moved, new_peak, new_at
    return None
