"""Random ops drawn inside kernels: dropout, rand, randn, bernoulli, uniform.

Each random op of a graph gets its own int64 seed; one ATen randint per graph call draws
them all from torch's generator, so `torch.manual_seed` makes a compiled run repeatable and
a CUDA-graph replay draws fresh seeds. Element i of an op's result is Philox(seed, i), i its
offset in the contiguous result: the same number wherever a kernel evaluates it, so a reader
that recomputes a random value (rather than loading it) gets exactly the stored one.

The numbers differ from eager's (ATen keeps its own Philox streams). A compile with
`CompileOptions.eager_random` keeps the ATen calls instead: the same masks as eager under
the same seed, one extra launch per random op.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import sympy

from compiler.ir import Layout
from compiler.lowering.context import LoweringContext
from compiler.lowering.registry import RANDOM_LOWERINGS, register
from compiler.lowering.values import Lazy, TensorValue, compute_dtype


def random_values(ctx: LoweringContext, size: Sequence[int], kind: str) -> Lazy:
    """float32 Philox numbers of shape `size`: kind "rand" (uniform in [0, 1)) or "randn"."""
    buffer, position = ctx.random_seed()
    size = tuple(size)
    strides = Layout.contiguous(size, "float32").stride
    offset_dtype = "int32" if math.prod(size) < 2**31 else "int64"  # Philox counters are 32 bits: past 2**32 they repeat

    def load(ops: Any, index: Sequence[Any]) -> Any:
        seed = ops.load(buffer, sympy.Integer(position))
        offset = ops.index_expr(sum((i * s for i, s in zip(index, strides)), sympy.Integer(0)), offset_dtype)
        return getattr(ops, kind)(seed, offset)

    return Lazy(size, "float32", load)


def _no_generator(generator: Any) -> None:
    if generator is not None:
        raise NotImplementedError  # a user's own generator: only ATen can draw from it


@register("aten.native_dropout.default", table=RANDOM_LOWERINGS)
def native_dropout(ctx: LoweringContext, x: TensorValue, p: float, train: bool | None) -> tuple[Lazy, Lazy]:
    """(x * keep / (1 - p), keep) with keep = uniform > p; x and an all-true mask when not training.
    Dropped elements are x * 0, as in eager (a NaN stays NaN)."""
    acc = compute_dtype(x.dtype)
    if not train or p == 0:
        return Lazy(x.size, x.dtype, x.load), Lazy(x.size, "bool", lambda ops, index: ops.constant(True, "bool"))
    uniform = random_values(ctx, x.size, "rand")
    scale = 1.0 / (1.0 - p) if p < 1 else 0.0

    def keep(ops: Any, index: Sequence[Any]) -> Any:
        return ops.gt(uniform.load(ops, index), ops.constant(float(p), "float32"))

    def out(ops: Any, index: Sequence[Any]) -> Any:
        kept = ops.mul(x.load(ops, index), ops.to_dtype(keep(ops, index), acc))
        return ops.mul(kept, ops.constant(scale, acc))

    return Lazy(x.size, x.dtype, out), Lazy(x.size, "bool", keep)


def _drawn(ctx: LoweringContext, kind: str, transform: Any = None) -> Lazy:
    """The node's output (shape and dtype from its meta) filled with `kind` numbers, transformed."""
    values, dtype = random_values(ctx, ctx.out_size, kind), ctx.out_dtype

    def load(ops: Any, index: Sequence[Any]) -> Any:
        drawn = values.load(ops, index)
        return ops.to_dtype(transform(ops, drawn, index) if transform else drawn, compute_dtype(dtype))

    return Lazy(values.size, dtype, load)


@register("aten.rand.default", "aten.rand_like.default", table=RANDOM_LOWERINGS)
def rand(ctx: LoweringContext, *args: Any, generator: Any = None, **kwargs: Any) -> Lazy:
    _no_generator(generator)
    return _drawn(ctx, "rand")


@register("aten.randn.default", "aten.randn_like.default", table=RANDOM_LOWERINGS)
def randn(ctx: LoweringContext, *args: Any, generator: Any = None, **kwargs: Any) -> Lazy:
    _no_generator(generator)
    return _drawn(ctx, "randn")


@register("aten.bernoulli.p", table=RANDOM_LOWERINGS)
def bernoulli_p(ctx: LoweringContext, x: TensorValue, p: float = 0.5, generator: Any = None) -> Lazy:
    """Ones with probability p, in x's shape and dtype."""
    _no_generator(generator)
    return _drawn(ctx, "rand", lambda ops, u, index: ops.lt(u, ops.constant(float(p), "float32")))


@register("aten.bernoulli.default", table=RANDOM_LOWERINGS)
def bernoulli(ctx: LoweringContext, probabilities: TensorValue, generator: Any = None) -> Lazy:
    """Ones where a uniform number falls below the element's probability."""
    _no_generator(generator)
    return _drawn(ctx, "rand", lambda ops, u, index: ops.lt(u, ops.to_dtype(probabilities.load(ops, index), "float32")))


@register("aten.uniform.default", table=RANDOM_LOWERINGS)
def uniform(ctx: LoweringContext, x: TensorValue, low: float = 0.0, high: float = 1.0, generator: Any = None) -> Lazy:
    _no_generator(generator)
    return _drawn(ctx, "rand", lambda ops, u, index: ops.add(
        ops.mul(u, ops.constant(float(high - low), "float32")), ops.constant(float(low), "float32")))
