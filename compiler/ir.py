"""Loop-level IR: buffers with layouts, and the nodes that fill them.

A `ComputeNode` is a loop nest: `ranges` (the output's iteration space) and, for a
reduction, `reduction_ranges`; a scan (cumsum, cumprod) is a reduction that keeps a result
at every point of its reduction range (`is_scan`, `store_index`). Its `body(ops, index, rindex)` is a plain Python function
of sympy index variables that describes one element's computation by calling an ops
handler (`compiler.ops.OpsHandler`): loads through index expressions, math, casts.
Running the same body under different handlers gives Triton source (codegen) or the
buffers and index expressions it reads (the scheduler's dependencies).

An `ExternNode` is work done by an ATen call at run time (matmul, anything unlowered).
Views never appear here: lowering turns them into index remaps or strided layouts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import sympy

from compiler.graph import ITEMSIZES
from compiler.indexing import Expr

# Scans: the running sum or product along a row (the reduction ranges), stored at every element.
SCAN_TYPES = frozenset({"cumsum", "cumprod"})

Body = Callable[..., Any]  # body(ops, index: list[Expr], rindex: list[Expr]) -> value (or tuple of values)


@dataclass(frozen=True)
class Layout:
    """How a tensor sits in its buffer's storage: sizes, strides and offset in elements."""

    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: str

    @staticmethod
    def contiguous(size: Sequence[int], dtype: str) -> "Layout":
        return Layout.dense(size, range(len(size)), dtype)

    @staticmethod
    def dense(size: Sequence[int], order: Sequence[int], dtype: str) -> "Layout":
        """A dense layout whose dims lie in storage in `order`, outermost first."""
        stride, running = [0] * len(size), 1
        for dim in reversed(order):
            stride[dim] = running
            running *= max(size[dim], 1)
        return Layout(tuple(size), tuple(stride), 0, dtype)

    @property
    def numel(self) -> int:
        return math.prod(self.size)

    def is_dense(self) -> bool:
        """Whether the view covers a contiguous block exactly once, in some dim order."""
        expected = 1
        for stride, size in sorted((st, s) for s, st in zip(self.size, self.stride) if s != 1):
            if stride != expected:
                return False
            expected *= size
        return True

    def storage_numel(self) -> int:
        """Elements the storage must hold for this view to be in bounds."""
        if self.numel == 0:
            return 0
        return self.offset + 1 + sum((s - 1) * st for s, st in zip(self.size, self.stride))

    def storage_bytes(self) -> int:
        """Bytes the storage must hold for this view to be in bounds."""
        return self.storage_numel() * ITEMSIZES[self.dtype]

    def index(self, index: Sequence[Expr]) -> Expr:
        """The storage offset of element `index`."""
        return self.offset + sum((i * st for i, st, s in zip(index, self.stride, self.size) if s != 1), sympy.Integer(0))

    def to_json(self) -> dict:
        return {"size": list(self.size), "stride": list(self.stride), "offset": self.offset, "dtype": self.dtype}


@dataclass
class Buffer:
    """Named storage. Graph inputs, computed intermediates and extern results are all buffers."""

    name: str
    layout: Layout
    kind: str  # "input" | "constant" | "computed" | "extern" | "uninitialized" (allocated, written by nothing)

    @property
    def dtype(self) -> str:
        return self.layout.dtype


@dataclass
class Store:
    """Where a compute node's output goes: a buffer seen through a layout (a view for mutations)."""

    buffer: Buffer
    layout: Layout


@dataclass
class ComputeNode:
    """A pointwise (no reduction ranges) or reduction loop nest writing one or more stores."""

    name: str
    ranges: tuple[int, ...]
    reduction_ranges: tuple[int, ...]
    body: Body
    stores: list[Store]
    reduction_type: str | None = None  # sum, prod, max, min, argmax, argmin, any, welford; or a scan
    origins: list[str] = field(default_factory=list)  # wire node names this came from

    @property
    def is_reduction(self) -> bool:
        return self.reduction_type is not None

    @property
    def is_scan(self) -> bool:
        """A scan (cumsum, cumprod) keeps every element of its rows: one result per (index, rindex)
        point, the running total up to it. It runs as a reduction kernel does, over rows."""
        return self.reduction_type in SCAN_TYPES

    def store_index(self, store: Store, index: Sequence[Expr], rindex: Sequence[Expr]) -> Expr:
        """Where the result at (index, rindex) lands in `store`: a scan's stores are laid out over the
        node's ranges followed by its reduction ranges, a reduction's over its ranges only."""
        return store.layout.index(list(index) + list(rindex) if self.is_scan else index)

    @property
    def numel(self) -> int:
        return math.prod(self.ranges)

    @property
    def rnumel(self) -> int:
        return math.prod(self.reduction_ranges)


@dataclass
class TensorArg:
    """An extern call's tensor argument: a buffer seen through a strided layout."""

    buffer: Buffer
    layout: Layout

    def to_json(self) -> dict:
        return {"buffer": self.buffer.name, **self.layout.to_json()}


@dataclass
class ExternNode:
    """An ATen call run as is. args/kwargs hold TensorArgs, TensorArg lists and constants."""

    name: str
    target: str
    args: list[Any]
    kwargs: dict[str, Any]
    outputs: list[Buffer]  # one per tensor the op returns (flattened), except those it leaves out
    mutated: list[Buffer] = field(default_factory=list)  # inputs the op writes in place
    origins: list[str] = field(default_factory=list)
    output_positions: list[int] | None = None  # each output's position among the op's results; None: 0, 1, ...

    def tensor_args(self) -> list[TensorArg]:
        found: list[TensorArg] = []
        _collect_tensor_args(self.args, found)
        _collect_tensor_args(list(self.kwargs.values()), found)
        return found


def _collect_tensor_args(value: Any, found: list[TensorArg]) -> None:
    if isinstance(value, TensorArg):
        found.append(value)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _collect_tensor_args(item, found)


Node = ComputeNode | ExternNode


@dataclass
class GraphOutput:
    """A graph output: a buffer seen through a layout (possibly a view of it)."""

    buffer: Buffer
    layout: Layout


@dataclass
class Program:
    """What lowering hands the scheduler: input buffers, nodes in program order, outputs, and the
    buffers that hold the graph's constants (buffer name -> position in the wire graph's constants)."""

    inputs: list[Buffer]
    nodes: list[Node]
    outputs: list[GraphOutput]
    buffers: dict[str, Buffer]
    constants: dict[str, int] = field(default_factory=dict)
    origin_ops: dict[str, str] = field(default_factory=dict)  # wire node name -> its ATen op ("native_layer_norm")

    def buffer_dtypes(self) -> dict[str, str]:
        return {name: b.dtype for name, b in self.buffers.items()}

    def buffer_itemsizes(self) -> dict[str, int]:
        return {name: ITEMSIZES[b.dtype] for name, b in self.buffers.items()}

    def buffer_bytes(self) -> dict[str, int]:
        """Each buffer's elements times their size (its layout's numel, not its storage's)."""
        return {name: b.layout.numel * ITEMSIZES[b.dtype] for name, b in self.buffers.items()}
