"""Stage 3, last: reorder the scheduled steps where that lowers the plan's peak memory.

The scheduler emits its steps in program order (ties of `topological_order` keep the graph's
order), and that order can keep a big buffer alive across the peak for nothing. Two shapes:
- a step writes a buffer nobody reads until after the peak. GPT-2's backward computed the tied
  embedding's weight gradient (74 MiB) before making the padded copy of the weight that the other
  GEMM reads, so both were live next to the 786 MiB padded gradient of the logits;
- a step after the peak is the last reader of something alive across it. ViT's backward computed
  the MLP's hidden gradient (37 MiB) before the weight gradient that reads the saved GELU output
  (37 MiB) for the last time, so both were live at once.

Like Inductor's `reorder_for_peak_memory`, but local and checked: simulate the order's memory
(a buffer is live from the step that first writes it to the last step that touches it; graph
outputs to the end), find the peak, and either sink a step of the first shape to just after the
peak or hoist one of the second to just before it; keep the move only when the simulated peak
falls. Repeat while moves help. Graph inputs count only where the caller hands them over
(`released`: a backward's saved activations, dropped after their last read): live from the start
to their last reader. Other inputs stay alive whatever the order, so they do not count. Steps that
draw from torch's random generator never move: the draws would change places.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Iterable

from compiler.dependencies import ReadWrites
from compiler.ir import ExternNode, Program

# At most MAX_MOVES x 2 x CANDIDATES_PER_PEAK simulations, each linear in the steps: bounded for
# whole-model graphs. Each accepted move lowers the peak; a handful usually suffice.
MAX_MOVES = 16
CANDIDATES_PER_PEAK = 4  # the biggest gains first
MIN_GAIN_BYTES = 1 << 20  # smaller gains are not worth a changed order


@dataclass
class _StepBuffers:
    touched: set[str]  # buffers the step reads or writes that the model counts
    written: set[str]
    movable: bool


def reorder_for_peak_memory(steps: list, predecessors: dict[str, set[str]], read_writes: dict[str, ReadWrites],
                            program: Program, released: frozenset[str] = frozenset()) -> list:
    """`steps` (topologically ordered), with steps moved across the peak where that lowers it.
    `predecessors`: node name -> the nodes that must run first (scheduler.node_dependencies);
    `released`: the input buffers the caller drops after their last read."""
    if len(steps) < 3:
        return steps
    sizes = _buffer_bytes(program, released)
    info = [_step_buffers(step, read_writes, sizes) for step in steps]
    step_of = {name: i for i, step in enumerate(steps) for name in step.node_names}
    needs: list[set[int]] = [set() for _ in steps]
    for i, step in enumerate(steps):
        for name in step.node_names:
            needs[i] |= {step_of[before] for before in predecessors.get(name, ())} - {i}
    needed_by: list[set[int]] = [set() for _ in steps]
    for i, before in enumerate(needs):
        for j in before:
            needed_by[j].add(i)
    memory = _Memory(sizes, {o.buffer.name for o in program.outputs}, set(released), info)
    order = list(range(len(steps)))
    peak, at = memory.simulate(order)
    for _ in range(MAX_MOVES):
        moves = [move for move in (_best_sink(order, at, peak, memory, needed_by),
                                   _best_hoist(order, at, peak, memory, needs)) if move is not None]
        if not moves:
            break
        order, peak, at = min(moves, key=lambda move: move[1])
    return [steps[i] for i in order]


def _buffer_bytes(program: Program, released: frozenset[str]) -> dict[str, int]:
    """Bytes of each buffer the model counts: what the plan allocates or an extern call returns,
    and the released inputs."""
    return {name: buffer.layout.storage_bytes()
            for name, buffer in program.buffers.items()
            if buffer.kind in ("computed", "extern", "uninitialized") or name in released}


def _step_buffers(step, read_writes: dict[str, ReadWrites], sizes: dict[str, int]) -> _StepBuffers:
    touched: set[str] = set()
    written: set[str] = set()
    for name in step.node_names:
        touched |= read_writes[name].read_buffers() | read_writes[name].write_buffers()
        written |= read_writes[name].write_buffers()
    internal = getattr(step, "internal", set())
    node = getattr(step, "node", None)
    random = isinstance(node, ExternNode) and draws_random_numbers(node.target)
    return _StepBuffers({b for b in touched - internal if b in sizes}, {b for b in written - internal if b in sizes},
                        not random)


@functools.lru_cache(maxsize=None)
def draws_random_numbers(target: str) -> bool:
    """Whether the ATen op draws from torch's generator (tagged nondeterministic_seeded). torch is
    imported here, not with the module: the scheduler stays importable without it."""
    import torch

    from compiler.fx_import import resolve_op

    return torch.Tag.nondeterministic_seeded in resolve_op(target).tags


@dataclass
class _Memory:
    """The memory model of an order: a buffer is live from its first step (released inputs: from
    the start) through the last step that touches it (graph outputs: to the end)."""

    sizes: dict[str, int]
    keep_alive: set[str]  # graph outputs
    from_start: set[str]  # released inputs
    info: list[_StepBuffers]

    def spans(self, order: list[int]) -> tuple[dict[str, int], dict[str, int]]:
        """(first position, last position) of each buffer the order touches."""
        first: dict[str, int] = {}
        last: dict[str, int] = {}
        for position, i in enumerate(order):
            for name in self.info[i].touched:
                first.setdefault(name, 0 if name in self.from_start else position)
                last[name] = position
        return first, last

    def simulate(self, order: list[int]) -> tuple[int, int]:
        """(peak bytes, position of the first step at the peak) of `order`."""
        first, last = self.spans(order)
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


Move = tuple[list[int], int, int]  # (new order, its peak, its peak's position)


def _best_sink(order: list[int], at: int, peak: int, memory: _Memory, needed_by: list[set[int]]) -> Move | None:
    """The first of the candidate sinks (biggest idle buffers first) that lowers the peak by
    MIN_GAIN_BYTES: a step before the peak whose results nobody touches again up to it moves to
    just after it. None when none does."""
    info = memory.info
    position_of = {i: p for p, i in enumerate(order)}
    _, last_touch = memory.spans(order[:at + 1])
    candidates = []
    for position in range(at):
        i = order[position]
        if not info[i].movable or any(position_of[j] <= at for j in needed_by[i]):
            continue
        idle_bytes = sum(memory.sizes[b] for b in info[i].written - memory.from_start if last_touch[b] == position)
        if idle_bytes >= MIN_GAIN_BYTES:
            candidates.append((-idle_bytes, position))
    return _first_lowering((order[:position] + order[position + 1:at + 1] + [order[position]] + order[at + 1:]
                            for _, position in sorted(candidates)[:CANDIDATES_PER_PEAK]), memory, peak)


def _best_hoist(order: list[int], at: int, peak: int, memory: _Memory, needs: list[set[int]]) -> Move | None:
    """The first of the candidate hoists (most bytes freed first) that lowers the peak by
    MIN_GAIN_BYTES: a step after the peak, all of whose dependencies run before it, that is the
    last to touch buffers alive across the peak moves to just before the peak. None when none does."""
    info = memory.info
    position_of = {i: p for p, i in enumerate(order)}
    first, last = memory.spans(order)
    candidates = []
    for position in range(at + 1, len(order)):
        i = order[position]
        if not info[i].movable or any(position_of[j] >= at for j in needs[i]):
            continue
        freed = sum(memory.sizes[b] for b in info[i].touched
                    if last[b] == position and first[b] <= at and b not in memory.keep_alive)
        allocated = sum(memory.sizes[b] for b in info[i].touched if first[b] == position)
        if freed - allocated >= MIN_GAIN_BYTES:
            candidates.append((allocated - freed, position))
    return _first_lowering((order[:at] + [order[position]] + order[at:position] + order[position + 1:]
                            for _, position in sorted(candidates)[:CANDIDATES_PER_PEAK]), memory, peak)


def _first_lowering(orders: Iterable[list[int]], memory: _Memory, peak: int) -> Move | None:
    """The first of `orders` whose simulated peak is at least MIN_GAIN_BYTES below `peak`."""
    for moved in orders:
        move = (moved, *memory.simulate(moved))
        if move[1] <= peak - MIN_GAIN_BYTES:
            return move
    return None
