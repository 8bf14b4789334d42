"""Stage 3: order the program's nodes into kernels and plan memory.

v1 (this file's first form): dead-node elimination, one kernel per compute node,
extern calls in program order, and the last use of each buffer so the launch plan can
free it. Fusion builds on `KernelGroup`, which already holds several nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from compiler.dependencies import ReadWrites, extract_read_writes
from compiler.ir import ComputeNode, ExternNode, Node, Program
from compiler.options import CompileOptions


@dataclass
class KernelGroup:
    """Compute nodes that become one kernel; `internal` buffers never leave registers."""

    name: str
    nodes: list[ComputeNode]
    internal: set[str] = field(default_factory=set)

    @property
    def numel(self) -> int:
        return max(n.numel for n in self.nodes)

    @property
    def rnumel(self) -> int:
        return max((n.rnumel for n in self.nodes if n.is_reduction), default=1)

    @property
    def is_reduction(self) -> bool:
        return any(n.is_reduction for n in self.nodes)


Step = KernelGroup | ExternNode


@dataclass
class Schedule:
    program: Program
    steps: list[Step]
    read_writes: dict[str, ReadWrites]
    fusion_log: dict = field(default_factory=lambda: {"fused": [], "refused": [], "note": "fusion disabled in v1"})


def schedule(program: Program, options: CompileOptions) -> Schedule:
    read_writes = {node.name: extract_read_writes(node) for node in program.nodes}
    live = eliminate_dead_nodes(program, read_writes)
    steps: list[Step] = []
    for node in live:
        if isinstance(node, ExternNode):
            steps.append(node)
        else:
            steps.append(KernelGroup(f"kernel{len(steps)}", [node]))
    return Schedule(program, steps, read_writes)


def eliminate_dead_nodes(program: Program, read_writes: dict[str, ReadWrites]) -> list[Node]:
    """Drops nodes whose writes nobody reads; keeps outputs, input mutations and externs with mutations."""
    needed = {o.buffer.name for o in program.outputs}
    inputs = {b.name for b in program.inputs}
    kept: list[Node] = []
    for node in reversed(program.nodes):
        writes = read_writes[node.name].write_buffers()
        mutates_input = bool(writes & inputs)
        if writes & needed or mutates_input or (isinstance(node, ExternNode) and node.mutated):
            kept.append(node)
            needed |= read_writes[node.name].read_buffers()
    return kept[::-1]
