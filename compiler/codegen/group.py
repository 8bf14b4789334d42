"""Writes one KernelGroup as a Triton kernel: places each node in a section, evaluates
the bodies through a KernelWriter, and assembles the source text.

Placement follows data: a node runs in the earliest section where everything it reads
from the group is available. Reduction results become available only after their
loop, so softmax (max, then sum of exp, then divide) becomes loop / loop / loop in a
looped kernel, and one straight pass over registers in a persistent one.
"""

from __future__ import annotations

import re

from compiler.codegen.kernel import ROW_ALIGN, KernelWriter, LoadLine, StoreLine
from compiler.codegen.online_softmax import find_online_pairs
from compiler.codegen.triton_helpers import HELPERS, PORTABLE_MATH
from compiler.dependencies import MemoryDep, ReadWrites
from compiler.graph import ITEMSIZES
from compiler.indexing import RINDEX, XINDEX
from compiler.ir import ComputeNode
from compiler.scheduler import KernelGroup


def place_nodes(group: KernelGroup, read_writes: dict[str, ReadWrites],
                online: dict[str, str] | None = None) -> list[tuple[str, list[ComputeNode]]]:
    """Sections in order, as (kind, nodes): x-sections at even positions, r-sections at odd.
    A sum paired with its max for an online softmax (`online`: max -> sum) shares the max's loop."""
    partner_of = {total: high for high, total in (online or {}).items()}
    available: dict[str, int] = {}
    position: dict[str, int] = {}
    for node in group.nodes:
        ready = max((available[b] for b in read_writes[node.name].read_buffers() if b in available), default=0)
        in_r = (group.is_reduction or group.tiled) and (node.is_reduction or group.mapping.uses_rindex(node))
        spot = ready + (1 if (ready % 2 == 0) == in_r else 0)
        if node.name in partner_of:
            spot = position[partner_of[node.name]]
        position[node.name] = spot
        for buffer in read_writes[node.name].write_buffers():  # a scan's running totals are ready in its loop
            available[buffer] = spot + 1 if node.is_reduction and not node.is_scan else spot
    last = max(position.values()) + (1 if any(n.is_reduction and not n.is_scan for n in group.nodes) else 0)
    return [("r" if i % 2 else "x", [n for n in group.nodes if position[n.name] == i]) for i in range(last + 1)]


def write_group(writer: KernelWriter, group: KernelGroup, read_writes: dict[str, ReadWrites],
                online_softmax: bool = True) -> None:
    if group.unrolled is not None:
        _write_cells(writer, group)
        return
    use_online = online_softmax and not writer.persistent
    online = find_online_pairs(group.nodes, group.mapping) if use_online else {}
    by_name = {n.name: n for n in group.nodes}
    sections = place_nodes(group, read_writes, online)
    pending_reductions: list[tuple[ComputeNode, list]] = []
    costs = _RecomputeCosts(group, read_writes, writer)
    for kind, nodes in sections:
        if (not (group.is_reduction or group.tiled) and kind == "r") or (not nodes and not pending_reductions):
            continue
        writer.open_section(kind)
        for node, results in pending_reductions:  # outputs of the loop just closed
            index, _ = group.mapping.index_of(node)
            for store, result in zip(node.stores, results):
                writer.store(store.buffer.name, store.layout.index(index), result)
        pending_reductions = []
        for node in nodes:
            if node.name in online.values():
                continue  # written with its max, below
            index, rindex = group.mapping.index_of(node)
            value = node.body(writer, index, rindex)
            if node.name in online:
                row_max, row_sum = writer.online_softmax(value, value.dtype)
                pending_reductions += [(node, [row_max]), (by_name[online[node.name]], [row_sum])]
            elif node.name in group.column_nodes:
                for store in node.stores:
                    writer.store_after_rows(store.buffer.name, store.layout.index(index),
                                            writer.reduce_columns(node.reduction_type, value, value.dtype))
            elif node.is_scan:
                result = writer.scan(node.reduction_type, value)
                for store in node.stores:
                    writer.store(store.buffer.name, node.store_index(store, index, rindex), result)
            elif node.is_reduction:
                accumulate = "float32" if node.reduction_type == "welford" and value.dtype != "float64" else value.dtype
                pending_reductions.append((node, writer.reduce(node.reduction_type, value, accumulate)))
            else:
                recompute = None
                if kind == "r" and not writer.persistent and costs.cheaper(node):
                    recompute = lambda node=node, index=index, rindex=rindex: node.body(writer, index, rindex)
                for store in node.stores:
                    writer.store(store.buffer.name, store.layout.index(index), value, recompute)


def _write_cells(writer: KernelWriter, group: KernelGroup) -> None:
    """A pointwise kernel over cells (compiler.unrolled_lanes): the group's nodes written once per
    lane, in one section, where equal loads of different lanes are one load."""
    writer.open_section("x")
    for lane in group.unrolled.assignments():
        writer.lane = lane
        for node in group.nodes:
            index, rindex = group.mapping.index_of(node)
            value = node.body(writer, index, rindex)
            for store in node.stores:
                writer.store(store.buffer.name, store.layout.index(index), value)
    writer.finish_lanes()


class _RecomputeCosts:
    """Whether a later loop of a looped kernel should evaluate a pointwise node again rather than
    read back what it stored: when the loads it makes per reduction element take no more bytes than
    one element of its output (a bf16 input cast to float32: the float32 copy need not exist at
    all). Loads of one value per row (targets, row results) and of constants cost nothing. One per
    kernel: each node's cost is worked out once."""

    def __init__(self, group: KernelGroup, read_writes: dict[str, ReadWrites], writer: KernelWriter) -> None:
        self.group, self.read_writes, self.writer = group, read_writes, writer
        self.writers = {b: n for n in group.nodes if not n.is_reduction for b in read_writes[n.name].write_buffers()}
        self.memo: dict[str, float] = {}

    def cheaper(self, node: ComputeNode) -> bool:
        written = [ITEMSIZES[self.writer.buffer_dtypes[b]] for b in self.read_writes[node.name].write_buffers()]
        return bool(written) and self.bytes(node) <= min(written)

    def bytes(self, node: ComputeNode) -> float:
        """Bytes per reduction element that evaluating `node` again loads from memory. A value another
        pointwise node of the group computes counts what evaluating that node again loads, when that
        is less than the value's own bytes (a bf16 row cast to float32, shifted, cast back to bf16:
        two bytes, not the float32 intermediate's four), since its later reads recompute it too."""
        if node.name in self.memo:
            return self.memo[node.name]
        self.memo[node.name] = float("inf")  # a cycle (none expected) never counts as cheap
        mapping, bounds = self.group.mapping.nodes[node.name], self.group.mapping.bounds
        total = 0.0
        for dep in self.read_writes[node.name].reads:
            if isinstance(dep, MemoryDep) and RINDEX not in mapping.apply(dep.index, bounds).free_symbols:
                continue
            own = ITEMSIZES[self.writer.buffer_dtypes[dep.buffer]]
            producer = self.writers.get(dep.buffer)
            if producer is not None and producer is not node:
                own = min(own, self.bytes(producer))
            total += own
        self.memo[node.name] = total
        return total


def dropped_stores(writer: KernelWriter, group: KernelGroup) -> set[str]:
    """Internal buffers whose every in-kernel read came from registers: never stored or allocated."""
    return {b for b in group.internal if b not in writer.missed_loads}


KERNEL_CONSTANTS = ["xnumel: tl.constexpr", "rnumel: tl.constexpr", "XBLOCK: tl.constexpr", "RBLOCK: tl.constexpr"]


def assemble(writer: KernelWriter, dropped: set[str]) -> tuple[str, list[str]]:
    """The kernel's source and its pointer arguments (buffer names, in order)."""
    function, used = kernel_function(writer, dropped, writer.name)
    return "\n".join(module_header(writer.helpers) + ["", ""] + function) + "\n", used


def assemble_phases(name: str, phases: list[tuple[KernelWriter, set[str], dict]]) -> tuple[str, list[str]]:
    """One kernel that runs each phase (writer, dropped stores, launch config) in turn in its one
    program (compiler.single_programs), a barrier between phases: a phase's loads see what the
    phases before it stored."""
    functions, calls, arguments = _member_functions(name, "phase", phases, [[] for _ in phases])
    body = [line for i, call in enumerate(calls) for line in (["tl.debug_barrier()"] if i else []) + [call]]
    return _joined_source(name, phases, functions, arguments, body), arguments


def assemble_parts(name: str, parts: list[tuple[KernelWriter, set[str], dict]], programs: list[int]
                   ) -> tuple[str, list[str]]:
    """One kernel whose programs run the parts' programs end to end (compiler.parallel_passes):
    each part's function takes its own program number (writer.program_id) and runs with its own
    launch config; `programs`: each part's program count."""
    firsts = [sum(programs[:i]) for i in range(len(parts))]
    functions, calls, arguments = _member_functions(name, "part", parts, [[f"pid - {first}"] for first in firsts])
    body = ["pid = tl.program_id(0)"]
    for i, (call, first, count) in enumerate(zip(calls, firsts, programs)):
        body += [f"{'if' if i == 0 else 'elif'} pid < {first + count}:", f"    {call}"]
    return _joined_source(name, parts, functions, arguments, body), arguments


def _member_functions(name: str, kind: str, members: list[tuple[KernelWriter, set[str], dict]],
                      program_ids: list[list[str]]) -> tuple[list[str], list[str], list[str]]:
    """For a kernel of several members (phases, parts): each member's jitted function, as lines,
    the call of each with its own launch config (and `program_ids`' argument, if any), and the
    kernel's pointer arguments."""
    functions: list[str] = []
    calls: list[str] = []
    arguments: list[str] = []
    for i, ((writer, dropped, config), program_id) in enumerate(zip(members, program_ids)):
        function, used = kernel_function(writer, dropped, f"{name}_{kind}{i}")
        functions += ["", "", *function]
        arguments += [b for b in used if b not in arguments]
        shape = [writer.bounds[XINDEX], writer.bounds[RINDEX], config["XBLOCK"], config["RBLOCK"]]
        calls.append(f"{name}_{kind}{i}({', '.join([f'ptr_{b}' for b in used] + program_id + [str(n) for n in shape])})")
    return functions, calls, arguments


def _joined_source(name: str, members: list[tuple[KernelWriter, set[str], dict]], functions: list[str],
                   arguments: list[str], body: list[str]) -> str:
    """The module of a kernel of several members: their functions, then the kernel running `body`."""
    signature = ", ".join([f"ptr_{b}" for b in arguments] + KERNEL_CONSTANTS)
    lines = module_header(set().union(*(writer.helpers for writer, _, _ in members))) + functions
    lines += ["", "", "@triton.jit", f"def {name}({signature}):"] + [f"    {line}" for line in body]
    return "\n".join(lines) + "\n"


def module_header(helpers: set[str]) -> list[str]:
    lines = ["import triton", "import triton.language as tl", "from triton.language.extra import libdevice", ""]
    for helper in sorted(helpers):
        lines += ["", HELPERS.get(helper) or PORTABLE_MATH[helper]]
    return lines


def kernel_function(writer: KernelWriter, dropped: set[str], name: str) -> tuple[list[str], list[str]]:
    """The kernel's jitted function, as lines, and its pointer arguments (buffer names, in order)."""
    used = [b for b in writer.pointers if b not in dropped]
    signature = ", ".join([writer.pointers[b] for b in used] + ([writer.program_id] if writer.program_id else [])
                          + KERNEL_CONSTANTS)
    if writer.mix_rows:  # a mixed-order kernel (compiler/mixed_order.py): the row kernel in a loop over its rows
        rows = _mixed_row_step(writer) + writer.setup + _rendered_sections(writer, dropped) + writer.pending_after
        body = _mixed_prologue(writer) + [f"    {line}" for line in rows] + writer.after_rows
    else:
        body = _prologue(writer) + writer.setup + _rendered_sections(writer, dropped) + writer.pending_after
    return ["@triton.jit", f"def {name}({signature}):"] + [f"    {line}" for line in body], used


def _rendered_sections(writer: KernelWriter, dropped: set[str]) -> list[str]:
    """Every section's lines as text, loads first, a looped kernel's r-sections in their loops."""
    body: list[str] = []
    loop_headers = _loop_headers(writer)
    ordered = _loads_first(writer)
    for i, section in enumerate(writer.sections):
        reloaded = {line.buffer for later in writer.sections[i + 1:] if later.kind == "r"
                    for line in later.lines if isinstance(line, LoadLine)}
        rendered = [_render(line, dropped, eviction_policy(writer, section.kind, line, reloaded)) for line in ordered[i]]
        rendered = [line for line in rendered if line is not None]
        if section.kind == "r" and not writer.persistent:
            for header in loop_headers:
                body += header + [f"    {line}" for line in rendered]
        else:
            body += rendered
    return body


def _loads_first(writer: KernelWriter) -> list[list[str | StoreLine | LoadLine]]:
    """Each section's lines with every load moved up as far as its operands allow, as Inductor
    emits all loads before the math and the stores: Triton keeps a load after a store in order
    (they might alias), so a load left behind a store waits for it, and small persistent kernels
    (LayerNorm, RMSNorm backward) paid that latency once per load. Straight-line code (a persistent
    or pointwise kernel) is one block, so a later section's loads rise into earlier ones; a loop's
    body stays its own block. A load never passes a store to its own buffer nor the definition of
    a name it uses (an indirect index, a masked op's mask)."""
    straight = writer.persistent or not writer.is_reduction
    blocks = [[i for i in range(len(writer.sections))]] if straight else [[i] for i in range(len(writer.sections))]
    ordered: list[list[str | StoreLine | LoadLine]] = [[] for _ in writer.sections]
    for block in blocks:
        lines = [(i, line, _defined_names(line)) for i in block for line in writer.sections[i].lines]
        for position, (_, line, _) in enumerate(lines):
            if isinstance(line, LoadLine):
                used = set(_NAME.findall(line.text.split("=", 1)[1]))
                target = position
                while target > 0 and not _must_follow(line, used, *lines[target - 1][1:]):
                    target -= 1
                while target < position and isinstance(lines[target][1], LoadLine):
                    target += 1  # behind the loads already moved there: loads keep their order
                section = lines[target][0]  # the section of the line it now precedes
                _, _, defined = lines.pop(position)
                lines.insert(target, (section, line, defined))
        for i, line, _ in lines:
            ordered[i].append(line)
    return ordered


_NAME = re.compile(r"[A-Za-z_]\w*")
_ASSIGNED = re.compile(r"^\s*([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\s*=(?!=)")


def _defined_names(line: str | StoreLine | LoadLine) -> set[str] | None:
    """The names a line assigns; None for a line that is no assignment (kept in order)."""
    if isinstance(line, StoreLine):
        return set()
    assigned = _ASSIGNED.match(line.text if isinstance(line, LoadLine) else line)
    return None if assigned is None else {n.strip() for n in assigned.group(1).split(",")}


def _must_follow(load: LoadLine, used: set[str], earlier: str | StoreLine | LoadLine, defined: set[str] | None) -> bool:
    if isinstance(earlier, StoreLine):
        return earlier.buffer == load.buffer
    return defined is None or bool(defined & used)


def _render(line: str | StoreLine | LoadLine, dropped: set[str], policy: str | None) -> str | None:
    if isinstance(line, StoreLine):
        return None if line.buffer in dropped else line.text
    if isinstance(line, LoadLine):
        return line.text + (f", eviction_policy='{policy}')" if policy else ")")
    return line


# A row a later loop reads again is kept in L2 (evict_last) when the tensor is past this size; a
# smaller one stays in L2 anyway. Measured on an H100 (2026-11-24, interleaved A/B): log-softmax
# forwards over 4096 x 32000 bf16 (262 MB, read twice) 0.329 -> 0.298 ms; BatchNorm over 128 x 25088
# bf16 (6.4 MB) 1-4 % slower with it.
RELOAD_KEEP_MIN_BYTES = 32 * 2**20
# A pointwise kernel keeps what it reads more than once (evict_last), as Inductor does. H100,
# 2026-11-26, bench/switch_ab.py: GPT-2's token + position embedding 15.7 -> 14.9 us, embeddings and
# rotary kernels 1-3 % faster, BatchNorm normalize passes within 1 %.
POINTWISE_KEEP_REREAD = True


def eviction_policy(writer: KernelWriter, section_kind: str, line: object, reloaded: set[str]) -> str | None:
    """L2 policy of a load, as Inductor sets it. A pointwise kernel keeps what it reads more than
    once (evict_last). A reduction kernel keeps what every row reads again (evict_last) and a large
    row a later loop reads again, and streams what a loop reads for the last time (evict_first), unless
    a later kernel reads it again (compiler.l2_reuse)."""
    if not isinstance(line, LoadLine) or writer.tiled:
        return None
    if not writer.is_reduction:
        return "evict_last" if line.reread and POINTWISE_KEEP_REREAD else None
    if line.reread:
        return "evict_last"
    looped = section_kind == "r" and not writer.persistent
    if line.buffer in reloaded:
        size = writer.bounds[XINDEX] * writer.bounds[RINDEX] * ITEMSIZES[writer.buffer_dtypes[line.buffer]]
        return "evict_last" if looped and size >= RELOAD_KEEP_MIN_BYTES else None
    return "evict_first" if looped and line.buffer not in writer.reread_later else None


# A block that divides its size evenly needs no bounds check: the constexpr test makes the mask
# a constant True, which Triton folds away (unmasked, vectorizable loads), as Inductor does.
XMASK = "xmask = (xindex < xnumel) | (xnumel % XBLOCK == 0)"  # no program runs when xnumel is 0
RMASK = "rmask = (rindex < rnumel) | ((rnumel % RBLOCK == 0) & (rnumel > 0))"


def _index_texts(writer: KernelWriter) -> tuple[str, str]:
    """The program id (counted from the last program where the kernel runs back to front) and an
    arange of `{n}` lanes, in the kernel's index dtype."""
    program_id = "(tl.num_programs(0) - 1 - tl.program_id(0))" if writer.reverse_programs else "tl.program_id(0)"
    program_id = writer.program_id or program_id
    if writer.index_dtype == "int64":
        return f"{program_id}.to(tl.int64)", "tl.arange(0, {n}).to(tl.int64)"
    return program_id, "tl.arange(0, {n})"


def _mixed_prologue(writer: KernelWriter) -> list[str]:
    """A mixed-order kernel's lines before its loop over rows: the whole row's lanes, the column
    sums' accumulators, and the loop's header."""
    program_id, arange = _index_texts(writer)
    return [f"pid = {program_id}", f"rindex = {arange.format(n='RBLOCK')}[None, :]", RMASK,
            f"tl.static_assert({writer.mix_rows} % XBLOCK == 0)"  # a step never reaches the next program's rows
            ] + writer.before_rows + [loop_header(writer, "xstep", f"0, {writer.mix_rows}, XBLOCK")]


def _mixed_row_step(writer: KernelWriter) -> list[str]:
    """The rows of one step of a mixed-order kernel's loop."""
    _, arange = _index_texts(writer)
    return [f"xindex = pid * {writer.mix_rows} + xstep + {arange.format(n='XBLOCK')}[:, None]", XMASK,
            "rxmask = rmask & xmask"]


def _prologue(writer: KernelWriter) -> list[str]:
    program_id, arange = _index_texts(writer)
    if not writer.is_reduction:
        return [f"xoffset = {program_id} * XBLOCK", f"xindex = xoffset + {arange.format(n='XBLOCK')}", XMASK]
    if writer.tiled:  # one program per tile, consecutive programs along the columns (plan.launch_grid)
        return [f"pid = {program_id}", "rtiles = (rnumel + RBLOCK - 1) // RBLOCK",
                f"xindex = (pid // rtiles) * XBLOCK + {arange.format(n='XBLOCK')}[:, None]", XMASK,
                f"rindex = (pid % rtiles) * RBLOCK + {arange.format(n='RBLOCK')}[None, :]", RMASK,
                "rxmask = rmask & xmask"]
    lines = [f"xoffset = {program_id} * XBLOCK", f"xindex = xoffset + {arange.format(n='XBLOCK')}[:, None]",
             XMASK, f"rbase = {arange.format(n='RBLOCK')}[None, :]"]
    if writer.persistent:
        lines += ["rindex = rbase", RMASK, "rxmask = rmask & xmask"]
    if writer.row_stride is not None:
        lines += [f"rshift = ({writer.row_stride}*xindex) % {ROW_ALIGN}",  # the row's start in its aligned window
                  f"tl.static_assert(RBLOCK >= {ROW_ALIGN})"]  # the first step covers the shift
    return lines


# Where a row-window pass's unmasked middle loop ends and its masked last loop starts (_loop_headers).
_INSIDE_END = "max(RBLOCK, RBLOCK * (rnumel // RBLOCK))"
_LATER_WINDOW_LOOPS = tuple(f"for roffset in {loop}({start}, " for loop in ("range", "tl.range")  # plain or pipelined
                            for start in ("RBLOCK", _INSIDE_END))


def loop_header(writer: KernelWriter, variable: str, bounds: str) -> str:
    """A loop over a kernel's steps. With `loop_stages` N above 1 (a launch config's, see
    pipelinable) Triton's software pipeliner issues each load N - 1 steps ahead, through shared
    memory: a step's loads no longer wait for the step before to finish its math."""
    if writer.loop_stages > 1:
        return f"for {variable} in tl.range({bounds}, num_stages={writer.loop_stages}):"
    return f"for {variable} in range({bounds}):"


def pipelinable(writer: KernelWriter) -> bool:
    """Whether the kernel's loads may run ahead of its loop's steps: it has a loop (a looped or a
    mixed-order reduction), and no buffer it stores is one it loads, so a load issued early never
    reads what an earlier step has yet to store."""
    if not writer.mix_rows and (writer.persistent or not writer.is_reduction):
        return False
    lines = [line for section in writer.sections for line in section.lines]
    loaded = {line.buffer for line in lines if isinstance(line, LoadLine)}
    return not loaded & {line.buffer for line in lines if isinstance(line, StoreLine)}


def first_loop_of_each_pass(source: str) -> str:
    """A kernel's source without the second and third loops of row-window passes: they repeat the
    first loop's body over other lanes of the row, so what one loop does to an element (read it,
    then store over it) is what its pass does. For checks that read the source's order."""
    kept, skipping = [], None
    for line in source.splitlines():
        indent = len(line) - len(line.lstrip())
        if skipping is not None and (indent > skipping or not line.strip()):
            continue
        skipping = indent if line.lstrip().startswith(_LATER_WINDOW_LOOPS) else None
        if skipping is None:
            kept.append(line)
    return "\n".join(kept)


def _loop_headers(writer: KernelWriter) -> list[list[str]]:
    """The loop (or loops) over the reduction that each r-section's lines go in. A looped Welford
    reduction's weight is `rstep`, the number of steps in which a lane has met an element of its row."""
    welford = writer.counts_steps
    if writer.row_stride is None:
        step = ["    rstep = roffset // RBLOCK + 1"] if welford else []
        return [[loop_header(writer, "roffset", "0, rnumel, RBLOCK"), "    rindex = roffset + rbase",
                 f"    {RMASK}", "    rxmask = rmask & xmask"] + step]
    # Row windows: lane rpos of the window holds element rpos - rshift of the row. The first and the
    # last steps mask lanes outside the row; the steps between need no mask (they lie inside the row
    # as rshift < RBLOCK), so their loads and stores stay whole vectors.
    window = ["    rpos = roffset + rbase", "    rindex = rpos - rshift"]
    window += ["    rstep = roffset // RBLOCK + (rbase >= rshift).to(tl.int32)"] if welford else []
    masked = window + ["    rmask = (rindex >= 0) & (rindex < rnumel)", "    rxmask = rmask & xmask"]
    inside = window + ["    rxmask = tl.broadcast_to(xmask, [XBLOCK, RBLOCK])"]
    return [["for roffset in range(0, RBLOCK, RBLOCK):"] + masked,  # one step: nothing to run ahead of
            [loop_header(writer, "roffset", f"RBLOCK, {_INSIDE_END}, RBLOCK")] + inside,
            [f"for roffset in range({_INSIDE_END}, rnumel + {ROW_ALIGN - 1}, RBLOCK):"] + masked]
