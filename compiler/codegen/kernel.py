"""One Triton kernel from one KernelGroup: the group's node bodies run under
`KernelWriter`, an ops handler that prints Triton lines with common-subexpression
elimination, then the lines are assembled around the kernel's index setup.

Pointwise kernels iterate a 1D block of XBLOCK elements. Reduction kernels iterate
XBLOCK outputs x RBLOCK reduction elements, looping over the reduction; accumulators
live in registers and are combined across the block after the loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import sympy

from compiler.codegen.printer import texpr
from compiler.indexing import Expr, FloorDiv, ModularIndexing, unflatten
from compiler.ir import ComputeNode, Store

TL_DTYPES = {
    "float32": "tl.float32", "float16": "tl.float16", "bfloat16": "tl.bfloat16", "float64": "tl.float64",
    "int64": "tl.int64", "int32": "tl.int32", "int16": "tl.int16", "int8": "tl.int8", "uint8": "tl.uint8",
    "bool": "tl.int1",
}
_PROMOTION = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
XINDEX = sympy.Symbol("xindex", integer=True, nonnegative=True)
RINDEX = sympy.Symbol("rindex", integer=True, nonnegative=True)


@dataclass(frozen=True)
class Var:
    name: str
    dtype: str

    def __str__(self) -> str:
        return self.name


def promote(a: str, b: str) -> str:
    if {a, b} == {"float16", "bfloat16"}:
        return "float32"
    return a if _PROMOTION.index(a) >= _PROMOTION.index(b) else b


def is_float(dtype: str) -> bool:
    return dtype.startswith("float") or dtype == "bfloat16"


def literal(value: Any, dtype: str) -> str:
    if isinstance(value, float) and math.isnan(value):
        return 'float("nan")'
    if isinstance(value, float) and math.isinf(value):
        return 'float("inf")' if value > 0 else 'float("-inf")'
    if dtype == "bool":
        return "1" if value else "0"
    if is_float(dtype):
        return repr(float(value))
    return str(int(value))


@dataclass
class Section:
    shape: str
    mask: str
    lines: list[str] = field(default_factory=list)
    cache: dict[str, Var] = field(default_factory=dict)


_HELPERS = {
    "max": '''@triton.jit
def _fw_max_combine(a, b):
    return tl.where((a > b) | (a != a), a, b)
''',
    "min": '''@triton.jit
def _fw_min_combine(a, b):
    return tl.where((a < b) | (a != a), a, b)
''',
    "prod": '''@triton.jit
def _fw_prod_combine(a, b):
    return a * b
''',
    "argmax": '''@triton.jit
def _fw_argmax_combine(value_a, index_a, value_b, index_b):
    nan_a = value_a != value_a
    nan_b = value_b != value_b
    take_a = (value_a > value_b) | (nan_a & ~nan_b) | ((value_a == value_b) | (nan_a & nan_b)) & (index_a < index_b)
    return tl.where(take_a, value_a, value_b), tl.where(take_a, index_a, index_b)
''',
    "argmin": '''@triton.jit
def _fw_argmin_combine(value_a, index_a, value_b, index_b):
    nan_a = value_a != value_a
    nan_b = value_b != value_b
    take_a = (value_a < value_b) | (nan_a & ~nan_b) | ((value_a == value_b) | (nan_a & nan_b)) & (index_a < index_b)
    return tl.where(take_a, value_a, value_b), tl.where(take_a, index_a, index_b)
''',
    "welford": '''@triton.jit
def _fw_welford_combine(mean_a, m2_a, weight_a, mean_b, m2_b, weight_b):
    weight = weight_a + weight_b
    delta = mean_b - mean_a
    fraction = tl.where(weight == 0.0, 0.0, weight_b / tl.where(weight == 0.0, 1.0, weight))
    return mean_a + delta * fraction, m2_a + m2_b + delta * delta * weight_a * fraction, weight
''',
}


# Triton's interpreter implements tl.math but not libdevice, so kernels for the "cpu"
# target compute these functions from tl.math primitives; cuda targets call libdevice.
_PORTABLE_MATH = {
    "tanh": """@triton.jit
def _fw_tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0
""",
    "log1p": """@triton.jit
def _fw_log1p(x):
    u = 1.0 + x
    return tl.where(u == 1.0, x, tl.log(u) * (x / tl.where(u == 1.0, 1.0, u - 1.0)))
""",
    "expm1": """@triton.jit
def _fw_expm1(x):
    u = tl.exp(x)
    safe = tl.where((u == 1.0) | (u == 0.0), 2.0, u)
    return tl.where(u == 1.0, x, tl.where(u == 0.0, -1.0, (safe - 1.0) * (x / tl.log(safe))))
""",
    "trunc": """@triton.jit
def _fw_trunc(x):
    return tl.where(x >= 0, tl.floor(x), tl.ceil(x))
""",
    "nearbyint": """@triton.jit
def _fw_nearbyint(x):
    r = tl.floor(x + 0.5)
    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0
    return tl.where(((r - x) == 0.5) & odd, r - 1.0, r)
""",
    "pow": """@triton.jit
def _fw_pow(a, b):
    magnitude = tl.exp(b * tl.log(tl.abs(a)))
    integral = b == tl.floor(b)
    odd = integral & ((b - 2.0 * tl.floor(b * 0.5)) != 0)
    signed = tl.where(odd, -magnitude, magnitude)
    result = tl.where(a < 0, tl.where(integral, signed, float("nan")), magnitude)
    return tl.where(b == 0, 1.0, result)
""",
    "fmod": """@triton.jit
def _fw_fmod(a, b):
    q = a / b
    return a - tl.where(q >= 0, tl.floor(q), tl.ceil(q)) * b
""",
    "sinh": """@triton.jit
def _fw_sinh(x):
    return 0.5 * (tl.exp(x) - tl.exp(-x))
""",
    "cosh": """@triton.jit
def _fw_cosh(x):
    return 0.5 * (tl.exp(x) + tl.exp(-x))
""",
    "tan": """@triton.jit
def _fw_tan(x):
    return tl.sin(x) / tl.cos(x)
""",
}


class CodegenError(ValueError):
    """The group cannot be written for this target."""


class KernelWriter:
    """The ops handler that prints Triton; see compiler/ops.py for the vocabulary."""

    def __init__(self, name: str, is_reduction: bool, index_dtype: str, buffer_dtypes: dict[str, str],
                 portable_math: bool = False) -> None:
        self.name = name
        self.portable_math = portable_math
        self.buffer_dtypes = buffer_dtypes
        self.is_reduction = is_reduction
        self.index_dtype = index_dtype
        self.setup = Section("[XBLOCK, RBLOCK]" if is_reduction else "[XBLOCK]", "xmask")
        self.loop = Section("[XBLOCK, RBLOCK]", "rxmask")
        self.post = Section("[XBLOCK, 1]" if is_reduction else "[XBLOCK]", "xmask")
        self.section = self.loop if is_reduction else self.post
        self.pointers: dict[str, str] = {}  # buffer name -> kernel argument
        self.helpers: set[str] = set()
        self._masks: list[str] = []
        self._counter = 0
        self._index_vars: dict[Expr, str] = {}

    # --- emitting ----------------------------------------------------------------------
    def _fresh(self, prefix: str = "tmp") -> str:
        self._counter += 1
        return f"{prefix}{self._counter}"

    def emit(self, expression: str, dtype: str, section: Section | None = None) -> Var:
        section = section or self.section
        cached = section.cache.get(expression)
        if cached is not None:
            return cached
        var = Var(self._fresh(), dtype)
        section.lines.append(f"{var.name} = {expression}")
        section.cache[expression] = var
        return var

    def pointer(self, buffer: str) -> str:
        return self.pointers.setdefault(buffer, f"ptr_{buffer}")

    def index(self, expr: Expr) -> str:
        """Triton text for an index expression; x-only div/mod terms become named variables."""
        return texpr(expr, self._name_index_term)

    def _name_index_term(self, expr: Expr) -> str | None:
        if not isinstance(expr, (FloorDiv, ModularIndexing)) or expr.free_symbols != {XINDEX}:
            return None
        if expr not in self._index_vars:
            name = f"x{len(self._index_vars)}"
            self._index_vars[expr] = name
            self.setup.lines.append(f"{name} = {texpr(expr)}")
        return self._index_vars[expr]

    def current_mask(self) -> str:
        return " & ".join([self.section.mask] + self._masks)

    # --- the ops vocabulary ---------------------------------------------------------------
    def load(self, buffer: str, index: Expr) -> Var:
        dtype = self.buffer_dtypes[buffer]
        offset = self.index(index) if index.free_symbols else f"tl.full({self.section.shape}, {int(index)}, tl.int32)"
        raw = self.emit(f"tl.load({self.pointer(buffer)} + {offset}, {self.current_mask()}, other=0)", dtype)
        if dtype in ("bfloat16", "float16"):
            return self.emit(f"{raw}.to(tl.float32)", "float32")
        return raw

    def constant(self, value: Any, dtype: str) -> Var:
        dtype = "float32" if dtype in ("bfloat16", "float16") else dtype
        return self.emit(f"tl.full({self.section.shape}, {literal(value, dtype)}, {TL_DTYPES[dtype]})", dtype)

    def index_expr(self, expr: Expr, dtype: str) -> Var:
        if not expr.free_symbols:
            return self.constant(int(expr), dtype)
        text = self.index(expr)
        return self.emit(f"({text}).to({TL_DTYPES[dtype]})", dtype)

    def to_dtype(self, x: Var, dtype: str) -> Var:
        if dtype in ("bfloat16", "float16"):  # round to the low precision, keep computing in float32
            return self.emit(f"{x}.to({TL_DTYPES[dtype]}).to(tl.float32)", "float32")
        if x.dtype == dtype:
            return x
        if dtype == "bool":
            return self.emit(f"{x} != 0", "bool")
        return self.emit(f"{x}.to({TL_DTYPES[dtype]})", dtype)

    def where(self, condition: Var, a: Var, b: Var) -> Var:
        return self.emit(f"tl.where({condition}, {a}, {b})", promote(a.dtype, b.dtype))

    def masked(self, mask: Var, body: Callable[[], Var], other: Any) -> Var:
        self._masks.append(mask.name)
        try:
            value = body()
        finally:
            self._masks.pop()
        return self.emit(f"tl.where({mask}, {value}, {literal(other, value.dtype)})", value.dtype)

    def indirect(self, value: Var, size: int) -> sympy.Symbol:
        wrapped = self.emit(f"tl.where({value} < 0, {value} + {size}, {value})", value.dtype)
        return sympy.Symbol(wrapped.name, integer=True)

    # unary
    def _unary(self, template: str, x: Var, dtype: str | None = None) -> Var:
        return self.emit(template.format(x=x), dtype or x.dtype)

    def _math(self, function: str, *args: Var) -> Var:
        """libdevice.<function>(args), or its tl.math-only twin for the interpreter."""
        dtype = args[0].dtype if len(args) == 1 else promote(args[0].dtype, args[1].dtype)
        joined = ", ".join(str(a) for a in args)
        if not self.portable_math:
            return self.emit(f"libdevice.{function}({joined})", dtype)
        if function not in _PORTABLE_MATH:
            raise CodegenError(f"{function} has no implementation for Triton's interpreter; compile for a cuda target")
        self.helpers.add(function)
        return self.emit(f"_fw_{function}({joined})", dtype)

    def exp(self, x): return self._unary("tl.exp({x})", x)
    def exp2(self, x): return self._unary("tl.exp2({x})", x)
    def log(self, x): return self._unary("tl.log({x})", x)
    def log2(self, x): return self._unary("tl.log2({x})", x)
    def log1p(self, x): return self._math("log1p", x)
    def expm1(self, x): return self._math("expm1", x)
    def sqrt(self, x): return self._unary("tl.sqrt({x})", x)
    def rsqrt(self, x): return self._unary("tl.rsqrt({x})", x)
    def abs(self, x): return self._unary("tl.abs({x})", x)
    def neg(self, x): return self._unary("-{x}", x)
    def sin(self, x): return self._unary("tl.sin({x})", x)
    def cos(self, x): return self._unary("tl.cos({x})", x)
    def tan(self, x): return self._math("tan", x)
    def tanh(self, x): return self._math("tanh", x)
    def sigmoid(self, x): return self._unary("tl.sigmoid({x})", x)
    def erf(self, x): return self._unary("tl.erf({x})", x)
    def erfinv(self, x): return self._math("erfinv", x)
    def floor(self, x): return self._unary("tl.floor({x})", x) if is_float(x.dtype) else x
    def ceil(self, x): return self._unary("tl.ceil({x})", x) if is_float(x.dtype) else x
    def trunc(self, x): return self._math("trunc", x) if is_float(x.dtype) else x
    def round(self, x): return self._math("nearbyint", x) if is_float(x.dtype) else x
    def asin(self, x): return self._math("asin", x)
    def acos(self, x): return self._math("acos", x)
    def atan(self, x): return self._math("atan", x)
    def sinh(self, x): return self._math("sinh", x)
    def cosh(self, x): return self._math("cosh", x)
    def lgamma(self, x): return self._math("lgamma", x)
    def reciprocal(self, x): return self._unary("1.0 / {x}", x)
    def relu(self, x): return self._unary("tl.where({x} < 0, 0, {x})", x)
    def sign(self, x): return self._unary("({x} > 0).to({dt}) - ({x} < 0).to({dt})".replace("{dt}", TL_DTYPES[x.dtype]), x)
    def isnan(self, x): return self._unary("{x} != {x}", x, "bool")
    def isinf(self, x): return self._unary('tl.abs({x}) == float("inf")', x, "bool")
    def logical_not(self, x): return self._unary("{x} == 0", x, "bool")
    def bitwise_not(self, x): return self._unary("~{x}", x)

    # binary
    def _binary(self, template: str, a: Var, b: Var, dtype: str | None = None) -> Var:
        return self.emit(template.format(a=a, b=b), dtype or promote(a.dtype, b.dtype))

    def add(self, a, b): return self._binary("{a} + {b}", a, b)
    def sub(self, a, b): return self._binary("{a} - {b}", a, b)
    def mul(self, a, b): return self._binary("{a} * {b}", a, b)
    def truediv(self, a, b): return self._binary("{a} / {b}", a, b)
    def pow(self, a, b): return self._math("pow", a, b)
    def atan2(self, a, b): return self._math("atan2", a, b)
    def eq(self, a, b): return self._binary("{a} == {b}", a, b, "bool")
    def ne(self, a, b): return self._binary("{a} != {b}", a, b, "bool")
    def lt(self, a, b): return self._binary("{a} < {b}", a, b, "bool")
    def le(self, a, b): return self._binary("{a} <= {b}", a, b, "bool")
    def gt(self, a, b): return self._binary("{a} > {b}", a, b, "bool")
    def ge(self, a, b): return self._binary("{a} >= {b}", a, b, "bool")
    def logical_and(self, a, b): return self._binary("({a} != 0) & ({b} != 0)", a, b, "bool")
    def logical_or(self, a, b): return self._binary("({a} != 0) | ({b} != 0)", a, b, "bool")
    def logical_xor(self, a, b): return self._binary("({a} != 0) ^ ({b} != 0)", a, b, "bool")
    def bitwise_and(self, a, b): return self._binary("{a} & {b}", a, b)
    def bitwise_or(self, a, b): return self._binary("{a} | {b}", a, b)
    def bitwise_xor(self, a, b): return self._binary("{a} ^ {b}", a, b)
    def lshift(self, a, b): return self._binary("{a} << {b}", a, b)
    def rshift(self, a, b): return self._binary("{a} >> {b}", a, b)

    def maximum(self, a, b):
        if is_float(promote(a.dtype, b.dtype)):
            return self._binary("tl.where(({a} > {b}) | ({a} != {a}), {a}, {b})", a, b)
        return self._binary("tl.maximum({a}, {b})", a, b)

    def minimum(self, a, b):
        if is_float(promote(a.dtype, b.dtype)):
            return self._binary("tl.where(({a} < {b}) | ({a} != {a}), {a}, {b})", a, b)
        return self._binary("tl.minimum({a}, {b})", a, b)

    def floordiv(self, a, b):
        if is_float(promote(a.dtype, b.dtype)):
            return self._binary("tl.floor({a} / {b})", a, b)
        # the same result whether `//` truncates (GPU) or floors (interpreter): work on magnitudes
        magnitude = self._binary("tl.abs({a}) // tl.abs({b})", a, b)
        inexact = self.emit(f"{magnitude} * tl.abs({b}) != tl.abs({a})", "bool")
        return self.emit(f"tl.where(({a} < 0) != ({b} < 0), -{magnitude} - {inexact}.to({TL_DTYPES[magnitude.dtype]}), {magnitude})",
                         magnitude.dtype)

    def remainder(self, a, b):
        if is_float(promote(a.dtype, b.dtype)):
            return self._binary("{a} - tl.floor({a} / {b}) * {b}", a, b)
        return self.sub(a, self.mul(self.floordiv(a, b), b))

    def fmod(self, a, b):
        if is_float(promote(a.dtype, b.dtype)):
            return self._math("fmod", a, b)
        magnitude = self._binary("tl.abs({a}) // tl.abs({b})", a, b)
        quotient = self.emit(f"tl.where(({a} < 0) != ({b} < 0), -{magnitude}, {magnitude})", magnitude.dtype)
        return self.sub(a, self.mul(quotient, b))

    # --- reductions -----------------------------------------------------------------
    def reduce(self, reduction_type: str, value: Var, dtype: str) -> list[Var]:
        """Accumulates `value` in the loop; returns the combined results ([XBLOCK, 1]) after it."""
        acc = self._fresh("acc")
        tl_dtype = TL_DTYPES[dtype]
        init = self.setup.lines
        if reduction_type == "sum":
            init.append(f"{acc} = tl.zeros([XBLOCK, RBLOCK], {tl_dtype})")
            self.loop.lines.append(f"{acc} = {acc} + tl.where(rxmask, {value}, 0)")
            return [self.emit(f"tl.sum({acc}, 1)[:, None]", dtype, self.post)]
        if reduction_type in ("max", "min", "prod"):
            self.helpers.add(reduction_type)
            if is_float(dtype):
                start = literal({"max": -math.inf, "min": math.inf, "prod": 1.0}[reduction_type], dtype)
            else:
                start = "1" if reduction_type == "prod" else self._int_extreme(dtype, reduction_type)
            init.append(f"{acc} = tl.full([XBLOCK, RBLOCK], {start}, {tl_dtype})")
            self.loop.lines.append(f"{acc} = _fw_{reduction_type}_combine({acc}, tl.where(rxmask, {value}, {start}))")
            return [self.emit(f"tl.reduce({acc}, 1, _fw_{reduction_type}_combine)[:, None]", dtype, self.post)]
        if reduction_type == "any":
            init.append(f"{acc} = tl.zeros([XBLOCK, RBLOCK], tl.int1)")
            self.loop.lines.append(f"{acc} = {acc} | (rxmask & ({value} != 0))")
            return [self.emit(f"tl.max({acc}.to(tl.int8), 1)[:, None] != 0", "bool", self.post)]
        if reduction_type in ("argmax", "argmin"):
            return [self._arg_reduce(reduction_type, value, acc)]
        if reduction_type == "welford":
            return self._welford(value, acc, dtype)
        raise NotImplementedError(f"reduction type {reduction_type}")

    @staticmethod
    def _int_extreme(dtype: str, reduction_type: str) -> str:
        bits = {"int64": 63, "int32": 31, "int16": 15, "int8": 7, "uint8": 8, "bool": 1}[dtype]
        if dtype in ("uint8", "bool"):
            return "0" if reduction_type == "max" else str(2 ** bits - 1)
        return str(-(2 ** bits)) if reduction_type == "max" else str(2 ** bits - 1)

    def _arg_reduce(self, kind: str, value: Var, acc: str) -> Var:
        self.helpers.add(kind)
        start = literal(float("-inf") if kind == "argmax" else float("inf"), value.dtype) if is_float(value.dtype) \
            else self._int_extreme(value.dtype, "max" if kind == "argmax" else "min")
        better = ">" if kind == "argmax" else "<"
        tl_dtype = TL_DTYPES[value.dtype]
        self.setup.lines += [f"{acc}_value = tl.full([XBLOCK, RBLOCK], {start}, {tl_dtype})",
                             f"{acc}_index = tl.zeros([XBLOCK, RBLOCK], tl.int64)"]
        self.loop.lines += [
            f"{acc}_new = tl.where(rxmask, {value}, {start})",
            f"{acc}_take = ({acc}_new {better} {acc}_value) | (({acc}_new != {acc}_new) & ({acc}_value == {acc}_value))",
            f"{acc}_value = tl.where({acc}_take, {acc}_new, {acc}_value)",
            f"{acc}_index = tl.where({acc}_take, rindex.to(tl.int64) + tl.zeros([XBLOCK, RBLOCK], tl.int64), {acc}_index)",
        ]
        self.post.lines.append(f"{acc}_best, {acc}_result = tl.reduce(({acc}_value, {acc}_index), 1, _fw_{kind}_combine)")
        return self.emit(f"{acc}_result[:, None]", "int64", self.post)

    def _welford(self, value: Var, acc: str, dtype: str) -> list[Var]:
        self.helpers.add("welford")
        tl_dtype = TL_DTYPES[dtype]
        self.setup.lines += [f"{acc}_{part} = tl.zeros([XBLOCK, RBLOCK], {tl_dtype})" for part in ("mean", "m2", "weight")]
        self.loop.lines += [
            f"{acc}_delta = {value} - {acc}_mean",
            f"{acc}_weight_next = {acc}_weight + 1",
            f"{acc}_mean_next = {acc}_mean + {acc}_delta / {acc}_weight_next",
            f"{acc}_m2 = tl.where(rxmask, {acc}_m2 + {acc}_delta * ({value} - {acc}_mean_next), {acc}_m2)",
            f"{acc}_mean = tl.where(rxmask, {acc}_mean_next, {acc}_mean)",
            f"{acc}_weight = tl.where(rxmask, {acc}_weight_next, {acc}_weight)",
        ]
        self.post.lines.append(
            f"{acc}_mean_out, {acc}_m2_out, {acc}_weight_out = "
            f"tl.reduce(({acc}_mean, {acc}_m2, {acc}_weight), 1, _fw_welford_combine)")
        return [self.emit(f"{acc}_mean_out[:, None]", dtype, self.post), self.emit(f"{acc}_m2_out[:, None]", dtype, self.post)]

    # --- stores -------------------------------------------------------------------------
    def store(self, store: Store, index: list[Expr], value: Var) -> None:
        dtype = store.layout.dtype
        cast = value if value.dtype == dtype else Var(f"{value}.to({TL_DTYPES[dtype]})", dtype)
        offset = store.layout.index(index)
        text = self.index(offset) if offset.free_symbols else f"tl.full({self.post.shape}, {int(offset)}, tl.int32)"
        self.post.lines.append(f"tl.store({self.pointer(store.buffer.name)} + {text}, {cast}, xmask)")


def write_node(writer: KernelWriter, node: ComputeNode) -> None:
    """Evaluates one node's body into the writer and stores its outputs."""
    index = unflatten(XINDEX, node.ranges)
    if not node.is_reduction:
        value = node.body(writer, index, [])
        for store in node.stores:
            writer.store(store, index, value)
        return
    rindex = unflatten(RINDEX, node.reduction_ranges)
    writer.section = writer.loop
    value = node.body(writer, index, rindex)
    accumulate = "float32" if node.reduction_type == "welford" and value.dtype != "float64" else value.dtype
    results = writer.reduce(node.reduction_type, value, accumulate)
    writer.section = writer.post
    for store, result in zip(node.stores, results):
        writer.store(store, index, result)


def assemble(writer: KernelWriter, arguments: list[str]) -> str:
    """The kernel's full source: imports, helper functions and the @triton.jit function."""
    lines = ["import triton", "import triton.language as tl", "from triton.language.extra import libdevice", ""]
    for helper in sorted(writer.helpers):
        lines += ["", _HELPERS.get(helper) or _PORTABLE_MATH[helper]]
    signature = ", ".join(arguments + ["xnumel", "rnumel", "XBLOCK: tl.constexpr", "RBLOCK: tl.constexpr"])
    body = ["@triton.jit", f"def {writer.name}({signature}):"]
    program_id = "tl.program_id(0).to(tl.int64)" if writer.index_dtype == "int64" else "tl.program_id(0)"
    arange = "tl.arange(0, {n}).to(tl.int64)" if writer.index_dtype == "int64" else "tl.arange(0, {n})"
    if writer.is_reduction:
        head = [f"xoffset = {program_id} * XBLOCK",
                f"xindex = xoffset + {arange.format(n='XBLOCK')}[:, None]",
                "xmask = xindex < xnumel",
                f"rbase = {arange.format(n='RBLOCK')}[None, :]"]
        loop = ["for roffset in range(0, rnumel, RBLOCK):",
                "    rindex = roffset + rbase",
                "    rmask = rindex < rnumel",
                "    rxmask = rmask & xmask"] + [f"    {line}" for line in writer.loop.lines]
        statements = head + writer.setup.lines + loop + writer.post.lines
    else:
        head = [f"xoffset = {program_id} * XBLOCK", f"xindex = xoffset + {arange.format(n='XBLOCK')}", "xmask = xindex < xnumel"]
        statements = head + writer.setup.lines + writer.post.lines
    body += [f"    {line}" for line in statements]
    return "\n".join(lines + ["", ""] + body) + "\n"
