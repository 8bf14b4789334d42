"""Stage 4: Triton source for every kernel group, and the launch plan that runs them.

`generate(schedule, target)` returns a `Generated`: kernel sources (one file
per kernel), their launch configs, and the plan (data, not code) that the runtime
follows: allocate, launch, call extern ATen ops, free, return outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from compiler.codegen.heuristics import KernelShape, launch_config
from compiler.codegen.group import assemble, assemble_parts, assemble_phases, dropped_stores, pipelinable, write_group
from compiler.codegen.kernel import KernelWriter
from compiler.codegen.plan import build_plan, launch_grid
from compiler.dependencies import MemoryDep
from compiler.graph import ITEMSIZES
from compiler.gc_pause import paused_gc
from compiler.indexing import RINDEX
from compiler.options import CompileOptions
from compiler import row_order
from compiler.tiling import unit_steps
from compiler.scheduler import KernelGroup, Schedule

INT32_LIMIT = 2**31 - 1
# On a GPU a second pass over a row usually hits L2, and two passes beat one online pass up to
# rows of about 64K elements (H100, 2026-11-24, bench/online_softmax_ab.py and log_softmax /
# softmax / logsumexp over random rows, each side autotuned): GPT-2's 8192 x 50257 bf16
# 0.899 ms in two passes against 0.990 online; fp32 rows of 50257 1.269 against 1.290 and of
# 65536 1.020 against 1.021; bf16 rows of 128256 (LLaMA-3's vocabulary) 1.695 against 1.449,
# where a row (256 KB) times the rows in flight no longer stays in L2 between passes.
ONLINE_SOFTMAX_MIN_ROW = 64 * 1024
# A reduction is "crossed" when the bytes it moves along its smaller direction are at least this
# share of those along the larger: a BatchNorm backward reading channels-last inputs and writing an
# NCHW gradient (EfficientNet's squeeze-and-excitation), a channels-last LayerNorm backward writing
# NCHW. Autotuning then tries both families of configs.
CROSSED_SHARE = 4


@dataclass
class KernelSource:
    name: str
    source: str
    arguments: list[str]  # buffer names, in the kernel's pointer-argument order
    numel: int
    rnumel: int
    config: dict[str, Any]
    nodes: list[str]
    origins: list[str]
    cubin: bytes | None = None
    cubin_metadata: dict[str, Any] | None = None
    tuning: dict[str, Any] | None = None  # autotuning trials, when a GPU timed them
    crossed: bool = False  # a reduction whose accesses run along both xindex and rindex (is_crossed)
    pipelinable: bool = False  # a loop whose loads may run steps ahead: config "loop_stages" (group.pipelinable)


@dataclass
class Generated:
    """Codegen's output: kernels with heuristic configs and the plan that launches them.
    Stage 4b (compiler/autotune.py) may change configs, add cubins and rebuild the plan."""

    kernels: list[KernelSource]
    plan: dict[str, Any]
    fusion_log: dict[str, Any]
    autotune_note: str = "heuristic launch configs: the cpu target is not tuned"

    @property
    def files(self) -> dict[str, bytes]:
        files = {f"kernels/{k.name}.py": k.source.encode() for k in self.kernels}
        return files | {f"cubins/{k.name}.cubin": k.cubin for k in self.kernels if k.cubin is not None}

    def kernel_entries(self) -> list[dict[str, Any]]:
        entries = []
        for k in self.kernels:
            entry = {"name": k.name, "source": f"kernels/{k.name}.py", "numel": k.numel, "rnumel": k.rnumel,
                     "config": k.config, "nodes": k.nodes, "origins": k.origins}
            if k.cubin is not None:
                entry["cubin"] = f"cubins/{k.name}.cubin"
                entry["cubin_metadata"] = k.cubin_metadata
            if k.tuning is not None:
                entry["autotune"] = k.tuning
            entries.append(entry)
        return entries


@paused_gc
def generate(schedule: Schedule, target: str) -> Generated:
    dtypes = schedule.program.buffer_dtypes()
    kernels = [generate_kernel(step, schedule, dtypes, target)
               for step in schedule.steps if isinstance(step, KernelGroup)]
    return Generated(kernels, build_plan(schedule, {k.name: k for k in kernels}), schedule.fusion_log)


def is_outer_reduction(group: KernelGroup, read_writes: dict) -> bool:
    """True when the reduction's loads are contiguous along the outputs, not along the reduction."""
    votes = 0
    for node in group.nodes:
        if not node.is_reduction:
            continue
        for dep in read_writes[node.name].reads:
            if not isinstance(dep, MemoryDep):
                continue
            index = group.mapping.nodes[node.name].apply(dep.index, group.mapping.bounds)
            if RINDEX not in index.free_symbols:
                continue  # broadcast over the reduction
            along_x, along_r = unit_steps(index, group.numel, group.rnumel)
            votes += -1 if along_r else (1 if along_x else 0)
    return votes > 0


def is_crossed(group: KernelGroup, read_writes: dict, buffers: dict) -> bool:
    """Whether a reduction kernel moves a good share of its bytes both along its outputs and along
    its reduction (a norm's backward reading one tensor channels-last and another NCHW): a tile then
    wants to be wide in both, and which family of configs (rows or columns) does better is a matter
    for timing (autotuning tries both)."""
    along_x, along_r = access_directions(group, read_writes, buffers)
    return min(along_x, along_r) * CROSSED_SHARE >= max(along_x, along_r) > 0


def access_directions(group: KernelGroup, read_writes: dict, buffers: dict) -> tuple[int, int]:
    """Bytes a reduction kernel moves through accesses contiguous along its outputs (xindex) and
    along its reduction (rindex), over its distinct loads and stores: all of its nodes' (the
    pointwise work fused before and after the reduction too), leaving out what stays in registers
    (reads of buffers the kernel writes itself, stores never allocated) and accesses broadcast over
    the reduction. An access moves at most its buffer's bytes."""
    written = set().union(*(read_writes[n].write_buffers() for n in group.node_names))
    accesses = set()
    for node in group.nodes:
        rw = read_writes[node.name]
        loads = [d for d in rw.reads if d.buffer not in written]
        stores = [d for d in rw.writes if d.buffer not in group.internal]
        for dep in loads + stores:
            if isinstance(dep, MemoryDep):
                accesses.add((dep.buffer, group.mapping.nodes[node.name].apply(dep.index, group.mapping.bounds)))
    along_x = along_r = 0
    for buffer, index in accesses:
        if RINDEX not in index.free_symbols:
            continue
        layout = buffers[buffer].layout
        moved = min(layout.storage_numel(), group.numel * group.rnumel) * ITEMSIZES[layout.dtype]
        x, r = unit_steps(index, group.numel, group.rnumel)
        along_r += moved if r else 0
        along_x += moved if x and not r else 0
    return along_x, along_r


def generate_kernel(group: KernelGroup, schedule: Schedule, dtypes: dict[str, str], target: str,
                    config: dict[str, Any] | None = None) -> KernelSource:
    """The group's kernel with the heuristics' launch config, or with `config` (autotuning's
    persistent-or-looped candidates need their own source). A group of phases
    (compiler.single_programs) is one kernel running each phase, with its heuristic config, in turn."""
    if group.phases:
        return _phases_kernel(group, schedule, dtypes, target)
    if group.parts:
        return _parts_kernel(group, schedule, dtypes, target)
    writer, dropped, config = _write_kernel(group, schedule, dtypes, target, config)
    source, arguments = assemble(writer, dropped)
    return KernelSource(
        name=group.name, source=source, arguments=arguments, numel=group.numel, rnumel=group.rnumel,
        config=config, nodes=group.node_names, origins=_origins(group),
        crossed=group.is_reduction and not group.mix_rows and is_crossed(group, schedule.read_writes, schedule.program.buffers),
        pipelinable=pipelinable(writer),
    )


def _phases_kernel(group: KernelGroup, schedule: Schedule, dtypes: dict[str, str], target: str) -> KernelSource:
    phases = [_write_kernel(phase, schedule, dtypes, target) for phase in group.phases]
    source, arguments = assemble_phases(group.name, phases)
    config = _joined_config(phases, "phases", [{} for _ in phases])
    return KernelSource(name=group.name, source=source, arguments=arguments, numel=1,
                        rnumel=max(p.rnumel for p in group.phases), config=config, nodes=group.node_names,
                        origins=_origins(group))


def _parts_kernel(group: KernelGroup, schedule: Schedule, dtypes: dict[str, str], target: str) -> KernelSource:
    parts = [_write_kernel(part, schedule, dtypes, target) for part in group.parts]
    for writer, _, _ in parts:
        writer.program_id = "part_pid"
    programs = [launch_grid(p.numel, p.rnumel, c)[0] for p, (_, _, c) in zip(group.parts, parts)]
    source, arguments = assemble_parts(group.name, parts, programs)
    config = _joined_config(parts, "parts", [{"programs": n} for n in programs])
    return KernelSource(name=group.name, source=source, arguments=arguments, numel=sum(programs),
                        rnumel=max(p.rnumel for p in group.parts), config=config, nodes=group.node_names,
                        origins=_origins(group))


def _joined_config(members: list[tuple[KernelWriter, set[str], dict]], kind: str, extras: list[dict]) -> dict:
    """The launch config of a kernel of several members (phases, parts): XBLOCK 1, so that the grid
    is the kernel's numel in programs, the most warps any member asks for, and under `kind` each
    member's block sizes (with its `extras`)."""
    return {"XBLOCK": 1, "RBLOCK": 1, "num_warps": max(c["num_warps"] for _, _, c in members), "num_stages": 1,
            "persistent": True,
            kind: [{k: c[k] for k in ("XBLOCK", "RBLOCK", "persistent")} | extra for (_, _, c), extra in zip(members, extras)]}


def _origins(group: KernelGroup) -> list[str]:
    return sorted({o for n in group.nodes for o in n.origins})


def _write_kernel(group: KernelGroup, schedule: Schedule, dtypes: dict[str, str], target: str,
                  config: dict[str, Any] | None = None) -> tuple[KernelWriter, set[str], dict[str, Any]]:
    """The group's kernel written (not yet assembled), the stores it drops, and its config."""
    config = config or launch_config(KernelShape(group.numel, group.rnumel, group.is_reduction,
                                                 not group.mix_rows and is_outer_reduction(group, schedule.read_writes),
                                                 group.tiled, group.row_block, group.mix_rows, group.lanes,
                                                 group.unrolled.count if group.unrolled else 1), target)
    buffers = schedule.program.buffers
    touched = set().union(*(schedule.read_writes[n].read_buffers() | schedule.read_writes[n].write_buffers()
                            for n in group.node_names))
    largest = max([group.numel * group.rnumel] + [buffers[b].layout.storage_numel() for b in touched])
    writes = set().union(*(schedule.read_writes[n].write_buffers() for n in group.node_names))
    writer = KernelWriter(group.name, group.numel, group.rnumel, group.is_reduction, config["persistent"],
                          "int64" if largest > INT32_LIMIT else "int32", dtypes, writes, portable_math=target == "cpu",
                          tiled=group.tiled, unrounded=frozenset(group.internal), row_windows=_row_windows(group, config),
                          mix_rows=group.mix_rows, reverse_programs=group.reverse_programs,
                          reread_later=group.reread_later,
                          lane_extents={b: buffers[b].layout.storage_numel() for b in touched} if group.lanes else None,
                          unrolled=group.unrolled)
    write_group(writer, group, schedule.read_writes, online_softmax=target == "cpu" or group.rnumel >= ONLINE_SOFTMAX_MIN_ROW)
    if config.get("loop_stages", 1) > 1:
        if pipelinable(writer):
            writer.loop_stages = config["loop_stages"]
        else:
            config = {k: v for k, v in config.items() if k != "loop_stages"}
    return writer, dropped_stores(writer, group), config


def _row_windows(group: KernelGroup, config: dict) -> bool:
    """Whether a looped row may walk aligned windows (kernel.ROW_ALIGN): not across columns, nor in
    a block of rows whose accesses are contiguous across them, which each row's own shift would break,
    nor under a scan, whose running totals are stored at the row's own positions."""
    return not config.get("outer") and not (row_order.OWN_ORDER_ROW_BLOCK and group.row_block > 1) \
        and not any(n.is_scan for n in group.nodes)
