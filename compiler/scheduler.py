"""Stage 3: order the program's nodes, fuse them into kernels, and say why not.

Following the seed scheduler: every IR node becomes a scheduler node with its read and
write dependencies; ordering edges come from data (read after write) and from
mutation (a write after earlier reads and writes of the same buffer). Dead nodes are
dropped. Fusion then runs in rounds: candidate pairs are nodes that share a buffer
(vertical: one writes what the other reads; horizontal: both read it); `can_fuse`
refuses extern nodes, groups past the size limit, fusions that would create a cycle
and groups whose loops cannot share one kernel (`loop_mapping`); the legal pairs are
taken best first by `score_fusion` (bytes saved, then proximity). Every refusal is
recorded as a `WhyNoFuse` line for the manifest and `fusewire explain`.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from typing import Any

from compiler.dependencies import MemoryDep, ReadWrites, extract_read_writes
from compiler.graph import ITEMSIZES
from compiler.ir import ComputeNode, ExternNode, Node, Program
from compiler.loop_mapping import FusionRefused, GroupMapping, map_group
from compiler.options import CompileOptions
from compiler.inline_gathers import gathered_producers, inline_gathered_producers
from compiler.split_reductions import split_reductions
from compiler.tiling import choose_tiling

MAX_FUSION_ROUNDS = 10


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


def schedule(program: Program, options: CompileOptions, judge: Any = None) -> Schedule:
    """`judge(first, second, fused, read_writes, program)`, when given (a GPU worker's
    compiler.benchmark_fusion.FusionBenchmarker), may overrule a legal fusion: it returns None
    (no opinion) or (keep, record) after timing the fused kernel against its parts. With a
    judge, a program whose gathered results could be recomputed (inline_gathers) is scheduled
    both ways and `judge.pick_schedule(recomputed, stored, producers)` keeps the faster."""
    split_reductions(program)
    producers = [n.name for n in gathered_producers(program)] if judge is not None else []
    if producers:  # recompute or store: schedule both ways, time both
        stored = copy.deepcopy(program)
        inline_gathered_producers(program)
        recomputed = _fuse_and_order(program, options, judge)
        return judge.pick_schedule(recomputed, _fuse_and_order(stored, options, judge), producers)
    inline_gathered_producers(program)
    return _fuse_and_order(program, options, judge)


def _fuse_and_order(program: Program, options: CompileOptions, judge: Any) -> Schedule:
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
    itemsize = {name: ITEMSIZES[b.dtype] for name, b in program.buffers.items()}
    for step in steps:
        if isinstance(step, KernelGroup):
            tiled = choose_tiling(step.nodes, step.mapping, read_writes, itemsize)
            if tiled is not None:
                step.mapping, step.tiled = tiled, True
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
    """For each node, the nodes that must run before it (data and mutation order)."""
    last_writer: dict[str, str] = {}
    readers_since_write: dict[str, set[str]] = {}
    predecessors: dict[str, set[str]] = {}
    for node in nodes:
        rw = read_writes[node.name]
        before: set[str] = set()
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
    """Steps ordered so every dependency runs first; ties keep program order."""
    step_of = {name: step for step in steps for name in step.node_names}
    remaining = sorted(steps, key=lambda s: s.order)
    done: set[int] = set()
    ordered: list[Step] = []
    while remaining:
        for step in remaining:
            needs = {id(step_of[p]) for n in step.node_names for p in predecessors[n]} - {id(step)}
            if needs <= done:
                ordered.append(step)
                done.add(id(step))
                remaining.remove(step)
                break
        else:
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
        return {
            "enabled": options.fusion,
            "groups": [{"kernel": s.name, "nodes": s.node_names, "numel": s.numel, "rnumel": s.rnumel}
                       for s in steps if isinstance(s, KernelGroup)],
            "fused": self.fused,
            "benchmarked": self.benchmarked,
            "benchmark_note": self.benchmark_note,
            # a pair refused in one round may still end up together through others: keep the informative ones
            "refused": [w.to_json() for w in self.refused.values() if not ({w.node1, w.node2} <= final and
                                                                         _same_group(steps, w.node1, w.node2))],
        }


def _same_group(steps: list[Step], a: str, b: str) -> bool:
    return any(a in s.node_names and b in s.node_names for s in steps)


def fuse_nodes(steps: list[Step], predecessors: dict[str, set[str]], read_writes: dict[str, ReadWrites],
               program: Program, options: CompileOptions, log: FusionLog, judge: Any = None) -> list[Step]:
    for _ in range(MAX_FUSION_ROUNDS):
        candidates = sorted(_candidate_pairs(steps, read_writes),
                            key=lambda pair: score_fusion(pair[0], pair[1], read_writes, program), reverse=True)
        fused_this_round: set[int] = set()
        changed = False
        for first, second in candidates:
            if id(first) in fused_this_round or id(second) in fused_this_round:
                continue
            reason, group = can_fuse(first, second, steps, predecessors, read_writes, options)
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
            log.fused.append({"node1": first.name, "node2": second.name,
                              "bytes_saved": score_fusion(first, second, read_writes, program)[0]})
            steps = [s for s in steps if s is not first and s is not second] + [group]
            fused_this_round |= {id(first), id(second), id(group)}
            changed = True
        if not changed:
            break
    return steps


def _candidate_pairs(steps: list[Step], read_writes: dict[str, ReadWrites]) -> list[tuple[Step, Step]]:
    """Pairs that touch a common buffer, earlier step first."""
    touching: dict[str, list[Step]] = {}
    for step in steps:
        buffers = set()
        for name in step.node_names:
            buffers |= read_writes[name].read_buffers() | read_writes[name].write_buffers()
        for buffer in buffers:
            touching.setdefault(buffer, []).append(step)
    pairs: dict[tuple[int, int], tuple[Step, Step]] = {}
    for users in touching.values():
        for a, b in itertools.combinations(sorted(users, key=lambda s: s.order), 2):
            if not (isinstance(a, ExternStep) and isinstance(b, ExternStep)):
                pairs[(id(a), id(b))] = (a, b)
    return list(pairs.values())


def program_order(name: str) -> int:
    """IR nodes are named op<i> by their position in the program."""
    return int(name.removeprefix("op"))


def can_fuse(first: Step, second: Step, steps: list[Step], predecessors: dict[str, set[str]],
             read_writes: dict[str, ReadWrites], options: CompileOptions) -> tuple[str, KernelGroup | None]:
    """(reason, None) when the pair cannot share a kernel, else ("", the fused group)."""
    if isinstance(first, ExternStep) or isinstance(second, ExternStep):
        return "extern nodes run as ATen calls and never fuse", None
    if len(first.nodes) + len(second.nodes) > options.max_fusion_size:
        return f"the group would hold {len(first.nodes) + len(second.nodes)} nodes, over max_fusion_size={options.max_fusion_size}", None
    if _creates_cycle(first, second, steps, predecessors):
        return "fusing would create a cycle: a path leaves the group and re-enters it", None
    nodes = sorted(first.nodes + second.nodes, key=lambda n: program_order(n.name))
    try:
        mapping = map_group(nodes, read_writes)
    except FusionRefused as why:
        return str(why), None
    return "", KernelGroup(f"{first.name}+{second.name}", nodes, mapping, min(first.order, second.order),
                           max(first.last, second.last))


def _creates_cycle(first: Step, second: Step, steps: list[Step], predecessors: dict[str, set[str]]) -> bool:
    """True if, with the pair merged, a path of steps leaves the merged group and comes back.

    Checked on the current groups, not on single nodes: two fusions that are each fine alone
    can together make groups depend on each other."""
    merged = {id(first), id(second)}
    group_of = {n: ("merged" if id(s) in merged else id(s)) for s in steps for n in s.node_names}
    successors: dict[object, set[object]] = {}
    for name, before in predecessors.items():
        if name not in group_of:
            continue
        for p in before:
            if p in group_of and group_of[p] != group_of[name]:
                successors.setdefault(group_of[p], set()).add(group_of[name])
    seen: set[object] = set()
    frontier = list(successors.get("merged", ()))
    while frontier:
        group = frontier.pop()
        if group == "merged":
            return True
        if group not in seen:
            seen.add(group)
            frontier.extend(successors.get(group, ()))
    return False


def score_fusion(first: Step, second: Step, read_writes: dict[str, ReadWrites], program: Program) -> tuple[int, int]:
    """(bytes of shared buffers that one kernel reads or writes once instead of twice, -distance)."""
    def buffers(step: Step) -> set[str]:
        names = set()
        for n in step.node_names:
            names |= {d.buffer for d in read_writes[n].reads | read_writes[n].writes if isinstance(d, MemoryDep)}
        return names

    shared = buffers(first) & buffers(second)
    saved = sum(program.buffers[b].layout.numel * ITEMSIZES[program.buffers[b].dtype] for b in shared)
    distance = abs(second.order - first.last)
    return saved, -distance


def mark_internal_buffers(steps: list[Step], read_writes: dict[str, ReadWrites], program: Program) -> None:
    for step in steps:
        if isinstance(step, KernelGroup) and len(step.nodes) > 1:
            step.internal = internal_buffers(step.node_names, read_writes, program)


def internal_buffers(node_names: list[str], read_writes: dict[str, ReadWrites], program: Program) -> set[str]:
    """Buffers these nodes write that no other node, no output and no caller sees: they stay in registers."""
    inside = set(node_names)
    visible = {o.buffer.name for o in program.outputs} | {b.name for b in program.inputs}
    visible |= {b for n, rw in read_writes.items() if n not in inside for b in rw.read_buffers()}
    written = set().union(*(read_writes[n].write_buffers() for n in node_names))
    return written - visible
