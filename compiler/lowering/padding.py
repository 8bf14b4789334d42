"""Padded row strides for matrices that kernels write and matmuls read.

cuBLAS picks its fast kernels (on Hopper, `nvjet_sm90_*`) only when every matrix's rows start
at aligned addresses. A bf16 matrix of 50257 columns (the cross-entropy gradient of a GPT-2
vocabulary) has rows 100514 bytes apart: the GEMMs reading it fall back to slow `align1`
kernels, three times slower. Inductor pads such strides ("comprehensive padding"); so do we,
for the buffers where it pays and is safe:

- the wire node's result reaches an `mm`/`addmm`/`bmm`/`baddbmm` argument through views only;
- it is no graph output, nor viewed by one (callers get the strides eager gives);
- lowering computes it in a kernel (a lazy value), so the kernel simply stores with the padded
  stride: no copy is added.

An operand that lowering does not compute (a graph input such as the cross-entropy gradient
handed to a backward graph, a transposed view) gets a padded copy instead when it is big enough
for the copy to pay; and aligned rows are not enough when a product's M, N or K is itself not a
multiple of 16 bytes (cuBLAS's fast kernels load whole vectors along K): for big products those
dims are zero-padded and the result sliced back (`pad_matmul`, Inductor's `pad_mm` without the
timing). One copy kernel per tensor, shared by the GEMMs that read it in either orientation.

`padded_layout` gives the row stride a multiple of 128 bytes (Inductor's alignment) for rows of
1024 elements or more, else of 16 bytes; rows already aligned are left alone.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from compiler.graph import ITEMSIZES, Graph, Ref
from compiler.ir import Layout

if TYPE_CHECKING:
    from compiler.lowering.context import LoweringContext
    from compiler.lowering.values import Lazy, StorageView, TensorValue

MATMUL_OPS = {"mm": (0, 1), "addmm": (1, 2), "bmm": (0, 1), "baddbmm": (1, 2)}  # op -> matrix arguments
RESHAPES = frozenset({"view", "reshape", "_unsafe_view"})  # kept only when they keep the last dim
TRANSPOSES = frozenset({"t", "transpose", "permute"})  # always expressible; nothing may view their result again
MIN_ALIGN_BYTES, WIDE_ALIGN_BYTES, WIDE_ROW = 16, 128, 1024
COPY_MIN_NUMEL, COPY_MIN_DIM = 1 << 20, 64  # smaller operands keep their layout: a copy would not pay
PAD_MIN_WORK = 1 << 30  # batch * M * N * K of a product whose misaligned dims are worth zero-padding


def matmul_operands(graph: Graph, graph_outputs: set[str]) -> dict[str, list[int]]:
    """The wire nodes whose results are worth padding (see the module docstring), each with the
    last sizes its reshapes ask for: padding is safe when they all equal its own last size (a
    reshape that keeps rows whole is a view of the padded layout; one that merges rows is not).
    `graph_outputs`: `viewed_by_outputs(graph)`, never padded."""
    op_of = {node.name: node.target.split(".")[1] for node in graph.nodes}
    args_of = {node.name: node.args for node in graph.nodes}
    users: dict[str, list] = {}
    for node in graph.nodes:
        for arg in node.args:
            if isinstance(arg, Ref):
                users.setdefault(arg.ref, []).append(node)
    found: dict[str, list[int]] = {}
    for node in graph.nodes:
        for position in MATMUL_OPS.get(op_of[node.name], ()):
            if position < len(node.args) and isinstance(node.args[position], Ref):
                name = _through_views(node.args[position].ref, args_of, op_of)
                if name in op_of and name not in found and name not in graph_outputs:
                    lasts = _reshape_lasts(name, users, op_of)
                    if lasts is not None:
                        found[name] = lasts
    return found


def _through_views(name: str, args_of: dict[str, list], op_of: dict[str, str]) -> str:
    while op_of.get(name) in RESHAPES | TRANSPOSES and args_of[name] and isinstance(args_of[name][0], Ref):
        name = args_of[name][0].ref
    return name


def _reshape_lasts(name: str, users: dict[str, list], op_of: dict[str, str]) -> list[int] | None:
    """Last sizes of the reshapes among `name`'s view users; None when padding it is unsafe: a view
    of it is viewed in a way that may cross rows."""
    lasts: list[int] = []
    pending = [(name, False)]  # (value, already transposed)
    while pending:
        value, transposed = pending.pop()
        for user in users.get(value, []):
            op = op_of[user.name]
            if op in RESHAPES and not transposed and user.args[0] == Ref(ref=value) and len(user.args) > 1 \
                    and isinstance(user.args[1], list) and user.args[1] and isinstance(user.args[1][-1], int):
                lasts.append(user.args[1][-1])
                pending.append((user.name, False))
            elif op in TRANSPOSES and not transposed:
                pending.append((user.name, True))
            elif op in RESHAPES | TRANSPOSES or is_view(user.target):
                return None  # a view we cannot vouch for
    return lasts


def viewed_by_outputs(graph: Graph) -> set[str]:
    """The graph's outputs and the nodes they are views of (a result whose strides the caller sees)."""
    return viewed_through(graph, [ref.ref for ref in graph.outputs])


def viewed_through(graph: Graph, names: list[str]) -> set[str]:
    """`names` and every value they are views of, directly or through other views."""
    base_of = {node.name: node.args[0].ref for node in graph.nodes
               if node.args and isinstance(node.args[0], Ref) and is_view(node.target)}
    seen: set[str] = set()
    for start in names:
        name: str | None = start
        while name is not None and name not in seen:
            seen.add(name)
            name = base_of.get(name)
    return seen


def is_view(target: str) -> bool:
    """Whether the op's result may alias its input (slice, select, expand, as_strided...)."""
    from compiler.fx_import import resolve_op

    try:
        return any(r.alias_info is not None for r in resolve_op(target)._schema.returns)
    except Exception:
        return True


def padded_layout(layout: Layout) -> Layout:
    """`layout` (row-major, 2 dims or more) with its row stride padded; unchanged if aligned already,
    and for rows of one element (a column that cuBLAS reads as a vector, or the operand of an
    outer product, which is no GEMM: padding would only multiply its bytes)."""
    size = layout.size
    if len(size) < 2 or layout.stride != Layout.contiguous(size, layout.dtype).stride or size[-2] <= 1 or size[-1] <= 1:
        return layout
    itemsize = ITEMSIZES[layout.dtype]
    row = size[-1]
    if (row * itemsize) % MIN_ALIGN_BYTES == 0:
        return layout
    align = (WIDE_ALIGN_BYTES if row >= WIDE_ROW else MIN_ALIGN_BYTES) // itemsize
    strides = [1, -(-row // align) * align]
    for dim in reversed(size[1:-1]):
        strides.append(strides[-1] * dim)
    return Layout(size, tuple(reversed(strides)), layout.offset, layout.dtype)


def pad_matmul(ctx: "LoweringContext", target: str, args: list) -> tuple[list, tuple[int, int] | None]:
    """A matmul's arguments with operands cuBLAS reads fast, and the (rows, columns) to slice its
    result back to (None: no slice). Like Inductor's `pad_mm`, without the timing: when the product
    is big, dims that are not multiples of 16 bytes are zero-padded (K: the product is unchanged;
    M and N: the result is read as the corner of a padded product, and `addmm`'s bias is padded
    with it, so it stays one cuBLAS call with its bias epilogue); otherwise operands only get
    aligned rows (`padded_operand`). A sliced product that is a graph output is copied densely by
    the caller (callers get the strides eager gives)."""
    op = target.split(".")[1]
    first, second = MATMUL_OPS[op]
    a, b = ctx.realize(args[first]), ctx.realize(args[second])
    *batch, m, k = a.size
    n = b.size[-1]
    unit = MIN_ALIGN_BYTES // ITEMSIZES[a.dtype]
    big = math.prod(batch) * m * n * k >= PAD_MIN_WORK and min(m, n, k) >= COPY_MIN_DIM
    padded_k = _round_up(k, unit) if big else k
    # a graph output is copied densely after a padded product: worth it only for the output's own rows
    slice_result = big and (n % unit or ctx.origin not in ctx.graph_outputs)
    padded_m, padded_n = (_round_up(m, unit), _round_up(n, unit)) if slice_result else (m, n)
    new = list(args)
    new[first] = padded_operand(ctx, a, (*batch, padded_m, padded_k))
    new[second] = padded_operand(ctx, b, (*batch, padded_k, padded_n))
    if (padded_m, padded_n) == (m, n):
        return new, None
    if first == 1:  # addmm / baddbmm: the added tensor grows with the product
        new[0] = padded_addend(ctx, args[0], (*batch, m, n), (*batch, padded_m, padded_n))
    return new, (m, n)


def padded_addend(ctx: "LoweringContext", value: "TensorValue", size: tuple[int, ...],
                  padded: tuple[int, ...]) -> "TensorValue":
    """`addmm`'s input (broadcast to the product's `size`), zero-padded where its dims are the
    product's own (a bias of N grows to the padded N; broadcast dims of 1 stay)."""
    view = ctx.realize(value)
    offset = len(size) - len(view.size)
    grown = tuple(p if s == size[offset + d] and s != p else s
                  for d, (s, p) in enumerate(zip(view.size, padded[offset:])))
    if grown == view.size:
        return view
    return ctx.realize(_zero_filled(view, grown))


def _round_up(size: int, unit: int) -> int:
    return -(-size // unit) * unit


def padded_operand(ctx: "LoweringContext", value: "TensorValue", sizes: tuple[int, ...]) -> "StorageView":
    """`value` zero-padded to `sizes`, with aligned rows, laid out in its own dim order (so a tensor
    and its transpose share one copy); `value` itself when nothing needs padding or it is small."""
    from compiler.lowering.values import StorageView

    view = ctx.realize(value)
    layout = view.layout
    grows = tuple(sizes) != layout.size
    if len(layout.size) < 2 or not grows and (layout.numel < COPY_MIN_NUMEL or min(layout.size[-2:]) < COPY_MIN_DIM
                                               or leading_dim_aligned(layout)):
        return view
    order = sorted(range(len(layout.size)), key=lambda d: (-layout.stride[d], d))  # outermost first
    key = (view.buffer.name, layout.offset, tuple((layout.size[d], layout.stride[d], sizes[d]) for d in order))
    copy = ctx.padded_copies.get(key)
    if copy is None:
        source = StorageView(view.buffer, Layout(tuple(layout.size[d] for d in order),
                                                 tuple(layout.stride[d] for d in order), layout.offset, layout.dtype))
        size = tuple(sizes[d] for d in order)
        target = padded_layout(Layout.contiguous(size, layout.dtype))
        if not grows and not leading_dim_aligned(target):
            return view
        copy = ctx.padded_copies[key] = ctx.realize(_zero_filled(source, size) if grows else source, target)
    stride = [0] * len(order)
    for position, dim in enumerate(order):
        stride[dim] = copy.layout.stride[position]
    return StorageView(copy.buffer, Layout(tuple(sizes), tuple(stride), 0, layout.dtype))


def _zero_filled(source: "TensorValue", size: tuple[int, ...]) -> "Lazy":
    from compiler.lowering.values import Lazy, compute_dtype

    dtype = compute_dtype(source.dtype)
    grown = [d for d, (old, new) in enumerate(zip(source.size, size)) if new != old]

    def load(ops, index):
        inside = None
        for d in grown:
            ok = ops.lt(ops.index_expr(index[d], "int64"), ops.constant(source.size[d], "int64"))
            inside = ok if inside is None else ops.logical_and(inside, ok)
        return ops.masked(inside, lambda: ops.to_dtype(source.load(ops, index), dtype), 0.0)

    return Lazy(size, source.dtype, load)


def leading_dim_aligned(layout: Layout) -> bool:
    """Whether cuBLAS sees aligned rows (or columns): the matrix's non-unit stride, any batch
    stride and the offset are multiples of 16 bytes. A matrix with no unit stride counts as
    aligned: ATen copies it before calling cuBLAS anyway."""
    rows, cols = layout.size[-2:]
    row_stride, col_stride = layout.stride[-2:]
    if col_stride == 1 or cols == 1:
        lead = row_stride if rows > 1 else 0
    elif row_stride == 1 or rows == 1:
        lead = col_stride
    else:
        return True
    itemsize = ITEMSIZES[layout.dtype]
    batch_strides = [st for st, s in zip(layout.stride[:-2], layout.size[:-2]) if s > 1]
    return all((n * itemsize) % MIN_ALIGN_BYTES == 0 for n in (lead, layout.offset, *batch_strides))
