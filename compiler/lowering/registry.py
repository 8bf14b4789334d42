"""Which ATen ops have a handwritten lowering, which always run as extern, and the
decomposition table used for everything else."""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable

import torch

LOWERINGS: dict[str, Callable[..., Any]] = {}
# Random ops drawn in kernels (lowering/random.py): used instead of the ATen call unless the
# compile asks for eager's random numbers (CompileOptions.eager_random).
RANDOM_LOWERINGS: dict[str, Callable[..., Any]] = {}

# Ops that must stay ATen calls: decomposing a matmul into loops would be correct and slow.
EXTERN_ALWAYS = frozenset({
    "aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.baddbmm.default",
    "aten.matmul.default", "aten.linear.default", "aten.convolution.default",
    "aten.convolution_backward.default", "aten.addmv.default", "aten.mv.default", "aten.dot.default",
})
# Fused attention kernels (forward and backward, every backend's spelling) stay ATen calls too.
_EXTERN_PREFIXES = ("aten._scaled_dot_product_", "aten._flash_attention", "aten._efficient_attention",
                    "aten._cudnn_attention", "aten._fused_sdp")


# Scans: PyTorch decomposes cumsum and cumprod into a sum (a product) under a triangular mask, so a
# row of n elements costs n loads per element. Short rows keep that decomposition, fused with their
# neighbours; longer ones are scan nodes (lowering/scans.py). Mamba-2's chunked scans (rows of 256,
# 4 x 32 x 4 x 256 x 256 float32) took 1.9-2.5 ms as masked sums, 0.14-0.24 ms as ATen calls with
# their neighbours in kernels, 0.075-0.091 ms as scan kernels with their neighbours fused in (Inductor's
# 0.11-0.12; H200, 2026-11-28, bench/switch_ab.py).
SCANS = frozenset({"aten.cumsum.default", "aten.cumprod.default"})
SCAN_KERNEL_MAX_LENGTH = 16
SCAN_KERNELS = True  # off: the long scans run as ATen calls (A/B runs, bench/switch_ab.py)


def long_scan(target: str, args: list, kwargs: dict, out_meta: list) -> bool:
    """Whether the op is a scan along more than SCAN_KERNEL_MAX_LENGTH elements that runs as an ATen
    call (SCAN_KERNELS off)."""
    if SCAN_KERNELS or target not in SCANS or not out_meta or out_meta[0] is None:
        return False
    shape = out_meta[0].shape
    dim = kwargs.get("dim", args[1] if len(args) > 1 else 0)
    return len(shape) > 0 and shape[dim] > SCAN_KERNEL_MAX_LENGTH


def always_extern(op: Any) -> bool:
    """Whether the op runs as an ATen call whatever lowerings exist. Random ops (tagged
    nondeterministic_seeded: dropout, bernoulli, rand...) do, so that a compiled graph draws
    from torch's generator exactly as eager does: same seed, same masks."""
    target = str(op)
    return (target in EXTERN_ALWAYS or target.startswith(_EXTERN_PREFIXES)
            or torch.Tag.nondeterministic_seeded in getattr(op, "tags", ()))


def register(*targets: str, table: dict[str, Callable[..., Any]] = LOWERINGS) -> Callable:
    """Registers a lowering `fn(ctx, *args, **kwargs)` for each ATen overload name."""

    def wrap(fn: Callable) -> Callable:
        for target in targets:
            table[target] = fn
        return fn

    return wrap


@lru_cache(maxsize=1)
def decomposition_table() -> dict:
    """PyTorch's core ATen decompositions, minus ops we lower ourselves or keep extern."""
    from torch._decomp import core_aten_decompositions

    return {op: fn for op, fn in core_aten_decompositions().items()
            if isinstance(op, torch._ops.OpOverload) and str(op) not in LOWERINGS and not always_extern(op)}


def decomposition_for(op: Any) -> Callable | None:
    from torch._decomp import decomposition_table as all_decompositions

    return decomposition_table().get(op) or all_decompositions.get(op)
