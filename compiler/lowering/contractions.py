"""Contractions written as a broadcast multiply and a sum, run as a batched matmul.

Model code sometimes spells a matrix product out: Mamba-2's chunked scan computes its states
as `(C[..., :, None, :, :] * states[..., None, :, :, :]).sum(dim)` and its backward does the
same for the gradients. As a reduction kernel every output element reads a whole row of both
operands: a [4, 4, 256, 32, 64] float32 result over 256 terms took 1.32 ms (Inductor's
reduction 0.88 ms), as one bmm with its operands' copies 0.22 ms (H200, 2026-11-28; docs/PERF.md).
torch.einsum would run it as one bmm too.

Here `sum(mul(a, b), dims)` whose product has no other reader is classified dim by dim:
spanned by both operands and summed (K), by both and kept (batch), by `a` only (M), by `b`
only (N). When M, N and K each reach MIN_GEMM_SIDE, the operands are viewed (or copied) as
[batch, M, K] and [batch, K, N], multiplied by an ATen bmm, and the result is viewed back in
the sum's dim order. A bf16/fp16 operand of a float32 result is converted first, exactly: beside
float32 states eager's multiply promotes it so, and CUDA autocast sums bf16 products into float32
(`sum(..., dtype=torch.float32)`), where the bmm's products are not rounded to bf16 on the way. Anything
else (a dim summed in one operand only, a sum into float64, a mat-vec shape) stays a reduction, where
it fuses with its neighbours.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from compiler.graph import Graph, Ref
from compiler.ir import Layout
from compiler.lowering import views
from compiler.lowering.values import Lazy, StorageView, TensorValue

CONTRACTIONS_AS_MATMUL = True  # off: every such sum is a reduction kernel (A/B runs, bench/switch_ab.py)
MIN_GEMM_SIDE = 16  # below this, a side of the product reuses its operands too little for a GEMM
_SUMS = frozenset({"aten.sum.dim_IntList"})
_FLOATS = frozenset({"float32", "bfloat16", "float16"})

# lower(target, args) -> the lowered value of one ATen call
Lower = Callable[[str, list], Any]


def contraction_sums(graph: Graph, users: dict[str, int]) -> dict[str, Any]:
    """Sum nodes over a `mul.Tensor` that nothing else reads (`users`: each node's references from
    the graph's nodes and outputs): sum node name -> the mul node."""
    muls = {node.name: node for node in graph.nodes if node.target == "aten.mul.Tensor"}
    found: dict[str, Any] = {}
    for node in graph.nodes:
        source = node.args[0] if node.args else None
        if node.target in _SUMS and isinstance(source, Ref) and source.index is None and source.ref in muls \
                and users.get(source.ref) == 1:
            found[node.name] = muls[source.ref]
    return found


def as_matmul(a: Any, b: Any, dims: Any, out_size: tuple[int, ...], out_dtype: str, lower: Lower) -> TensorValue | None:
    """sum(a * b, dims) as a bmm viewed as the sum's result (`out_size`, keepdim's unit dims
    included), or None where it is no contraction worth one (see the module docstring)."""
    if not CONTRACTIONS_AS_MATMUL or not (isinstance(a, StorageView) and isinstance(b, StorageView)):
        return None
    if not dims or not all(_widens_exactly(d, out_dtype) for d in (a.dtype, b.dtype)):
        return None
    rank = max(a.rank, b.rank)
    a, b = _with_rank(a, rank), _with_rank(b, rank)
    summed = {views.normalize_dim(d, rank) for d in ([dims] if isinstance(dims, int) else dims)}
    roles = _roles(a, b, summed)
    if roles is None:
        return None
    batch, m, n, k = roles
    full = [max(x, y) for x, y in zip(a.size, b.size)]
    sizes = [math.prod(full[d] for d in group) for group in (batch, m, n, k)]
    if min(sizes[1:]) < MIN_GEMM_SIDE:
        return None
    left = _as_dtype(views.reshape(_spanned(a, batch + m + k), [sizes[0], sizes[1], sizes[3]]), out_dtype)
    right = _as_dtype(views.reshape(_spanned(b, batch + k + n), [sizes[0], sizes[3], sizes[2]]), out_dtype)
    product = lower("aten.bmm.default", [left, right])
    kept = batch + m + n
    laid_out = views.reshape(product, [full[d] for d in kept])
    order = [d for d in range(rank) if d not in summed and full[d] > 1]
    result = views.reshape(views.permute(laid_out, [kept.index(d) for d in order]), list(out_size))
    # eager's sum is contiguous: a permuted view is copied (a copy that fuses into what reads it)
    if isinstance(result, StorageView) and result.layout != Layout.contiguous(out_size, out_dtype):
        return Lazy(result.size, result.dtype, result.load)
    return result


def _widens_exactly(dtype: str, out_dtype: str) -> bool:
    """Whether an operand of `dtype` converts to the sum's `out_dtype` without rounding (bf16 or fp16
    into float32)."""
    if out_dtype not in _FLOATS:
        return False
    return dtype == out_dtype or (dtype in ("bfloat16", "float16") and out_dtype == "float32")


def _as_dtype(value: TensorValue, dtype: str) -> TensorValue:
    """`value` converted to `dtype` (a copy the bmm's argument realizes), or itself."""
    if value.dtype == dtype:
        return value
    return Lazy(value.size, dtype, lambda ops, index: ops.to_dtype(value.load(ops, index), dtype))


def _with_rank(value: StorageView, rank: int) -> TensorValue:
    """`value` with leading unit dims up to `rank`, as broadcasting aligns it."""
    return views.reshape(value, [1] * (rank - value.rank) + list(value.size)) if value.rank < rank else value


def _spans(value: StorageView, dim: int) -> bool:
    """Whether `value` varies along `dim` (not a unit dim, not an expanded one)."""
    return value.size[dim] > 1 and value.layout.stride[dim] != 0


def _roles(a: TensorValue, b: TensorValue, summed: set[int]) -> tuple[list[int], ...] | None:
    """(batch, M, N, K) dims, or None where some dim fits no role (summed in one operand only) or an
    operand is no strided view (its broadcast dims unknown)."""
    if not (isinstance(a, StorageView) and isinstance(b, StorageView)):
        return None
    batch, m, n, k = [], [], [], []
    for d in range(a.rank):
        in_a, in_b = _spans(a, d), _spans(b, d)
        if not (in_a or in_b):
            if max(a.size[d], b.size[d]) > 1:
                return None  # copies of one value: summed, a scale; kept, a broadcast of the result
            continue
        if d in summed:
            if not (in_a and in_b):
                return None
            k.append(d)
        elif in_a and in_b:
            batch.append(d)
        else:
            (m if in_a else n).append(d)
    return batch, m, n, k


def _spanned(value: StorageView, dims: list[int]) -> StorageView:
    """`value` seen along `dims` only, in that order (the dims it does not span dropped)."""
    layout = value.layout
    return StorageView(value.buffer, Layout(tuple(layout.size[d] for d in dims), tuple(layout.stride[d] for d in dims),
                                            layout.offset, layout.dtype))
