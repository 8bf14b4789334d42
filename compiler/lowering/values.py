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
