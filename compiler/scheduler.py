"""Stage 3: order the program's nodes, fuse them into kernels, and say why not.

Following the seed scheduler: every IR node becomes a scheduler node with its read and
write dependencies; ordering edges come from data (read after write) and from
mutation (a write after earlier reads and writes of the same buffer). Dead nodes are
dropped. Fusion then runs in rounds: candidate pairs are nodes that share a buffer
(vertical: one writes what the other reads; horizontal: both read it); `can_fuse`
refuses extern nodes, groups past the size limit, fusions that would create a cycle
and groups whose loops cannot share one kernel (`loop_mapping`); the legal pairs are
taken best first by `FusionState.score` (bytes saved, then proximity). Every refusal is
recorded as a `WhyNoFuse` line for the manifest and `fusewire explain`. After the rounds, a
column sum's partial pass joins the row reduction over the same rows (`fuse_mixed_orders`,
compiler/mixed_order.py). The fused steps, in program order, are last reordered where that
lowers the peak memory (`memory_order`), and a kernel that rereads what an earlier one walked
numbers its programs back to front, to start where L2 still holds it (`l2_reuse`).

Whole-model graphs have tens of thousands of nodes, so nothing here walks the whole graph
per pair or per fusion: the dependencies between steps live in a `StepGraph` whose ranks
stay topological as steps merge (a cycle check looks only between the two steps), the
pairs of a round are numpy arrays (`fusion_candidates`), and the pairs of a buffer's users
with a third user between them are never listed: they would close a cycle, so they were
refused anyway (the manifest's `refused` list leaves them out).
"""

from __future__ import annotations

import copy
import heapq
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler.dependencies import MemoryDep, ReadWrites, extract_read_writes
from compiler.fusion_candidates import Candidates
from compiler.fusion_graph import StepGraph
from compiler.gc_pause import paused_gc
from compiler.ir import ComputeNode, ExternNode, Node, Program
from compiler.loop_mapping import FusionRefused, GroupMapping, map_group
from compiler.memory_order import draws_random_numbers, reorder_for_peak_memory
from compiler import mixed_order
from compiler.mixed_order import is_column_pass, is_row_pass, mix_chunk, mixed_group_mapping
from compiler.options import CompileOptions
from compiler.l2_reuse import plan_l2_reuse
from compiler.inline_gathers import (
    TRANSPOSED_TRIAL, gathered_producers, inline_gathered_producers, inline_transposed_producers, transposed_producers,
)
from compiler.split_reductions import split_reductions
from compiler.paired_lanes import choose_lanes
from compiler.unrolled_lanes import Unrolled, choose_unrolled
from compiler.parallel_passes import combine_split_passes
from compiler.pointwise_order import choose_pointwise_layout
from compiler.reduction_order import order_reduced_dims
from compiler.row_order import choose_row_order
from compiler.single_programs import chain_single_programs
from compiler.strided_fusion import strided_in_reduction
from compiler import window_fusion
from compiler.window_fusion import window_in_reduction

MAX_FUSION_ROUNDS = 10
# A kernel moving less than this costs more in its launch (a few microseconds) than in its bytes:
# small kernels of the same shape fuse even when they share no buffer (`fuse_small_siblings`),
# when no more than SIBLING_DISTANCE nodes apart in program order (a far one would hold back the
# earlier one's readers, and what they would have freed).
SMALL_KERNEL_BYTES = 1 << 20
SIBLING_DISTANCE = 64
# Below this many pairs among one buffer's users (or twice the steps between the first and the
# last user), listing them all costs less than finding the ones a third user lies between.
PAIRS_WITHOUT_PRUNING = 64


@dataclass(frozen=True)
class WhyNoFuse:
    node1: str
    node2: str
    reason: str

    def to_json(self) -> dict:
        return {"node1": self.node1, "node2": self.node2, "reason": self.reason}


@dataclass
class KernelGroup:
    """Compute nodes that become one kernel (a FusedSchedulerNode once it holds several)."""

    name: str
    nodes: list[ComputeNode]
    mapping: GroupMapping
    order: int  # position of its first node in program order
    last: int  # position of its last node
    internal: set[str] = field(default_factory=set)  # written here, read nowhere else: never allocated
    tiled: bool = False  # a pointwise group walked in 2D tiles (mapping: xindex over rows, rindex over columns)
    lanes: bool = False  # tiled in pairs of outputs whose strided reads load aligned runs (compiler.paired_lanes)
    unrolled: Unrolled | None = None  # cells of outputs that share reads, one a point (compiler.unrolled_lanes)
    row_block: int = 1  # rows a program needs at least (compiler.row_order: accesses contiguous across rows)
    mix_rows: int = 0  # a mixed-order kernel's rows per program (compiler.mixed_order); 0: not one
    column_nodes: frozenset[str] = frozenset()  # a mixed-order kernel's reductions along its columns
    reverse_programs: bool = False  # programs numbered back to front (compiler.l2_reuse)
    reread_later: frozenset[str] = frozenset()  # buffers the next reader starts where this kernel ends
    phases: tuple["KernelGroup", ...] = ()  # single-program kernels run in turn in one launch (compiler.single_programs)
    parts: tuple["KernelGroup", ...] = ()  # independent first passes side by side in one launch (compiler.parallel_passes)

    @property
    def numel(self) -> int:
        return self.mapping.numel

    @property
    def rnumel(self) -> int:
        return self.mapping.rnumel

    @property
    def is_reduction(self) -> bool:
        return any(n.is_reduction for n in self.nodes)

    @property
    def node_names(self) -> list[str]:
        return [n.name for n in self.nodes]


@dataclass
class ExternStep:
    node: ExternNode
    order: int

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def last(self) -> int:
        return self.order

    @property
    def node_names(self) -> list[str]:
        return [self.node.name]


Step = KernelGroup | ExternStep


@dataclass
class Schedule:
    program: Program
    steps: list[Step]
    read_writes: dict[str, ReadWrites]
    fusion_log: dict


@paused_gc
def schedule(program: Program, options: CompileOptions, judge: Any = None) -> Schedule:
    """`judge(first, second, fused, read_writes, program)`, when given (a GPU worker's
    compiler.benchmark_fusion.FusionBenchmarker), may overrule a legal fusion: it returns None
    (no opinion) or (keep, record) after timing the fused kernel against its parts. With a judge,
    a program with transposed producers (inline_gathers.transposed_producers) is also scheduled with
    them inlined before its reductions are split, and `judge.pick_schedule` keeps that one only when
    it is faster; and a program whose gathered results could be recomputed (inline_gathers) is
    scheduled both ways and `judge.pick_schedule(recomputed, stored, producers)` keeps the faster."""
    transposed = [n.name for n in transposed_producers(program)] if judge is not None else []
    if transposed:
        inlined = copy.deepcopy(program)
        inline_transposed_producers(inlined)
        return judge.pick_schedule(_split_and_fuse(inlined, options, judge), _split_and_fuse(program, options, judge),
                                   transposed, TRANSPOSED_TRIAL, prefer_recomputed=False)
    return _split_and_fuse(program, options, judge)


def _split_and_fuse(program: Program, options: CompileOptions, judge: Any) -> Schedule:
    order_reduced_dims(program)
    split_reductions(program)
    producers = [n.name for n in gathered_producers(program)] if judge is not None else []
    if producers:  # recompute or store: schedule both ways, time both
        stored = copy.deepcopy(program)
        recomputed = _fuse_and_order(program, options, judge, inline_gathered_producers(program))
        return judge.pick_schedule(recomputed, _fuse_and_order(stored, options, judge), producers)
    return _fuse_and_order(program, options, judge, inline_gathered_producers(program))


def _fuse_and_order(program: Program, options: CompileOptions, judge: Any,
                    read_writes: dict[str, ReadWrites] | None = None) -> Schedule:
    """`read_writes`: every node's dependencies, when already extracted for the program as it is."""
    if read_writes is None:
        read_writes = {node.name: extract_read_writes(node) for node in program.nodes}
    live = eliminate_dead_nodes(program, read_writes)
    read_writes = {node.name: read_writes[node.name] for node in live}  # dead nodes read nothing any more
    predecessors = node_dependencies(live, read_writes)
    steps: list[Step] = [_single_step(node, program_order(node.name), read_writes) for node in live]
    log = FusionLog()
    log.benchmark_note = ("uncertain fusions timed on the GPU" if judge is not None
                          else "the score decided every fusion (no GPU, or benchmark_fusion off)")
    if options.fusion:
        steps = fuse_nodes(steps, predecessors, read_writes, program, options, log, judge)
    steps = topological_order(steps, predecessors)
    mark_internal_buffers(steps, read_writes, program)
    released = frozenset(program.inputs[i].name for i in options.released_inputs)
    steps = reorder_for_peak_memory(steps, predecessors, read_writes, program, released)
    itemsize = program.buffer_itemsizes()
    for step in steps:
        if isinstance(step, KernelGroup):
            laid_out = choose_pointwise_layout(step.nodes, step.mapping, read_writes, itemsize, step.internal)
            if laid_out is not None:
                step.mapping, step.tiled = laid_out
            paired = None if step.tiled else choose_lanes(step.nodes, step.mapping, read_writes, step.internal,
                                                          program.buffers)
            if paired is not None:
                step.mapping, step.tiled, step.lanes = paired, True, True
            unrolled = None if step.tiled else choose_unrolled(step.nodes, step.mapping, read_writes, step.internal)
            if unrolled is not None:
                step.mapping, step.unrolled = unrolled.mapping, unrolled
            reordered = None if step.mix_rows else choose_row_order(step.nodes, step.mapping, read_writes,
                                                                    itemsize, step.internal)
            if reordered is not None:
                step.mapping, step.row_block = reordered
    plan_l2_reuse(steps, read_writes, program)
    steps = chain_single_programs(steps, read_writes, program)  # first: it moves final passes out of the way
    steps = combine_split_passes(steps, read_writes, program)
    for i, step in enumerate(s for s in steps if isinstance(s, KernelGroup)):
        step.name = kernel_name(step, i, program.origin_ops)
    return Schedule(program, steps, read_writes, log.to_json(steps, options))


# ops that only re-view their input: they say nothing about what a kernel computes
VIEW_OPS = frozenset({"view", "reshape", "_unsafe_view", "permute", "expand", "t", "transpose", "unsqueeze",
                      "squeeze", "slice", "select", "alias", "as_strided", "clone", "contiguous", "detach"})
NAME_OPS = 4  # ops named at most, as Inductor's names do (longer names are hard to read in a profile)


def kernel_name(group: KernelGroup, position: int, origin_ops: dict[str, str]) -> str:
    """A name a profiler user can read, like Inductor's: fw_{poi|red}_fused_<ops>_<position>,
    the ATen ops the kernel's nodes came from in program order ("fw_red_fused_native_layer_norm_3")."""
    ops: list[str] = []
    for node in group.nodes:
        for origin in node.origins:
            op = origin_ops.get(origin, "").strip("_")
            if op and op not in VIEW_OPS and op not in ops:
                ops.append(op)
    kind = "red" if group.is_reduction else "poi"
    fused = "_".join(ops[:NAME_OPS]) or "copy"
    return f"fw_{kind}_fused_{fused}_{position}"


def _single_step(node: Node, order: int, read_writes: dict[str, ReadWrites]) -> Step:
    if isinstance(node, ExternNode):
        return ExternStep(node, order)
    return KernelGroup(node.name, [node], map_group([node], read_writes), order, order)


# ---------------------------------------------------------------------------------
# Dependencies, dead nodes, order
# ---------------------------------------------------------------------------------


def eliminate_dead_nodes(program: Program, read_writes: dict[str, ReadWrites]) -> list[Node]:
    """Drops nodes whose writes nobody reads; keeps outputs, input mutations, mutating externs and
    externs that return nothing (checks such as _linalg_check_errors, called for what they raise)."""
    needed = {o.buffer.name for o in program.outputs}
    inputs = {b.name for b in program.inputs}
    kept: list[Node] = []
    for node in reversed(program.nodes):
        writes = read_writes[node.name].write_buffers()
        if writes & needed or writes & inputs or (isinstance(node, ExternNode) and (node.mutated or not node.outputs)):
            kept.append(node)
            needed |= read_writes[node.name].read_buffers()
    return kept[::-1]


def node_dependencies(nodes: list[Node], read_writes: dict[str, ReadWrites]) -> dict[str, set[str]]:
    """For each node, the nodes that must run before it (data and mutation order, and the order
    of ATen calls that draw from torch's generator: swapped, they would draw each other's numbers)."""
    last_writer: dict[str, str] = {}
    readers_since_write: dict[str, set[str]] = {}
    predecessors: dict[str, set[str]] = {}
    last_draw: str | None = None
    for node in nodes:
        rw = read_writes[node.name]
        before: set[str] = set()
        if isinstance(node, ExternNode) and draws_random_numbers(node.target):
            if last_draw is not None:
                before.add(last_draw)
            last_draw = node.name
        for buffer in rw.read_buffers():
            if buffer in last_writer:
                before.add(last_writer[buffer])
        for buffer in rw.write_buffers():
            if buffer in last_writer:
                before.add(last_writer[buffer])  # write after write
            before |= readers_since_write.get(buffer, set())  # write after read
        before.discard(node.name)
        predecessors[node.name] = before
        for buffer in rw.read_buffers():
            readers_since_write.setdefault(buffer, set()).add(node.name)
        for buffer in rw.write_buffers():
            last_writer[buffer] = node.name
            readers_since_write[buffer] = set()
    return predecessors


def topological_order(steps: list[Step], predecessors: dict[str, set[str]]) -> list[Step]:
    """Steps ordered so every dependency runs first; ties keep program order (of all the steps
    whose dependencies have run, the one with the earliest first node runs next)."""
    step_of = {name: i for i, step in enumerate(steps) for name in step.node_names}
    waiting = [0] * len(steps)
    successors: list[set[int]] = [set() for _ in steps]
    for i, step in enumerate(steps):
        needs = {step_of[p] for n in step.node_names for p in predecessors[n]} - {i}
        waiting[i] = len(needs)
        for before in needs:
            successors[before].add(i)
    ready = [(step.order, i) for i, step in enumerate(steps) if not waiting[i]]
    heapq.heapify(ready)
    ordered: list[Step] = []
    while ready:
        _, i = heapq.heappop(ready)
        ordered.append(steps[i])
        for after in successors[i]:
            waiting[after] -= 1
            if not waiting[after]:
                heapq.heappush(ready, (steps[after].order, after))
    if len(ordered) != len(steps):
        raise AssertionError("fusion produced a cycle")  # can_fuse prevents this
    return ordered


# ---------------------------------------------------------------------------------
# Fusion
# ---------------------------------------------------------------------------------


class FusionLog:
    def __init__(self) -> None:
        self.fused: list[dict] = []
        self.refused: dict[tuple[str, str], WhyNoFuse] = {}
        self.benchmarked: list[dict] = []  # fusions decided by timing, with both timings
        self.benchmark_note = ""

    def refuse(self, a: Step, b: Step, reason: str) -> None:
        self.refused[(a.name, b.name)] = WhyNoFuse(a.name, b.name, reason)

    def to_json(self, steps: list[Step], options: CompileOptions) -> dict:
        final = {name for s in steps if isinstance(s, KernelGroup) and len(s.nodes) > 1 for name in s.node_names}
        group_of = {name: i for i, s in enumerate(steps) for name in s.node_names}
        return {
            "enabled": options.fusion,
            "groups": [{"kernel": s.name, "nodes": s.node_names, "numel": s.numel, "rnumel": s.rnumel}
                       for s in steps if isinstance(s, KernelGroup)],
            "fused": self.fused,
            "benchmarked": self.benchmarked,
            "benchmark_note": self.benchmark_note,
            # a pair refused in one round may still end up together through others: keep the informative ones
            "refused": [w.to_json() for w in self.refused.values() if not ({w.node1, w.node2} <= final and
                                                                         group_of[w.node1] == group_of[w.node2])],
        }


def fuse_nodes(steps: list[Step], predecessors: dict[str, set[str]], read_writes: dict[str, ReadWrites],
               program: Program, options: CompileOptions, log: FusionLog, judge: Any = None) -> list[Step]:
    state = FusionState(steps, predecessors, read_writes, program)
    for _ in range(MAX_FUSION_ROUNDS):
        steps, candidates = state.round_candidates()
        dead = np.zeros(len(steps), dtype=bool)  # fused this round
        changed = False
        for i, j in candidates.live_pairs(dead):
            first, second = steps[i], steps[j]
            reason, group = can_fuse(first, second, state.graph, read_writes, options)
            if group is not None:
                reason = state.strided_refusal(first, second, group, program)
                group = None if reason else group
            if group is None:
                log.refuse(first, second, reason)
                continue
            verdict = judge(first, second, group, read_writes, program) if judge is not None else None
            if verdict is not None:
                keep, record = verdict
                log.benchmarked.append(record)
                if not keep:
                    log.refuse(first, second, record["reason"])
                    continue
            elif window_fusion.REFUSE_UNTIMED and window_in_reduction(first.nodes, second.nodes, group.is_reduction,
                                                                       read_writes, window_fusion.UNTIMED_WINDOW_LOADS):
                log.refuse(first, second, window_fusion.REASON)
                continue
            log.fused.append({"node1": first.name, "node2": second.name,
                              "bytes_saved": state.score(first, second)[0]})
            state.replace(first, second, group)
            dead[i] = dead[j] = True
            changed = True
        if not changed:
            break
    fuse_mixed_orders(state, read_writes, program, options, log, judge)
    fuse_small_siblings(state, read_writes, options, log)
    return state.steps()


def fuse_mixed_orders(state: "FusionState", read_writes: dict[str, ReadWrites], program: Program,
                      options: CompileOptions, log: "FusionLog", judge: Any = None) -> None:
    """Runs each column sum's partial pass inside the row reduction over the same rows
    (compiler.mixed_order), once the rounds have fused everything else: a mixed kernel takes no
    further fusion but other column passes over its rows (Swin-v2's LayerNorm backward: its weight
    and bias sums, and the sum of its input gradient over the rows that the next layer's bias
    takes). Pairs are found by size: a row group of N rows x C and a column group of
    (N / CH) * C outputs of CH rows each, CH = mix_chunk(N, C) (split_reductions split the column
    sums to that size)."""
    columns: dict[tuple[int, int], list[KernelGroup]] = {}
    for step in state.steps():
        if isinstance(step, KernelGroup) and is_column_pass(step):
            columns.setdefault((step.numel, step.rnumel), []).append(step)
    for row in [s for s in state.steps() if isinstance(s, KernelGroup) and is_row_pass(s)]:
        chunk = mix_chunk(row.numel, row.rnumel)  # split_reductions cut the column sums to fit it
        partners = columns.get(((row.numel // chunk) * row.rnumel, chunk), []) if chunk else []
        for column in partners:
            if column is row or not state.is_alive(row, column) or not state.accessed[id(column)] & state.accessed[id(row)]:
                continue
            group = _mixed_group(row, column, chunk, state, read_writes, log)
            verdict = judge(row, column, group, read_writes, program) if judge and group else None
            if verdict is not None:
                log.benchmarked.append(verdict[1])
                if not verdict[0]:
                    log.refuse(row, column, verdict[1]["reason"])
                    continue
            if group is not None:
                log.fused.append({"node1": row.name, "node2": column.name, "bytes_saved": state.score(row, column)[0]})
                state.replace(row, column, group)
                _fuse_final_passes(state, group, read_writes, options, log)
                if not mixed_order.SEVERAL_COLUMN_PASSES:
                    break
                row = group  # another column pass over the same rows joins the mixed kernel too


def _fuse_final_passes(state: "FusionState", mixed: KernelGroup, read_writes: dict[str, ReadWrites],
                       options: CompileOptions, log: "FusionLog") -> None:
    """One kernel for the final passes over a mixed kernel's partial column sums (a LayerNorm's
    weight and bias gradients): they share no buffer, so the rounds never paired them."""
    partials = set().union(*(read_writes[n].write_buffers() for n in mixed.column_nodes))
    by_shape: dict[tuple[int, int], list[KernelGroup]] = {}
    for step in sorted(state.steps(), key=lambda s: s.order):
        if isinstance(step, KernelGroup) and step is not mixed and \
                any(read_writes[n].read_buffers() & partials for n in step.node_names):
            by_shape.setdefault((step.numel, step.rnumel), []).append(step)
    for finals in by_shape.values():
        _fuse_in_turn(finals, state, read_writes, options, log)


def _mixed_group(row: KernelGroup, column: KernelGroup, chunk: int, state: "FusionState",
                 read_writes: dict[str, ReadWrites], log: "FusionLog") -> KernelGroup | None:
    if state.graph.creates_cycle(id(row), id(column)):
        log.refuse(row, column, "fusing would create a cycle: a path leaves the group and re-enters it")
        return None
    try:
        mapping = mixed_group_mapping(row, column, chunk, read_writes)
    except FusionRefused as why:
        log.refuse(row, column, str(why))
        return None
    nodes = sorted(row.nodes + column.nodes, key=lambda n: program_order(n.name))
    return KernelGroup(f"{row.name}+{column.name}", nodes, mapping, min(row.order, column.order),
                       max(row.last, column.last), mix_rows=chunk,
                       column_nodes=row.column_nodes | {n.name for n in column.nodes if n.is_reduction})


def fuse_small_siblings(state: "FusionState", read_writes: dict[str, ReadWrites], options: CompileOptions,
                        log: "FusionLog") -> None:
    """One launch for small kernels of the same shape that share no buffer, which the rounds
    never pair: the final passes of reductions that were split together (a BatchNorm backward's
    sums of per-chunk partial results, four kernels of 128 channels x 4)."""
    by_shape: dict[tuple[int, int], list[KernelGroup]] = {}
    for step in sorted(state.steps(), key=lambda s: s.order):
        if isinstance(step, KernelGroup) and state.moved_bytes(step) <= SMALL_KERNEL_BYTES:
            by_shape.setdefault((step.numel, step.rnumel), []).append(step)
    for siblings in by_shape.values():
        _fuse_in_turn(siblings, state, read_writes, options, log,
                      lambda current, step: "too far apart" if step.order - current.last > SIBLING_DISTANCE else "")


def _fuse_in_turn(steps: list[KernelGroup], state: "FusionState", read_writes: dict[str, ReadWrites],
                  options: CompileOptions, log: "FusionLog", refusal: Any = lambda current, step: "") -> None:
    """Fuses each of `steps` (in order) into the group the steps before it made, where `refusal`
    (a reason, or "") and can_fuse allow; a step that cannot join starts the next group."""
    current = steps[0]
    for step in steps[1:]:
        why = refusal(current, step)
        _, group = (why, None) if why else can_fuse(current, step, state.graph, read_writes, options)
        if group is None:
            current = step
            continue
        log.fused.append({"node1": current.name, "node2": step.name, "bytes_saved": 0})
        state.replace(current, step, group)
        current = group


class FusionState:
    """The steps while fusion runs: in the order the candidate search walks them (a fused group
    goes last), each step's buffers, and the dependency graph between steps (`StepGraph`)."""

    def __init__(self, steps: list[Step], predecessors: dict[str, set[str]], read_writes: dict[str, ReadWrites],
                 program: Program) -> None:
        self.read_writes = read_writes
        self.itemsize = program.buffer_itemsizes()
        self.readers = buffer_readers(read_writes)
        self.bytes = program.buffer_bytes()
        self.alive: dict[int, Step] = {id(s): s for s in steps}
        self.touched: dict[int, list[str]] = {}  # buffers read or written, in name order
        self.accessed: dict[int, frozenset[str]] = {}  # buffers accessed through an index (MemoryDeps)
        self.kept: dict[int, Step] = {}  # every step described above stays referenced: ids are never reused
        for step in steps:
            self._describe(step)
        step_of = {name: id(s) for s in steps for name in s.node_names}
        edges = ((step_of[p], step_of[n]) for n in step_of for p in predecessors[n] if p in step_of)
        self.graph = StepGraph(self.alive, edges, {id(s): s.order for s in steps})

    def _describe(self, step: Step) -> None:
        touched: set[str] = set()
        accessed: set[str] = set()
        for name in step.node_names:
            rw = self.read_writes[name]
            touched |= rw.read_buffers() | rw.write_buffers()
            accessed |= {d.buffer for d in rw.reads | rw.writes if isinstance(d, MemoryDep)}
        self.touched[id(step)], self.accessed[id(step)] = sorted(touched), frozenset(accessed)
        self.kept[id(step)] = step

    def steps(self) -> list[Step]:
        return list(self.alive.values())

    def is_alive(self, *steps: Step) -> bool:
        """Whether none of `steps` was fused away."""
        return all(id(s) in self.alive for s in steps)

    def replace(self, first: Step, second: Step, group: KernelGroup) -> None:
        del self.alive[id(first)], self.alive[id(second)]
        self.alive[id(group)] = group
        self.touched[id(group)] = sorted(set(self.touched[id(first)]) | set(self.touched[id(second)]))
        self.accessed[id(group)] = self.accessed[id(first)] | self.accessed[id(second)]
        self.kept[id(group)] = group
        self.graph.merge(id(first), id(second), id(group))

    def moved_bytes(self, step: Step) -> int:
        return sum(self.bytes[b] for b in self.touched[id(step)])

    def strided_refusal(self, first: Step, second: Step, group: KernelGroup, program: Program) -> str:
        """Why a pointwise step should stay out of the reduction kernel it would join (compiler.strided_fusion)."""
        if not group.is_reduction or first.is_reduction == second.is_reduction:
            return ""
        pointwise = first if second.is_reduction else second
        internal = internal_buffers(group.node_names, self.read_writes, program, self.readers)
        return strided_in_reduction(set(pointwise.node_names), group, self.read_writes, self.bytes, self.itemsize,
                                    internal)

    def score(self, first: Step, second: Step) -> tuple[int, int]:
        """(bytes of shared buffers that one kernel reads or writes once instead of twice, -distance)."""
        shared = self.accessed[id(first)] & self.accessed[id(second)]
        return sum(self.bytes[b] for b in shared), -abs(second.order - first.last)

    def round_candidates(self) -> tuple[list[Step], Candidates]:
        """This round's steps, and the pairs to try (positions in that list): pairs that touch a
        common buffer, earlier step first, ranked by `score` then as found (fusion_candidates),
        less those a third step that touches the buffer lies between (their fusion would create
        a cycle: `StepGraph.separable_partners`)."""
        steps = list(self.alive.values())
        touching: dict[str, list[int]] = {}
        for position, step in enumerate(steps):
            for buffer in self.touched[id(step)]:
                touching.setdefault(buffer, []).append(position)
        order = np.array([s.order for s in steps], dtype=np.int64)
        candidates = Candidates(order, np.array([s.last for s in steps], dtype=np.int64),
                                np.array([isinstance(s, ExternStep) for s in steps], dtype=bool))
        for index, (buffer, users) in enumerate(touching.items()):
            if len(users) < 2:
                continue
            users.sort(key=order.__getitem__)
            accessed = [buffer in self.accessed[id(steps[u])] for u in users]
            count = len(users) * (len(users) - 1) // 2
            if count <= PAIRS_WITHOUT_PRUNING:
                candidates.add_few(index, users, accessed, self.bytes[buffer])
                continue
            keys = [id(steps[u]) for u in users]
            columns = np.array(users, dtype=np.int64), np.array(accessed, dtype=bool)
            if count <= 2 * self.graph.span(keys):
                candidates.add(index, columns[0], np.triu_indices(len(users), 1), columns[1], self.bytes[buffer])
            else:
                candidates.add_hub(index, columns[0], self.graph.separable_partners(keys), columns[1], self.bytes[buffer])
        return steps, candidates


def program_order(name: str) -> int:
    """IR nodes are named op<i> by their position in the program."""
    return int(name.removeprefix("op"))


def can_fuse(first: Step, second: Step, graph: StepGraph, read_writes: dict[str, ReadWrites],
             options: CompileOptions) -> tuple[str, KernelGroup | None]:
    """(reason, None) when the pair cannot share a kernel, else ("", the fused group)."""
    if isinstance(first, ExternStep) or isinstance(second, ExternStep):
        return "extern nodes run as ATen calls and never fuse", None
    if first.mix_rows or second.mix_rows:
        return "a mixed-order kernel (a row and a column reduction) takes no further fusion", None
    if len(first.nodes) + len(second.nodes) > options.max_fusion_size:
        return f"the group would hold {len(first.nodes) + len(second.nodes)} nodes, over max_fusion_size={options.max_fusion_size}", None
    # checked on the current groups, not on single nodes: two fusions that are each fine alone
    # can together make groups depend on each other
    if graph.creates_cycle(id(first), id(second)):
        return "fusing would create a cycle: a path leaves the group and re-enters it", None
    nodes = sorted(first.nodes + second.nodes, key=lambda n: program_order(n.name))
    try:
        mapping = map_group(nodes, read_writes)
    except FusionRefused as why:
        return str(why), None
    return "", KernelGroup(f"{first.name}+{second.name}", nodes, mapping, min(first.order, second.order),
                           max(first.last, second.last))


def mark_internal_buffers(steps: list[Step], read_writes: dict[str, ReadWrites], program: Program) -> None:
    readers = buffer_readers(read_writes)
    for step in steps:
        if isinstance(step, KernelGroup) and len(step.nodes) > 1:
            step.internal = internal_buffers(step.node_names, read_writes, program, readers)


def buffer_readers(read_writes: dict[str, ReadWrites]) -> dict[str, set[str]]:
    """Each buffer's readers: the nodes of read_writes that read it."""
    readers: dict[str, set[str]] = {}
    for name, rw in read_writes.items():
        for buffer in rw.read_buffers():
            readers.setdefault(buffer, set()).add(name)
    return readers


def internal_buffers(node_names: list[str], read_writes: dict[str, ReadWrites], program: Program,
                     readers: dict[str, set[str]] | None = None) -> set[str]:
    """Buffers these nodes write that no other node, no output and no caller sees: they stay in registers.
    `readers` (buffer -> the nodes of read_writes that read it) saves a walk over every node."""
    inside = set(node_names)
    visible = {o.buffer.name for o in program.outputs} | {b.name for b in program.inputs}
    written = set().union(*(read_writes[n].write_buffers() for n in node_names))
    if readers is None:
        visible |= {b for n, rw in read_writes.items() if n not in inside for b in rw.read_buffers()}
        return written - visible
    return {b for b in written - visible if readers.get(b, set()) <= inside}
