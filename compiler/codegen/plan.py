"""The launch plan: the ordered steps the runtime follows, as plain data.

    {"inputs": [...], "constants": [{buffer, constant, size, stride, offset, dtype}],
     "buffers": {name: {numel, dtype[, size, stride]}}, "steps": [
        {"op": "alloc", "buffer": ...},
        {"op": "kernel", "kernel": name, "args": [buffer...], "xnumel", "rnumel", "grid": [...], "config": {...}},
        {"op": "extern", "target": "aten.mm.default", "args": [...], "kwargs": {...}, "outputs": [...]},
        {"op": "free", "buffer": ...}],
     "outputs": [{"buffer", "size", "stride", "offset", "dtype"}]}

A buffer is allocated right before its first writer and freed right after its last
reader (an uninitialized one, an empty tensor, where lowering's `empty_strided` call stands);
graph inputs, outputs and extern results (ATen allocates those) are never allocated by the plan. A kernel writes in place (`"inplace": true` on the alloc that reuses
the buffer) into an input of the same dtype and storage size (its view may differ) that it is
the last reader of, when it reads each element of that input only where it writes the same
element, and before writing it: the input's storage is never live twice (Inductor's in-place
reuse). A constant's values are the
file `constants/<constant>.bin` of the artifact (`constant` is its position in the wire
graph's constants); the runtime puts them on the device once and never frees them.
"""

from __future__ import annotations

import re
from typing import Any

from compiler.bounds import planned_peak_bytes
from compiler.codegen.group import first_loop_of_each_pass
from compiler.dependencies import MemoryDep
from compiler.ir import ExternNode, TensorArg
from compiler.loop_mapping import same_index
from compiler.scheduler import KernelGroup, Schedule


def build_plan(schedule: Schedule, kernels: dict[str, Any]) -> dict[str, Any]:
    program = schedule.program
    inputs = {b.name for b in program.inputs} | set(program.constants)
    outputs = {o.buffer.name for o in program.outputs}
    step_buffers = [_buffers_of(step, kernels) for step in schedule.steps]
    last_use = {name: i for i, used in enumerate(step_buffers) for name in used}
    pool: dict[tuple[int, str], list[str]] = {}  # freed plan-allocated buffers by (numel, dtype)
    steps: list[dict[str, Any]] = []
    allocated: set[str] = set()
    donated: set[str] = set()  # buffers whose storage a kernel's output took over in place
    fresh_results = _fresh_extern_results(schedule)  # with `allocated`: storage nothing else views
    for i, step in enumerate(schedule.steps):
        if isinstance(step, KernelGroup):
            kernel = kernels[step.name]
            for name in kernel.arguments:
                if name not in allocated and program.buffers[name].kind == "computed":
                    dying = [b for b in kernel.arguments if last_use[b] == i and (b in allocated or b in fresh_results)
                             and b not in donated and b not in outputs]
                    source = _inplace_source(step, first_loop_of_each_pass(kernel.source), name, dying, schedule)
                    if source is not None:
                        donated.add(source)
                        steps.append({"op": "alloc", "buffer": name, "reuse": source, "inplace": True})
                    else:
                        steps.append(_allocate(name, program.buffers[name], pool))
                    allocated.add(name)
            if kernel.numel > 0:
                steps.append(_kernel_step(kernel))
        elif _allocation_only(step.node, program):  # an empty tensor: allocated like a kernel's output
            name = step.node.outputs[0].name
            steps.append(_allocate(name, program.buffers[name], pool))
            allocated.add(name)
        else:
            steps.append(_extern_step(step.node))
        for name in sorted(step_buffers[i]):
            if last_use[name] == i and name not in inputs and name not in outputs:
                steps.append({"op": "free", "buffer": name})
                if name in allocated and name not in donated:
                    pool.setdefault(_pool_key(program.buffers[name]), []).append(name)
    _mark_kept(steps)
    plan = {
        "inputs": [{"buffer": b.name, **b.layout.to_json()} for b in program.inputs],
        "constants": [{"buffer": name, "constant": position, **program.buffers[name].layout.to_json()}
                      for name, position in program.constants.items()],
        "buffers": {name: _buffer_entry(program.buffers[name]) for name in sorted(allocated)},
        "steps": steps,
        "outputs": [{"buffer": o.buffer.name, **o.layout.to_json()} for o in program.outputs],
    }
    plan["peak_bytes"] = planned_peak_bytes(plan, own_only=True)  # its own allocations: no inputs, externs
    return plan


def _allocation_only(node: ExternNode, program: Any) -> bool:
    """An extern step that only makes an uninitialized tensor (lowering's `empty`)."""
    return len(node.outputs) == 1 and program.buffers[node.outputs[0].name].kind == "uninitialized"


def _buffer_entry(buffer: Any) -> dict[str, Any]:
    """numel and dtype to allocate; size and stride when the buffer's own layout spans its storage
    from offset 0, so the runtime allocates the tensor in that layout and hands it to extern calls
    and the caller without making a view."""
    layout = buffer.layout
    entry = {"numel": layout.storage_numel(), "dtype": buffer.dtype}
    if layout.offset == 0 and layout.numel > 0:
        entry |= {"size": list(layout.size), "stride": list(layout.stride)}
    return entry


def _pool_key(buffer: Any) -> tuple[int, str]:
    return buffer.layout.storage_numel(), buffer.dtype


def _allocate(name: str, buffer: Any, pool: dict[tuple[int, str], list[str]]) -> dict[str, Any]:
    free = pool.get(_pool_key(buffer))
    if free:
        return {"op": "alloc", "buffer": name, "reuse": free.pop(0)}
    return {"op": "alloc", "buffer": name}


def _fresh_extern_results(schedule: Schedule) -> set[str]:
    """Results of ATen calls that are new tensors, not views of their arguments (mm's result is,
    a split's pieces are not)."""
    from compiler.fx_import import resolve_op

    fresh: set[str] = set()
    for step in schedule.steps:
        if not isinstance(step, KernelGroup) and not step.node.mutated:
            returns = resolve_op(step.node.target)._schema.returns
            if all(r.alias_info is None for r in returns):
                fresh.update(b.name for b in step.node.outputs)
    return fresh


def _inplace_source(group: KernelGroup, source: str, output: str, dying: list[str], schedule: Schedule) -> str | None:
    """A buffer among `dying` (read here for the last time) whose storage `output` can take: same
    dtype and storage size, not written by the group, every read of it at the very element the group
    writes of `output` (so each element is read only by the program that overwrites it), and every
    load of it in the kernel's source before that store (so no element is read after it is
    overwritten). In a reduction kernel the accesses are compared in the kernel's own (xindex,
    rindex) terms: a LayerNorm backward writes its input gradient over the incoming gradient, which
    its loops read at the same elements, the last of them in the loop that stores."""
    if not dying or group.phases or group.parts or (not group.is_reduction and len({n.ranges for n in group.nodes}) != 1):
        return None  # a kernel of phases or parts: each one's accesses are in its own terms
    buffers = schedule.program.buffers
    reads = [(n, d) for n in group.node_names for d in schedule.read_writes[n].reads]
    writes = [(n, d) for n in group.node_names for d in schedule.read_writes[n].writes]
    stores = [(n, d) for n, d in writes if d.buffer == output]
    if len(stores) != 1 or not isinstance(stores[0][1], MemoryDep):
        return None
    store_index = _kernel_index(group, *stores[0])
    for candidate in dying:
        if not _same_storage(buffers[candidate].layout, buffers[output].layout) or any(d.buffer == candidate for _, d in writes):
            continue
        if all(isinstance(d, MemoryDep) and _same_element(group, _kernel_index(group, n, d), store_index)
               for n, d in reads if d.buffer == candidate) \
                and _last_position(rf"tl\.load\(ptr_{candidate}\b", source) < _first_position(rf"tl\.store\(ptr_{output}\b", source):
            return candidate
    return None


def _same_storage(a: Any, b: Any) -> bool:
    """Storages that can stand in for each other: the accesses compared are offsets into each
    buffer's storage, so the views may differ ([6304, 3072] matmul result, [32, 197, 3072] output)."""
    return a.dtype == b.dtype and a.storage_numel() == b.storage_numel()


def _kernel_index(group: KernelGroup, node: str, dep: MemoryDep) -> Any:
    """A pointwise group compares accesses in its nodes' shared loop variables (one ranges tuple);
    a reduction group maps each node's variables onto the kernel's xindex and rindex."""
    if not group.is_reduction:
        return dep.index
    return group.mapping.nodes[node].apply(dep.index, group.mapping.bounds)


def _same_element(group: KernelGroup, a: Any, b: Any) -> bool:
    if not group.is_reduction:
        return a == b
    return same_index(a, b, group.mapping.bounds)


def _last_position(pattern: str, text: str) -> int:
    found = [m.start() for m in re.finditer(pattern, text)]
    return found[-1] if found else -1


def _first_position(pattern: str, text: str) -> int:
    found = re.search(pattern, text)
    return found.start() if found else -1


def _mark_kept(steps: list[dict[str, Any]]) -> None:
    """A freed buffer that a later alloc reuses is kept by the runtime; the rest are released."""
    reused = {s["reuse"] for s in steps if s["op"] == "alloc" and "reuse" in s}
    for step in steps:
        if step["op"] == "free":
            step["keep"] = step["buffer"] in reused


def _buffers_of(step: Any, kernels: dict[str, Any]) -> set[str]:
    if isinstance(step, KernelGroup):
        return set(kernels[step.name].arguments)
    return {t.buffer.name for t in step.node.tensor_args()} | {b.name for b in step.node.outputs}


def launch_grid(numel: int, rnumel: int, config: dict[str, Any]) -> list[int]:
    """Programs to launch: one per XBLOCK rows, times one per RBLOCK columns for a tiled kernel
    (a 1D grid: the kernel splits the program id, columns fastest; see codegen/group.py)."""
    if config.get("mix_rows"):  # a mixed-order kernel: one program per mix_rows rows
        return [-(-numel // config["mix_rows"]), 1, 1]
    tiles = -(-rnumel // config["RBLOCK"]) if config.get("tiled") else 1
    return [-(-numel // config["XBLOCK"]) * tiles, 1, 1]


def _kernel_step(kernel: Any) -> dict[str, Any]:
    return {"op": "kernel", "kernel": kernel.name, "args": kernel.arguments, "xnumel": kernel.numel,
            "rnumel": kernel.rnumel, "grid": launch_grid(kernel.numel, kernel.rnumel, kernel.config),
            "config": kernel.config}


def _extern_step(node: ExternNode) -> dict[str, Any]:
    step = {"op": "extern", "target": node.target, "args": [_extern_arg(a) for a in node.args],
            "kwargs": {k: _extern_arg(v) for k, v in node.kwargs.items()}, "outputs": [b.name for b in node.outputs],
            "layouts": [b.layout.to_json() for b in node.outputs]}
    if node.output_positions is not None and node.output_positions != list(range(len(node.outputs))):
        step["positions"] = node.output_positions  # results the op returns None for are skipped
    return step


def _extern_arg(value: Any) -> Any:
    """An extern call's argument as plan data: tensor views, else the wire format's encoding."""
    if isinstance(value, TensorArg):
        return {"tensor": value.to_json()}
    if isinstance(value, (list, tuple)):
        return [_extern_arg(v) for v in value]
    import torch

    from compiler.fx_import import scalar_arg

    if isinstance(value, torch.device):
        return {"device": "target"}  # lowering saw a meta device; the runtime uses the inputs' device
    encoded = scalar_arg(value)
    return encoded.model_dump() if hasattr(encoded, "model_dump") else encoded
