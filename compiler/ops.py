"""The vocabulary of a loop body: the calls a body makes on its `ops` handler.

A body is `body(ops, index, rindex) -> value`; values are opaque to the body. Handlers:
`codegen.kernel.TritonOps` (prints Triton), `dependencies.DependencyRecorder` (lists
reads). Every handler implements:

    load(buffer_name, index_expr)          one element of a buffer (low-precision floats come back as float32)
    constant(value, dtype)                 a scalar broadcast to the block
    index_expr(expr, dtype)                an index expression as a value
    to_dtype(x, dtype)                     a cast (to bfloat16/float16 rounds, then stays float32)
    where(cond, a, b)
    masked(mask, body_fn, other)           body_fn() evaluated where mask holds (loads masked), other elsewhere
    indirect(x, size)                      a loaded integer used as an index (negative wraps); returns a sympy symbol
    <unary>(x) for x in UNARY_OPS
    <binary>(a, b) for op in BINARY_OPS
    rand(seed, offset) / randn(seed, offset)   Philox numbers (float32, uniform in [0, 1) / standard
                                           normal) for an int64 seed and an int32 element offset

A handler may also implement `load_view(buffer_name, layout, index)`: a load through a view with
the reader's coordinates, not only the storage offset (`inline_gathers._InliningOps` maps them to
an inlined producer's own coordinates). Loads through views go through `load_view` below.
"""

from typing import Any, Sequence


def load_view(ops: Any, buffer: str, layout: Any, index: Sequence[Any]) -> Any:
    """Element `index` of `buffer` seen through `layout` (a compiler.ir.Layout). The optional op is
    looked up on the handler's class, so that a handler forwarding unknown ops (__getattr__) to
    another is never bypassed."""
    if hasattr(type(ops), "load_view"):
        return ops.load_view(buffer, layout, tuple(index))
    return ops.load(buffer, layout.index(index))


def load_selected(ops: Any, buffers: Sequence[str], selector: Any, index: Any) -> Any:
    """One element at `index` of `buffers[selector]`, where buffers of one layout and dtype are read
    as one (a cat of many like pieces); None where `ops` cannot read it so (the caller then reads
    piece by piece). An optional op, looked up on the handler's class like load_view."""
    if hasattr(type(ops), "load_selected"):
        return ops.load_selected(tuple(buffers), selector, index)
    return None


UNARY_OPS = frozenset({
    "exp", "exp2", "log", "log2", "log1p", "expm1", "sqrt", "rsqrt", "abs", "neg", "sin", "cos", "tan",
    "tanh", "sigmoid", "erf", "erfinv", "floor", "ceil", "trunc", "round", "sign", "reciprocal", "relu",
    "isnan", "isinf", "logical_not", "bitwise_not", "asin", "acos", "atan", "sinh", "cosh", "lgamma",
})

BINARY_OPS = frozenset({
    "add", "sub", "mul", "truediv", "floordiv", "remainder", "fmod", "pow", "maximum", "minimum", "atan2",
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
    "bitwise_and", "bitwise_or", "bitwise_xor", "lshift", "rshift",
})

RANDOM_OPS = frozenset({"rand", "randn"})
