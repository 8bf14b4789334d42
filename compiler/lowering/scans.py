"""Scans: cumsum and cumprod along one dim, as scan nodes (compiler.ir.SCAN_TYPES).

A scan node runs as a reduction kernel over the scan's rows and keeps every running
total; the pointwise work that makes its input and the work that reads its result fuse
into that kernel as they do around a reduction. A short scan (SCAN_KERNEL_MAX_LENGTH or
fewer elements, registry.py) takes PyTorch's decomposition instead: a sum under a triangular
mask, which unrolls into pointwise work that fuses anywhere.
"""

from __future__ import annotations

from typing import Any

from compiler.lowering import registry
from compiler.lowering.context import LoweringContext
from compiler.lowering.registry import register
from compiler.lowering.values import TensorValue, compute_dtype
from compiler.lowering.views import normalize_dim


def _scan(ctx: LoweringContext, scan_type: str, x: TensorValue, dim: int) -> TensorValue:
    """x scanned along `dim` into a new buffer of the op's output dtype (`dtype=` included)."""
    if x.rank == 0 or 0 in x.size:
        raise NotImplementedError  # nothing to scan: the decomposition's copy
    dim = normalize_dim(dim, x.rank)
    if x.size[dim] <= registry.SCAN_KERNEL_MAX_LENGTH:
        raise NotImplementedError  # a short row: the decomposition's unrolled sums
    accumulate = compute_dtype(ctx.out_dtype)  # float32 for bf16/fp16, int64 for integers and bools

    def body(ops, index, rindex):
        full = list(index[:dim]) + [rindex[0]] + list(index[dim:])
        return ops.to_dtype(x.load(ops, full), accumulate)

    return ctx.scan(x.size, dim, scan_type, body, ctx.out_dtype)


@register("aten.cumsum.default")
def cumsum(ctx: LoweringContext, x: TensorValue, dim: int, *, dtype: Any = None) -> TensorValue:
    return _scan(ctx, "cumsum", x, dim)


@register("aten.cumprod.default")
def cumprod(ctx: LoweringContext, x: TensorValue, dim: int, *, dtype: Any = None) -> TensorValue:
    return _scan(ctx, "cumprod", x, dim)
