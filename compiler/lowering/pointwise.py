"""Elementwise ATen ops: math, comparisons, logic, casts, where, clamp, creation ops.

Type promotion follows PyTorch: the result dtype comes from running the op on meta
tensors (`ctx.out_dtype`); operands are cast to the computation dtype (bf16/fp16 math
in float32) before the op, and the store casts to the result dtype.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch

from compiler.fx_import import dtype_name
from compiler.lowering.context import LoweringContext
from compiler.lowering.registry import register
from compiler.lowering.values import (FLOATS, LOW_PRECISION, Lazy, TensorValue, Uninitialized, compute_dtype,
                                      known_value)
from compiler.lowering.views import broadcast_to

Operand = TensorValue | int | float | bool


def operand_loader(value: Operand, size: Sequence[int], dtype: str) -> Callable:
    """A loader of `value` broadcast to `size`, cast to `dtype`'s compute type."""
    target = compute_dtype(dtype)
    if isinstance(value, TensorValue):
        value = broadcast_to(value, size)
        return lambda ops, index: ops.to_dtype(value.load(ops, index), target)
    return lambda ops, index: ops.constant(value, target)


def promoted_dtype(*operands: Operand) -> str:
    """torch's type promotion over tensors and Python scalars (0-dim tensors count as scalars)."""
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

    metas = [torch.empty((1,) * v.rank, dtype=getattr(torch, v.dtype), device="meta") if isinstance(v, TensorValue) and v.rank
             else torch.empty((), dtype=getattr(torch, v.dtype), device="meta") if isinstance(v, TensorValue) else v
             for v in operands]
    _, result = elementwise_dtypes(*metas, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)
    return dtype_name(result)


def elementwise(ctx: LoweringContext, operands: Sequence[Operand], fn: Callable, dtype: str | None = None) -> Lazy:
    """out[i] = fn(ops, *operands[i]) with operands broadcast and cast to `dtype` (default: result dtype)."""
    size = ctx.out_size
    loaders = [operand_loader(v, size, dtype or ctx.out_dtype) for v in operands]
    return Lazy(size, ctx.out_dtype, lambda ops, index: fn(ops, *[load(ops, index) for load in loaders]))


# --- unary math ------------------------------------------------------------------------

_UNARY = {
    "exp": "exp", "exp2": "exp2", "log": "log", "log2": "log2", "log1p": "log1p", "expm1": "expm1",
    "sqrt": "sqrt", "rsqrt": "rsqrt", "abs": "abs", "neg": "neg", "sin": "sin", "cos": "cos", "tan": "tan",
    "tanh": "tanh", "sigmoid": "sigmoid", "erf": "erf", "floor": "floor", "ceil": "ceil",
    "trunc": "trunc", "round": "round", "sign": "sign", "sgn": "sign", "reciprocal": "reciprocal",
    "relu": "relu", "bitwise_not": "bitwise_not", "atan": "atan",
    "sinh": "sinh", "cosh": "cosh",
}
# erfinv and lgamma are left to ATen (extern): Triton's interpreter has no implementation of
# them, so a kernel for the cpu target could not compute them, and training steps rarely use them.


def _register_unary(aten_name: str, op_name: str) -> None:
    @register(f"aten.{aten_name}.default")
    def lower_unary(ctx: LoweringContext, x: TensorValue) -> Lazy:
        if op_name == "bitwise_not" and x.dtype == "bool":
            return elementwise(ctx, [x], lambda ops, a: ops.logical_not(a))
        return elementwise(ctx, [x], lambda ops, a: getattr(ops, op_name)(a))


for _aten, _op in _UNARY.items():
    _register_unary(_aten, _op)


@register("aten.asin.default")
def asin(ctx: LoweringContext, x: TensorValue) -> Lazy:
    """asin(x) = atan2(x, sqrt((1 - x)(1 + x))): the interpreter has atan2 but no asin."""
    dtype = ctx.out_dtype  # read now: the body runs later, when ctx describes another node
    return elementwise(ctx, [x], lambda ops, a: ops.atan2(a, _sqrt_one_minus_square(ops, a, dtype)))


@register("aten.acos.default")
def acos(ctx: LoweringContext, x: TensorValue) -> Lazy:
    dtype = ctx.out_dtype
    return elementwise(ctx, [x], lambda ops, a: ops.atan2(_sqrt_one_minus_square(ops, a, dtype), a))


def _sqrt_one_minus_square(ops: Any, a: Any, dtype: str) -> Any:
    one = ops.constant(1.0, compute_dtype(dtype))
    return ops.sqrt(ops.mul(ops.sub(one, a), ops.add(one, a)))


def _register_predicate(aten_name: str, build: Callable) -> None:
    register(f"aten.{aten_name}.default")(
        lambda ctx, x: elementwise(ctx, [x], lambda ops, a: build(ops, a), dtype=compute_dtype(x.dtype)))


_register_predicate("isnan", lambda ops, a: ops.isnan(a))
_register_predicate("isinf", lambda ops, a: ops.isinf(a))
_register_predicate("isfinite", lambda ops, a: ops.logical_not(ops.logical_or(ops.isnan(a), ops.isinf(a))))
_register_predicate("logical_not", lambda ops, a: ops.logical_not(a))


# --- identities: x + 0, x - 0, x * 1, x / 1 -----------------------------------------------

PASS_ON_IDENTITIES = True  # switch for A/B runs (bench/switch_ab.py)


def unchanged(ctx: LoweringContext, keep: Operand, other: Operand, identity: int) -> TensorValue | None:
    """`keep` itself where `other` is `identity` everywhere and `keep` has the result's size and
    dtype already: `x + zeros_like(y)` makes no new values, so no kernel computes them, and a buffer
    is passed on as it is (Inductor's joint-graph pass removes the same ops). Not in a graph that
    writes a tensor in place, where `keep` could change under the result."""
    if not PASS_ON_IDENTITIES or ctx.writes_in_place or not isinstance(keep, TensorValue) or ctx.out_dtype == "bool":
        return None
    if tuple(keep.size) != tuple(ctx.out_size) or keep.dtype != ctx.out_dtype:
        return None
    if known_value(other, ctx.constant_buffers) != identity:
        return None
    return keep


# --- binary math -----------------------------------------------------------------------

def _with_alpha(ops: Any, b: Any, alpha: Any, dtype: str) -> Any:
    return b if alpha == 1 else ops.mul(b, ops.constant(alpha, dtype))


@register("aten.add.Tensor", "aten.add.Scalar")
def add(ctx: LoweringContext, a: Operand, b: Operand, alpha: Any = 1) -> TensorValue:
    same = unchanged(ctx, a, b, 0) or (unchanged(ctx, b, a, 0) if alpha == 1 else None)
    if same is not None:
        return same
    dtype = compute_dtype(ctx.out_dtype)
    if ctx.out_dtype == "bool":
        return elementwise(ctx, [a, b], lambda ops, x, y: ops.logical_or(x, y))
    return elementwise(ctx, [a, b], lambda ops, x, y: ops.add(x, _with_alpha(ops, y, alpha, dtype)))


@register("aten.sub.Tensor", "aten.sub.Scalar")
def sub(ctx: LoweringContext, a: Operand, b: Operand, alpha: Any = 1) -> TensorValue:
    same = unchanged(ctx, a, b, 0)
    if same is not None:
        return same
    dtype = compute_dtype(ctx.out_dtype)
    return elementwise(ctx, [a, b], lambda ops, x, y: ops.sub(x, _with_alpha(ops, y, alpha, dtype)))


@register("aten.rsub.Tensor", "aten.rsub.Scalar")
def rsub(ctx: LoweringContext, a: Operand, b: Operand, alpha: Any = 1) -> Lazy:
    dtype = compute_dtype(ctx.out_dtype)
    return elementwise(ctx, [a, b], lambda ops, x, y: ops.sub(y, _with_alpha(ops, x, alpha, dtype)))


@register("aten.mul.Tensor", "aten.mul.Scalar")
def mul(ctx: LoweringContext, a: Operand, b: Operand) -> TensorValue:
    same = unchanged(ctx, a, b, 1) or unchanged(ctx, b, a, 1)
    if same is not None:
        return same
    if ctx.out_dtype == "bool":
        return elementwise(ctx, [a, b], lambda ops, x, y: ops.logical_and(x, y))
    return elementwise(ctx, [a, b], lambda ops, x, y: ops.mul(x, y))


@register("aten.div.Tensor", "aten.div.Scalar", "aten.true_divide.Tensor")
def div(ctx: LoweringContext, a: Operand, b: Operand) -> TensorValue:
    same = unchanged(ctx, a, b, 1)
    if same is not None:
        return same
    return elementwise(ctx, [a, b], lambda ops, x, y: ops.truediv(x, y))


@register("aten.div.Tensor_mode", "aten.div.Scalar_mode")
def div_mode(ctx: LoweringContext, a: Operand, b: Operand, rounding_mode: str | None = None) -> Lazy:
    out = ctx.out_dtype  # read now: the bodies below run later, when ctx describes another node
    is_float = out in FLOATS
    if rounding_mode is None:
        return elementwise(ctx, [a, b], lambda ops, x, y: ops.truediv(x, y))
    if rounding_mode == "floor":
        if is_float:
            return elementwise(ctx, [a, b], lambda ops, x, y: ops.floor(ops.truediv(x, y)))
        return elementwise(ctx, [a, b], lambda ops, x, y: ops.floordiv(x, y))
    if is_float:  # eager truncates the quotient rounded to the result dtype (bf16 / bf16 is a bf16)
        return elementwise(ctx, [a, b], lambda ops, x, y: ops.trunc(ops.to_dtype(ops.truediv(x, y), out)))
    # integer truncation: floor division corrected towards zero
    return elementwise(ctx, [a, b], lambda ops, x, y: ops.where(
        ops.logical_and(ops.ne(ops.remainder(x, y), ops.constant(0, out)),
                        ops.ne(ops.lt(x, ops.constant(0, out)), ops.lt(y, ops.constant(0, out)))),
        ops.add(ops.floordiv(x, y), ops.constant(1, out)), ops.floordiv(x, y)))


@register("aten.floor_divide.default", "aten.floor_divide.Scalar")
def floor_divide(ctx: LoweringContext, a: Operand, b: Operand) -> Lazy:
    return div_mode(ctx, a, b, "floor")


def _register_binary(aten_names: Sequence[str], op_name: str) -> None:
    register(*aten_names)(lambda ctx, a, b: elementwise(ctx, [a, b], lambda ops, x, y: getattr(ops, op_name)(x, y)))


_register_binary(["aten.maximum.default"], "maximum")
_register_binary(["aten.minimum.default"], "minimum")
_register_binary(["aten.remainder.Tensor", "aten.remainder.Scalar"], "remainder")
_register_binary(["aten.fmod.Tensor", "aten.fmod.Scalar"], "fmod")
_register_binary(["aten.atan2.default"], "atan2")
_register_binary(["aten.bitwise_and.Tensor", "aten.bitwise_and.Scalar"], "bitwise_and")
_register_binary(["aten.bitwise_or.Tensor", "aten.bitwise_or.Scalar"], "bitwise_or")
_register_binary(["aten.bitwise_xor.Tensor", "aten.bitwise_xor.Scalar"], "bitwise_xor")


@register("aten.pow.Tensor_Tensor", "aten.pow.Scalar")
def pow_tensor(ctx: LoweringContext, a: Operand, b: Operand) -> Lazy:
    if ctx.out_dtype not in FLOATS:  # the float pow (exp/log) would be wrong for integers
        raise NotImplementedError("integer power with a tensor exponent: run it as an ATen call")
    return elementwise(ctx, [a, b], lambda ops, x, y: ops.pow(x, y))


@register("aten.pow.Tensor_Scalar")
def pow_scalar(ctx: LoweringContext, a: TensorValue, exponent: Any) -> Lazy:
    """Small integer powers (any for integer tensors) as multiplications: exact, and what eager's
    fast path does."""
    integral = isinstance(exponent, (int, float)) and float(exponent).is_integer() and exponent >= 0
    if integral and (exponent <= 4 or ctx.out_dtype not in FLOATS):
        dtype = compute_dtype(ctx.out_dtype)
        return elementwise(ctx, [a], lambda ops, x: _integer_power(ops, x, int(exponent), dtype))
    if ctx.out_dtype not in FLOATS:
        raise NotImplementedError("integer tensor to a negative or fractional power")
    if exponent == 0.5:
        return elementwise(ctx, [a], lambda ops, x: ops.sqrt(x))
    if exponent == -1:
        return elementwise(ctx, [a], lambda ops, x: ops.reciprocal(x))
    return elementwise(ctx, [a, exponent], lambda ops, x, y: ops.pow(x, y))


def _integer_power(ops: Any, x: Any, exponent: int, dtype: str) -> Any:
    """x ** exponent by squaring (wrapping like eager's integer multiplications)."""
    result = None
    while exponent:
        if exponent & 1:
            result = x if result is None else ops.mul(result, x)
        exponent >>= 1
        if exponent:
            x = ops.mul(x, x)
    return result if result is not None else ops.constant(1, dtype)


def _register_comparison(name: str) -> None:
    def lower_comparison(ctx: LoweringContext, a: Operand, b: Operand) -> Lazy:
        dtype = promoted_dtype(a, b)
        return elementwise(ctx, [a, b], lambda ops, x, y: getattr(ops, name)(x, y), dtype=dtype)

    register(f"aten.{name}.Tensor", f"aten.{name}.Scalar")(lower_comparison)


for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    _register_comparison(_name)


def _register_logical(name: str) -> None:
    def lower_logical(ctx: LoweringContext, a: Operand, b: Operand) -> Lazy:
        return elementwise(ctx, [a, b], lambda ops, x, y: getattr(ops, name)(x, y), dtype="bool")

    register(f"aten.{name}.default")(lower_logical)


for _name in ("logical_and", "logical_or", "logical_xor"):
    _register_logical(_name)


# --- where, clamp, masking -----------------------------------------------------------

@register("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther", "aten.where.Scalar")
def where(ctx: LoweringContext, condition: TensorValue, a: Operand, b: Operand) -> Lazy:
    size = ctx.out_size
    cond = operand_loader(condition, size, "bool")
    load_a, load_b = operand_loader(a, size, ctx.out_dtype), operand_loader(b, size, ctx.out_dtype)
    return Lazy(size, ctx.out_dtype, lambda ops, index: ops.where(cond(ops, index), load_a(ops, index), load_b(ops, index)))


@register("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def masked_fill(ctx: LoweringContext, x: TensorValue, mask: TensorValue, value: Operand) -> Lazy:
    return where(ctx, mask, value, x)


@register("aten.clamp.default", "aten.clamp.Tensor")
def clamp(ctx: LoweringContext, x: TensorValue, lo: Operand | None = None, hi: Operand | None = None) -> Lazy:
    operands = [x] + [v for v in (lo, hi) if v is not None]

    def body(ops, value, *bounds):
        bounds = list(bounds)
        if lo is not None:
            value = ops.maximum(value, bounds.pop(0))
        if hi is not None:
            value = ops.minimum(value, bounds.pop(0))
        return value

    return elementwise(ctx, operands, body)


@register("aten.clamp_min.default", "aten.clamp_min.Tensor")
def clamp_min(ctx: LoweringContext, x: TensorValue, lo: Operand) -> Lazy:
    return clamp(ctx, x, lo, None)


@register("aten.clamp_max.default", "aten.clamp_max.Tensor")
def clamp_max(ctx: LoweringContext, x: TensorValue, hi: Operand) -> Lazy:
    return clamp(ctx, x, None, hi)


# --- casts and copies ------------------------------------------------------------------

@register("aten._to_copy.default", "aten.clone.default", "aten.lift_fresh_copy.default",
          "prims.convert_element_type.default", "aten.to.dtype", "aten.contiguous.default")
def copy_cast(ctx: LoweringContext, x: TensorValue, *args: Any, **kwargs: Any) -> Lazy:
    return elementwise(ctx, [x], _cast_body(x, ctx.out_dtype), dtype=ctx.out_dtype)


@register("aten.copy.default")
def copy(ctx: LoweringContext, destination: TensorValue, source: TensorValue, non_blocking: bool = False) -> Lazy:
    return elementwise(ctx, [source], _cast_body(source, ctx.out_dtype), dtype=ctx.out_dtype)


def _cast_body(source: TensorValue, target: str) -> Callable:
    """A cast to bf16/fp16 rounds here, in the body: kernels keep low-precision values in float32
    and round only what they store, so a value that never reaches memory (`x.to(bf16) - x`, fused)
    would otherwise keep its float32 bits."""
    if target in LOW_PRECISION and source.dtype != target:
        return lambda ops, a: ops.to_dtype(a, target)
    return lambda ops, a: a


@register("aten.alias.default", "aten.detach.default")
def alias(ctx: LoweringContext, x: TensorValue) -> TensorValue:
    return x


# --- creation ------------------------------------------------------------------------

def constant_tensor(ctx: LoweringContext, value: Any) -> Lazy:
    dtype = compute_dtype(ctx.out_dtype)
    return Lazy(ctx.out_size, ctx.out_dtype, lambda ops, index: ops.constant(value, dtype))


@register("aten.full.default")
def full(ctx: LoweringContext, size: list[int], value: Any, **kwargs: Any) -> Lazy:
    return constant_tensor(ctx, value)


@register("aten.new_full.default")
def new_full(ctx: LoweringContext, x: TensorValue, size: list[int], value: Any, **kwargs: Any) -> Lazy:
    return constant_tensor(ctx, value)


@register("aten.full_like.default", "aten.fill.Scalar")
def full_like(ctx: LoweringContext, x: TensorValue, value: Any, **kwargs: Any) -> Lazy:
    return constant_tensor(ctx, value)


@register("aten.zeros.default", "aten.zeros_like.default", "aten.new_zeros.default", "aten.zero.default")
def zeros(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Lazy:
    return constant_tensor(ctx, 0)


@register("aten.empty.memory_format", "aten.empty_like.default", "aten.new_empty.default",
          "aten.empty_strided.default", "aten.new_empty_strided.default")
def empty(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Uninitialized:
    """No kernel writes an empty tensor: its readers inside kernels see zeros, and where it must be
    real (a graph output, an extern call's argument) it is only allocated."""
    zero = constant_tensor(ctx, 0)
    return Uninitialized(zero.size, zero.dtype, zero.fn)


@register("aten.ones.default", "aten.ones_like.default", "aten.new_ones.default")
def ones(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Lazy:
    return constant_tensor(ctx, 1)


@register("aten.scalar_tensor.default")
def scalar_tensor(ctx: LoweringContext, value: Any, **kwargs: Any) -> Lazy:
    return constant_tensor(ctx, value)


@register("aten.arange.default", "aten.arange.start", "aten.arange.start_step")
def arange(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Lazy:
    numbers = [a for a in args if isinstance(a, (int, float))]
    start, step = (0, 1) if len(numbers) == 1 else (numbers[0], numbers[2] if len(numbers) > 2 else 1)
    dtype = compute_dtype(ctx.out_dtype)
    integral = all(float(v).is_integer() for v in (start, step))
    if integral:
        return Lazy(ctx.out_size, ctx.out_dtype, lambda ops, index: ops.index_expr(
            int(start) + index[0] * int(step), dtype))
    return Lazy(ctx.out_size, ctx.out_dtype, lambda ops, index: ops.add(
        ops.constant(start, dtype), ops.mul(ops.index_expr(index[0], dtype), ops.constant(step, dtype))))


# --- activations that are single pointwise ops ---------------------------------------------

@register("aten.silu.default")
def silu(ctx: LoweringContext, x: TensorValue) -> Lazy:
    return elementwise(ctx, [x], lambda ops, a: ops.mul(a, ops.sigmoid(a)))


@register("aten.gelu.default")
def gelu(ctx: LoweringContext, x: TensorValue, approximate: str = "none") -> Lazy:
    dtype = compute_dtype(ctx.out_dtype)  # read now: the body runs later, when ctx describes another node
    return elementwise(ctx, [x], lambda ops, a: gelu_value(ops, a, approximate, dtype))


def gelu_value(ops: Any, a: Any, approximate: str, dtype: str) -> Any:
    half = ops.constant(0.5, dtype)
    one = ops.constant(1.0, dtype)
    if approximate == "tanh":
        inner = ops.mul(ops.constant(math.sqrt(2 / math.pi), dtype),
                        ops.add(a, ops.mul(ops.constant(0.044715, dtype), ops.mul(a, ops.mul(a, a)))))
        return ops.mul(ops.mul(half, a), ops.add(one, ops.tanh(inner)))
    return ops.mul(ops.mul(half, a), ops.add(one, ops.erf(ops.mul(a, ops.constant(math.sqrt(0.5), dtype)))))


@register("aten.gelu_backward.default")
def gelu_backward(ctx: LoweringContext, grad: TensorValue, x: TensorValue, approximate: str = "none") -> Lazy:
    dtype = compute_dtype(ctx.out_dtype)

    def body(ops, g, a):
        c = lambda v: ops.constant(v, dtype)  # noqa: E731
        if approximate == "tanh":
            k0, k1 = math.sqrt(2 / math.pi), 0.044715
            a2 = ops.mul(a, a)
            inner = ops.mul(c(k0), ops.add(a, ops.mul(c(k1), ops.mul(a, a2))))
            t = ops.tanh(inner)
            left = ops.mul(c(0.5), ops.add(c(1.0), t))
            d_inner = ops.mul(c(k0), ops.add(c(1.0), ops.mul(c(3 * k1), a2)))
            right = ops.mul(ops.mul(c(0.5), a), ops.mul(ops.sub(c(1.0), ops.mul(t, t)), d_inner))
            return ops.mul(g, ops.add(left, right))
        cdf = ops.mul(c(0.5), ops.add(c(1.0), ops.erf(ops.mul(a, c(math.sqrt(0.5))))))
        pdf = ops.mul(c(1 / math.sqrt(2 * math.pi)), ops.exp(ops.mul(c(-0.5), ops.mul(a, a))))
        return ops.mul(g, ops.add(cdf, ops.mul(a, pdf)))

    return elementwise(ctx, [grad, x], body)


@register("aten.silu_backward.default")
def silu_backward(ctx: LoweringContext, grad: TensorValue, x: TensorValue) -> Lazy:
    dtype = compute_dtype(ctx.out_dtype)

    def body(ops, g, a):
        s = ops.sigmoid(a)
        one = ops.constant(1.0, dtype)
        return ops.mul(g, ops.mul(s, ops.add(one, ops.mul(a, ops.sub(one, s)))))

    return elementwise(ctx, [grad, x], body)


@register("aten.sigmoid_backward.default")
def sigmoid_backward(ctx: LoweringContext, grad: TensorValue, y: TensorValue) -> Lazy:
    dtype = compute_dtype(ctx.out_dtype)
    return elementwise(ctx, [grad, y], lambda ops, g, s: ops.mul(g, ops.mul(s, ops.sub(ops.constant(1.0, dtype), s))))


@register("aten.tanh_backward.default")
def tanh_backward(ctx: LoweringContext, grad: TensorValue, y: TensorValue) -> Lazy:
    dtype = compute_dtype(ctx.out_dtype)
    return elementwise(ctx, [grad, y], lambda ops, g, t: ops.mul(g, ops.sub(ops.constant(1.0, dtype), ops.mul(t, t))))


@register("aten.threshold_backward.default")
def threshold_backward(ctx: LoweringContext, grad: TensorValue, x: TensorValue, threshold: Any) -> Lazy:
    dtype = compute_dtype(ctx.out_dtype)
    return elementwise(ctx, [grad, x], lambda ops, g, a: ops.where(
        ops.le(a, ops.constant(threshold, dtype)), ops.constant(0, dtype), g))


@register("aten.lerp.Scalar", "aten.lerp.Tensor")
def lerp(ctx: LoweringContext, start: TensorValue, end: Operand, weight: Operand) -> Lazy:
    return elementwise(ctx, [start, end, weight], lambda ops, s, e, w: ops.add(s, ops.mul(w, ops.sub(e, s))))


@register("aten.addcmul.default")
def addcmul(ctx: LoweringContext, x: TensorValue, a: TensorValue, b: TensorValue, value: Any = 1) -> Lazy:
    dtype = compute_dtype(ctx.out_dtype)
    return elementwise(ctx, [x, a, b], lambda ops, s, p, q: ops.add(s, ops.mul(ops.constant(value, dtype), ops.mul(p, q))))


@register("aten.addcdiv.default")
def addcdiv(ctx: LoweringContext, x: TensorValue, a: TensorValue, b: TensorValue, value: Any = 1) -> Lazy:
    dtype = compute_dtype(ctx.out_dtype)
    return elementwise(ctx, [x, a, b], lambda ops, s, p, q: ops.add(s, ops.mul(ops.constant(value, dtype), ops.truediv(p, q))))
