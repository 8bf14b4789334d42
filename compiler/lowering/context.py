"""The state a lowering function works with: the program being built, buffer names,
the current node's output metadata, and the ways to make data real: `realize` (a
pointwise loop nest), `reduce` (a reduction loop nest), `scan` (a running sum or product
along rows) and `extern`."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from compiler.bounds import WorkLimits
from compiler.ir import Buffer, ComputeNode, ExternNode, Layout, Program, Store, TensorArg
from compiler.lowering import views
from compiler.lowering.concatenation import Concatenation
from compiler.lowering.values import StorageView, TensorValue, Uninitialized, compute_dtype, known_value


SEED_BOUND = 2**62  # seeds are drawn from [0, SEED_BOUND): Philox keys of 64 bits, never negative


class LoweringError(ValueError):
    """A node cannot be compiled; the message names the node and the reason."""


def dense_layout(meta: torch.Tensor) -> Layout:
    """The meta tensor's strides when they are a permutation of a dense layout, else contiguous."""
    dtype = str(meta.dtype).removeprefix("torch.")
    size = tuple(meta.shape)
    stride = tuple(meta.stride())
    layout = Layout(size, stride, 0, dtype)
    return layout if meta.numel() > 0 and layout.is_dense() else Layout.contiguous(size, dtype)


@dataclass
class LoweringContext:
    program: Program
    origin: str = ""  # wire node being lowered, for names and error messages
    out_meta: list[torch.Tensor] = field(default_factory=list)
    padded_copies: dict[tuple, StorageView] = field(default_factory=dict)  # lowering.padding.padded_operand
    graph_outputs: set[str] = field(default_factory=set)  # wire nodes that are graph outputs or viewed by one
    layout_free: set[str] = field(default_factory=set)  # wire nodes a layout may be chosen for (layout_choice.py)
    writes_in_place: bool = False  # some node of the graph writes into a tensor (x.add_(y), copy_)
    contractions: dict[str, Any] = field(default_factory=dict)  # sum node -> its mul node (contractions.py)
    cat_pieces: set[str] = field(default_factory=set)  # wire nodes a cat reads as a piece (concatenation.py)
    constant_buffers: dict[str, Any] = field(default_factory=dict)  # buffer -> the value stored in all of it
    materialized_cats: set[str] = field(default_factory=set)  # cats stored in memory whatever fuses (concatenation.py)
    laid_out_by_loads: set[str] = field(default_factory=set)  # buffers layout_choice.py laid out, not eager
    # eager's meta tensors of the wire nodes whose buffers lie otherwise (layout_choice.py), as env holds them
    eager_metas: dict[str, Any] = field(default_factory=dict)
    limits: WorkLimits = field(default_factory=WorkLimits)  # every op's output is checked against them
    memo: dict = field(default_factory=dict)  # meta outputs and decompositions by op signature (lowering/memo.py)
    eager_random: bool = True  # random ops run as ATen calls (CompileOptions.eager_random)
    _counter: Any = field(default_factory=itertools.count)
    _seeds: ExternNode | None = None  # the graph's one randint call drawing a seed per random op
    _seed_count: int = 0

    # --- metadata of the node being lowered -----------------------------------------
    @property
    def out_dtype(self) -> str:
        return str(self.out_meta[0].dtype).removeprefix("torch.")

    @property
    def out_size(self) -> tuple[int, ...]:
        return tuple(self.out_meta[0].shape)

    def fail(self, why: str) -> LoweringError:
        return LoweringError(f"node '{self.origin}': {why}")

    # --- making data real ------------------------------------------------------------
    def new_buffer(self, layout: Layout, kind: str = "computed") -> Buffer:
        buffer = Buffer(f"buf{next(self._counter)}", layout, kind)
        self.program.buffers[buffer.name] = buffer
        return buffer

    def realize(self, value: TensorValue, layout: Layout | None = None) -> StorageView:
        """Computes a Lazy into a new buffer (contiguous unless `layout` says otherwise)."""
        if isinstance(value, StorageView) and layout is None:
            return value
        if isinstance(value, Uninitialized):
            if value.realized is None or layout in (None, value.realized.layout):
                return self._allocate(value, layout or Layout.contiguous(value.size, value.dtype))
            value = value.realized  # wanted in another layout: a copy of the tensor allocated before
        layout = layout or Layout.contiguous(value.size, value.dtype)
        buffer = self.new_buffer(layout)
        if isinstance(value, Concatenation) and value.by_piece:  # each piece into its slice of the buffer
            whole = StorageView(buffer, layout)
            for piece, offset in zip(value.pieces, value.offsets):
                part = views.slice_dim(whole, value.dim, offset, offset + piece.size[value.dim])
                self.store(piece, Store(buffer, part.layout))
        else:
            self.store(value, Store(buffer, layout))
            known = known_value(value, self.constant_buffers)
            if known is not None:
                self.constant_buffers[buffer.name] = known
        return StorageView(buffer, layout)

    def _allocate(self, value: Uninitialized, layout: Layout) -> StorageView:
        """An uninitialized tensor's storage: an "uninitialized" buffer, which the plan allocates
        where this ATen `empty_strided` stands (compiler/codegen/plan.py) and no kernel writes. Made
        once: every reader of the tensor sees the same storage."""
        if value.realized is None:
            meta = torch.empty_strided(layout.size, layout.stride, dtype=getattr(torch, layout.dtype), device="meta")
            (value.realized,) = self.extern("aten.empty_strided.default", [list(layout.size), list(layout.stride)],
                                            {"dtype": meta.dtype, "device": torch.device("meta")}, [meta])
            value.realized.buffer.kind = "uninitialized"
        return value.realized

    def store(self, value: TensorValue, store: Store) -> None:
        """Writes `value` through `store` (a new buffer, or a view of an existing one for in-place ops)."""
        if tuple(value.size) != store.layout.size:  # never index a view with another shape: it could write past it
            raise self.fail(f"a result of shape {list(value.size)} cannot be stored into a view of shape "
                            f"{list(store.layout.size)}")
        out_dtype = compute_dtype(store.layout.dtype)
        self.constant_buffers.pop(store.buffer.name, None)  # a later write (slice_scatter's piece) changes it

        def body(ops, index, rindex):
            return ops.to_dtype(value.load(ops, index), out_dtype)

        self.program.nodes.append(ComputeNode(
            name=f"op{len(self.program.nodes)}", ranges=tuple(value.size), reduction_ranges=(),
            body=body, stores=[store], origins=[self.origin],
        ))

    def reduce(self, ranges: Sequence[int], reduction_ranges: Sequence[int], reduction_type: str,
               body: Callable, dtypes: Sequence[str]) -> list[StorageView]:
        """A reduction over `reduction_ranges` for each point of `ranges`.

        `body(ops, index, rindex)` gives the value to reduce (in its compute dtype). Returns one
        contiguous buffer per output: welford gives (mean, m2), the others a single result.
        """
        layouts = [Layout.contiguous(ranges, dtype) for dtype in dtypes]
        stores = [Store(self.new_buffer(layout), layout) for layout in layouts]
        self.program.nodes.append(ComputeNode(
            name=f"op{len(self.program.nodes)}", ranges=tuple(ranges), reduction_ranges=tuple(reduction_ranges),
            body=body, stores=stores, reduction_type=reduction_type, origins=[self.origin],
        ))
        return [StorageView(s.buffer, s.layout) for s in stores]

    def scan(self, size: Sequence[int], dim: int, scan_type: str, body: Callable, dtype: str) -> StorageView:
        """A scan (compiler.ir.SCAN_TYPES) along `dim` of a tensor of `size`, into a new contiguous
        buffer of `dtype`. `body(ops, index, rindex)` gives the element at (the other dims, `dim`)."""
        layout = Layout.contiguous(size, dtype)
        kept = [d for d in range(len(size)) if d != dim]
        # the store is indexed by the node's ranges (the other dims), then its one reduction range
        by_loops = Layout(tuple(size[d] for d in kept + [dim]), tuple(layout.stride[d] for d in kept + [dim]), 0, dtype)
        buffer = self.new_buffer(layout)
        self.program.nodes.append(ComputeNode(
            name=f"op{len(self.program.nodes)}", ranges=tuple(size[d] for d in kept), reduction_ranges=(size[dim],),
            body=body, stores=[Store(buffer, by_loops)], reduction_type=scan_type, origins=[self.origin],
        ))
        return StorageView(buffer, layout)

    def random_seed(self) -> tuple[str, int]:
        """(buffer, position) of a fresh int64 seed for one random op. One ATen randint per graph call
        draws them all from torch's generator; its size is fixed by `finish_seeds` once lowering ends."""
        if self._seeds is None:
            meta = torch.empty(1, dtype=torch.int64, device="meta")
            self.extern("aten.randint.low", [0, SEED_BOUND, [1]], {"dtype": torch.int64, "device": torch.device("meta")},
                        [meta])
            self._seeds = self.program.nodes[-1]
        self._seed_count += 1
        return self._seeds.outputs[0].name, self._seed_count - 1

    def finish_seeds(self) -> None:
        if self._seeds is not None:
            self._seeds.args[2] = [self._seed_count]
            self._seeds.outputs[0].layout = Layout.contiguous((self._seed_count,), "int64")

    def tensor_arg(self, value: TensorValue) -> TensorArg:
        view = self.realize(value)
        return TensorArg(view.buffer, view.layout)

    def _extern_arg(self, value: Any) -> Any:
        # a method, not a closure calling itself: that closure would be a reference cycle holding
        # this context, and so the whole program, until the garbage collector next runs
        if isinstance(value, TensorValue):
            return self.tensor_arg(value)
        if isinstance(value, (list, tuple)):
            return [self._extern_arg(v) for v in value]
        return value

    def extern(self, target: str, args: list[Any], kwargs: dict[str, Any], out_meta: Sequence[torch.Tensor | None],
               mutated: Sequence[StorageView] = ()) -> list[StorageView]:
        """An ATen call at run time; tensor arguments are realized first. One buffer per output
        that `out_meta` describes; a None there is an output the op leaves out (returns None for)."""
        args = [self._extern_arg(a) for a in args]
        kwargs = {k: self._extern_arg(v) for k, v in kwargs.items()}
        for view in mutated:
            self.constant_buffers.pop(view.buffer.name, None)
        outputs, positions = [], []
        for position, meta in enumerate(out_meta):
            if meta is None:
                continue
            dtype = str(meta.dtype).removeprefix("torch.")
            outputs.append(self.new_buffer(Layout(tuple(meta.shape), tuple(meta.stride()), 0, dtype), kind="extern"))
            positions.append(position)
        self.program.nodes.append(ExternNode(
            name=f"op{len(self.program.nodes)}", target=target, args=args, kwargs=kwargs, outputs=outputs,
            mutated=[m.buffer for m in mutated], origins=[self.origin], output_positions=positions,
        ))
        return [StorageView(b, b.layout) for b in outputs]
