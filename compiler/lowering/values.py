"""What a lowered tensor is while lowering runs: a buffer seen through a strided layout
(`StorageView`), or a not-yet-computed function of its index (`Lazy`).

Both can `load(ops, index)` one element. Views (permute, expand, slice, reshape...)
map one kind to another without copying: a StorageView stays a StorageView whenever
the view is expressible as sizes/strides/offset, and becomes a Lazy index remap
otherwise. Only `LoweringContext.realize` turns a Lazy into a buffer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import sympy

from compiler.indexing import Expr
from compiler.ir import Buffer, Layout
from compiler.ops import load_view

LoadFn = Callable[[Any, Sequence[Expr]], Any]  # (ops, index) -> value in the compute dtype

LOW_PRECISION = ("bfloat16", "float16")
FLOATS = ("float32", "float64", "bfloat16", "float16")


def compute_dtype(dtype: str) -> str:
    """Low-precision floats are computed in float32 inside kernels."""
    return "float32" if dtype in LOW_PRECISION else dtype


class TensorValue:
    size: tuple[int, ...]
    dtype: str

    def load(self, ops: Any, index: Sequence[Expr]) -> Any:  # pragma: no cover - interface
        raise NotImplementedError

    @property
    def rank(self) -> int:
        return len(self.size)


@dataclass
class StorageView(TensorValue):
    buffer: Buffer
    layout: Layout

    @property
    def size(self) -> tuple[int, ...]:  # type: ignore[override]
        return self.layout.size

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.layout.dtype

    def load(self, ops: Any, index: Sequence[Expr]) -> Any:
        return load_view(ops, self.buffer.name, self.layout, index)


@dataclass
class Lazy(TensorValue):
    size: tuple[int, ...]
    dtype: str
    fn: LoadFn

    def load(self, ops: Any, index: Sequence[Expr]) -> Any:
        return self.fn(ops, index)


@dataclass
class Uninitialized(Lazy):
    """A tensor whose values are unspecified (`empty`, `new_empty`, `empty_like`...). Read inside a
    kernel it is zeros (any value is right); realized (a graph's node, an output, an extern call's
    argument) it is an allocation that no kernel writes: `LoweringContext.realize` makes it once."""

    realized: "StorageView | None" = None


class _Known:
    def __init__(self, value: Any) -> None:
        self.value = value


_UNKNOWN = object()  # not None: bodies test their own values against None (lowering/pointwise.py powers)


class _ConstantProbe:
    """An ops handler that runs a Lazy's body only as far as constants go: a constant, a cast of one,
    or a load of a buffer that holds one value everywhere is known; anything else (arithmetic, other
    loads) is not."""

    def __init__(self, constant_buffers: dict[str, Any]) -> None:
        self.constant_buffers = constant_buffers

    def constant(self, value: Any, dtype: str) -> _Known:
        return _Known(value)

    def to_dtype(self, value: Any, *args: Any, **kwargs: Any) -> Any:
        return value if isinstance(value, _Known) else _UNKNOWN

    def load(self, buffer: str, *args: Any) -> Any:
        known = self.constant_buffers.get(buffer)
        return _UNKNOWN if known is None else _Known(known)

    def __getattr__(self, name: str) -> Callable:
        return lambda *args, **kwargs: _UNKNOWN


def known_value(operand: Any, constant_buffers: dict[str, Any] | None = None) -> Any:
    """The value every element of `operand` has, where lowering knows it: a Python number; zeros_like,
    full and the like, copies, casts and views of them; a view of a buffer in `constant_buffers`
    (name -> the value stored in all of it). Else None."""
    if isinstance(operand, StorageView):
        return (constant_buffers or {}).get(operand.buffer.name)
    if not isinstance(operand, TensorValue):
        return None if isinstance(operand, bool) else operand
    if not isinstance(operand, Lazy) or isinstance(operand, Uninitialized):
        return None
    index = [sympy.Symbol(f"i{d}", integer=True, nonnegative=True) for d in range(operand.rank)]
    try:
        found = operand.load(_ConstantProbe(constant_buffers or {}), index)
    except Exception:  # a body that does more with its values than the probe answers
        return None
    return found.value if isinstance(found, _Known) and not isinstance(found.value, bool) else None
