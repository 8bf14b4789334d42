"""Strided reads of a paired kernel (compiler/paired_lanes.py) as aligned vector loads.

In a kernel walked two outputs at a time ([XBLOCK, 2] blocks, rindex the output's lane), a read
at 2*rindex + start + offset (`start` a multiple of 4, 0 <= offset < 4) wants, for the pair's two
lanes, elements offset and offset + 2 past `start`. Both lie in the run of 4 at `start` when
offset < 2; otherwise lane 0's lies in that run and lane 1's in the next. Each run is one load of
[XBLOCK, 4], shared by every read that needs it, and split into its even and odd elements
(`tl.reshape` to [XBLOCK, 2, 2], `tl.split`): the even ones are offset 0 for both lanes, the odd
ones offset 1. A 3x3 window of stride 2 reads the runs before and at 4 * (j // 2) on each of its
rows: two vector loads per row for two outputs.

A run may reach past the ends of the buffer where the read itself does not (the first row's
left neighbour): it is masked by the buffer's bounds alone, which keeps the mask the same for the
4 elements of an aligned run, so Triton still loads it as one vector. The read's own mask (a
window in the padding, a row past the end) applies where the value is used: a masked load is
always wrapped in `ops.masked`, whose `tl.where` replaces what the lanes outside it hold, and a
store is masked by the kernel's bounds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from compiler.codegen.values import Var
from compiler.indexing import Expr
from compiler.paired_lanes import RUN, pair_read

if TYPE_CHECKING:
    from compiler.codegen.kernel import KernelWriter


def lane_load(writer: "KernelWriter", buffer: str, index: Expr, extent: int) -> Var | None:
    """The value of a strided read of a paired kernel, shape [XBLOCK, 2], in float32 for a 16-bit
    float buffer as every load is; None if `index` is no such read. `extent`: the elements the
    buffer's storage holds."""
    found = pair_read(index)
    if found is None:
        return None
    start, offset = found
    if offset < 2:
        return _parity(writer, buffer, start, extent, offset)
    this_run = _parity(writer, buffer, start, extent, offset - 2)
    next_run = _parity(writer, buffer, start + RUN, extent, offset - 2)
    # lane 0 takes the second element of this run's parity, lane 1 the first of the next run's
    return writer.emit(f"tl.join(tl.split({this_run})[1], tl.split({next_run})[0])", this_run.dtype)


def _parity(writer: "KernelWriter", buffer: str, start: Expr, extent: int, parity: int) -> Var:
    """The run of RUN elements at `start`, its even (parity 0) or odd (1) elements: [XBLOCK, 2]."""
    run = _run(writer, buffer, start, extent)
    pairs = writer.emit(f"tl.split(tl.reshape({run}, [XBLOCK, 2, 2]))", run.dtype)
    return writer.emit(f"{pairs}[{parity}]", run.dtype)


def _run(writer: "KernelWriter", buffer: str, start: Expr, extent: int) -> Var:
    from compiler.codegen.kernel import LoadLine

    offsets = f"({writer.index(start)} + tl.arange(0, {RUN})[None, :])"
    inside = f"({offsets} >= 0) & ({offsets} < {extent})"
    call = f"tl.load({writer.pointer(buffer)} + {offsets}, {inside}, other=0"
    dtype = writer.buffer_dtypes[buffer]
    return writer.computed(writer.emit(call, dtype, lambda name: LoadLine(buffer, f"{name} = {call}", False)))
