"""The math part of the ops vocabulary (compiler/ops.py) printed as Triton: unary and
binary ops with PyTorch's semantics (NaN-propagating max/min, floor division and
remainder with Python's signs). Mixed into `KernelWriter`, which supplies `emit`."""

from __future__ import annotations


from compiler.codegen.int_narrowing import NarrowIntegers
from compiler.codegen.triton_helpers import PORTABLE_MATH
from compiler.codegen.values import TL_DTYPES, Var, is_float, promote


class CodegenError(ValueError):
    """The group cannot be written for this target."""


class TritonMathOps(NarrowIntegers):
    portable_math: bool
    helpers: set[str]

    def emit(self, expression: str, dtype: str) -> Var:  # pragma: no cover - provided by KernelWriter
        raise NotImplementedError

    # unary
    def _unary(self, template: str, x: Var, dtype: str | None = None) -> Var:
        return self.emit(template.format(x=x), dtype or x.dtype)

    def _math(self, function: str, *args: Var) -> Var:
        """libdevice.<function>(args), or its tl.math-only twin for the interpreter."""
        dtype = args[0].dtype if len(args) == 1 else promote(args[0].dtype, args[1].dtype)
        joined = ", ".join(str(a) for a in args)
        if not self.portable_math:
            return self.emit(f"libdevice.{function}({joined})", dtype)
        if function not in PORTABLE_MATH:
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
    def abs(self, x): return self.narrow_abs(x) or self._unary("tl.abs({x})", x)
    def neg(self, x):  # Triton's -x is 0 - x: +0.0 for 0.0
        return self.narrow_neg(x) or self._unary("{x} * -1.0" if is_float(x.dtype) else "-{x}", x)
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

    # random: Philox keyed by the seed, counter = the element's offset (same numbers wherever evaluated)
    def rand(self, seed, offset): return self.emit(f"tl.rand({seed}, {offset}.to(tl.uint32))", "float32")
    def randn(self, seed, offset): return self.emit(f"tl.randn({seed}, {offset}.to(tl.uint32))", "float32")

    # binary
    def _binary(self, template: str, a: Var, b: Var, dtype: str | None = None) -> Var:
        return self.emit(template.format(a=a, b=b), dtype or promote(a.dtype, b.dtype))

    def add(self, a, b): return self._arithmetic("add", "{a} + {b}", a, b)
    def sub(self, a, b): return self._arithmetic("sub", "{a} - {b}", a, b)
    def mul(self, a, b): return self._arithmetic("mul", "{a} * {b}", a, b)
    def truediv(self, a, b): return self._binary("{a} / {b}", a, b)
    def pow(self, a, b): return self._math("pow", a, b)
    def atan2(self, a, b): return self._math("atan2", a, b)
    def _compare(self, operator: str, a: Var, b: Var) -> Var:
        return self.narrow_compare(operator, a, b) or self._binary(f"{{a}} {operator} {{b}}", a, b, "bool")

    def _arithmetic(self, op: str, template: str, a: Var, b: Var) -> Var:
        return self.narrow_arithmetic(op, a, b) or self._binary(template, a, b)

    def eq(self, a, b): return self._compare("==", a, b)
    def ne(self, a, b): return self._compare("!=", a, b)
    def lt(self, a, b): return self._compare("<", a, b)
    def le(self, a, b): return self._compare("<=", a, b)
    def gt(self, a, b): return self._compare(">", a, b)
    def ge(self, a, b): return self._compare(">=", a, b)
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
        return self._arithmetic("maximum", "tl.maximum({a}, {b})", a, b)

    def minimum(self, a, b):
        if is_float(promote(a.dtype, b.dtype)):
            return self._binary("tl.where(({a} < {b}) | ({a} != {a}), {a}, {b})", a, b)
        return self._arithmetic("minimum", "tl.minimum({a}, {b})", a, b)

    def floordiv(self, a, b):
        if is_float(promote(a.dtype, b.dtype)):
            return self._binary("tl.floor({a} / {b})", a, b)
        narrow = self.narrow_floordiv(a, b)
        if narrow is not None:
            return narrow
        # the same result whether `//` truncates (GPU) or floors (interpreter): work on magnitudes
        magnitude = self._binary("tl.abs({a}) // tl.abs({b})", a, b)
        inexact = self.emit(f"{magnitude} * tl.abs({b}) != tl.abs({a})", "bool")
        return self.emit(f"tl.where(({a} < 0) != ({b} < 0), tl.where({inexact}, -{magnitude} - 1, -{magnitude}), {magnitude})",
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
