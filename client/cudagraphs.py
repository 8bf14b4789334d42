"""CUDA-graph mode: an artifact's launches captured once into a CUDA graph and replayed.

    torch.compile(model, backend=client.backend.backend(cuda_graphs=True))   # or FUSEWIRE_CUDA_GRAPHS=1

Like Inductor's `mode="reduce-overhead"`: a replay is one host call for the whole graph, so a
step's host time no longer grows with its launches. `GraphedRunner` wraps one compiled variant
(static shapes, so one capture fits every call) and keeps it correct:

- Inputs. Calls run plainly until two in a row see the same input addresses (the backward's
  inputs move once, when the forward starts replaying), or until the third call; then the capture.
  An input whose address held still (parameters, the forward's saved tensors that the backward
  reads) is read in place and its address checked on every call; any other input is copied into
  a placeholder the graph reads. An address that changes later makes the input a copied one and
  the graph is captured again; inputs copied at the capture that then stay put for SETTLED_CALLS
  calls are read in place after another capture (at most MAX_CAPTURES captures, then plain runs).
- Mutated inputs (BatchNorm's running statistics, `x.add_()` on an argument): a copied input
  the graph writes is copied back after each replay.
- Outputs live in the graph's private memory pool, which the next replay overwrites. The first
  replay hands out copies and watches which of them the caller still holds at the next call (a
  loss kept for logging, gradients kept as `.grad`): those outputs are copied out after every
  replay, the others are handed out as views of the pool. A pool view still held at a later call
  makes a new capture (a new pool; the old one stays with the caller's tensors), never an
  overwrite. Outputs that share a storage stay views of one storage; outputs that view an input
  are views of the caller's input, never of a placeholder.
- Memory: the graphs of one backend on one device share one pool (`CaptureGroup`), so a
  backward reuses the memory of its forward's intermediates. A later capture may put its outputs
  where an earlier graph computes, so a graph replays only while every later graph's outputs in
  the pool are dead; otherwise it runs plainly, and after BLOCKED_CALLS such calls it is captured
  again, after them.
- Random ops are ATen calls on torch's generator, which registers with the capture: each
  replay draws new numbers, as eager does.
- What cannot be captured (an extern call that synchronizes with the host, such as
  `aten.nonzero`; a capture that fails) runs plainly; the reason is in
  `Backend.uncaptured` and `Backend.stats["cuda_graph_fallbacks"]`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch.multiprocessing.reductions import StorageWeakRef

MAX_CAPTURES = 4
BLOCKED_CALLS = 2  # plain runs in a row for outputs of later graphs, after which this graph is captured again
SETTLED_CALLS = 2  # calls in a row at the same addresses after which copied inputs are read in place
# ATen ops whose CUDA kernels wait for the host (a data-dependent size read back, a host copy):
# a stream being captured refuses them.
HOST_SYNCING_OPS = frozenset({
    "aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.unique", "aten._unique",
    "aten._unique2", "aten.unique_consecutive", "aten.unique_dim", "aten.equal", "aten.is_nonzero",
    "aten.allclose", "aten.item", "aten.bincount", "aten.repeat_interleave", "aten.argwhere",
    "aten.masked_scatter", "aten._assert_async", "aten.histogram", "aten.tolist",
})


def capture_blocker(plan: dict[str, Any]) -> str | None:
    """Why a plan cannot be captured at all, known before trying; None if nothing is known."""
    for step in plan["steps"]:
        if step["op"] != "extern":
            continue
        namespace, name, _ = step["target"].split(".")
        if f"{namespace}.{name}" in HOST_SYNCING_OPS or (name.endswith("_") and f"{namespace}.{name[:-1]}" in HOST_SYNCING_OPS):
            return f"extern call {step['target']} synchronizes with the host, which a CUDA graph cannot capture"
        if any(_on_cpu(arg) for arg in step["args"]):
            return f"extern call {step['target']} takes a host value as a device tensor"
    return None


def _on_cpu(value: Any) -> bool:
    return isinstance(value, dict) and value.get("device") == "cpu"


@dataclass
class _OwnedStorage:
    """A storage of the graph's pool that outputs view. Its memory is held here (`base`); the caller
    gets, per replay, a new storage object over the same memory that owns nothing, so whether the
    caller still holds an output is whether that object is alive (Inductor's CUDA-graph trees do
    the same)."""

    base: torch.Tensor  # uint8, the whole storage: keeps the memory, and is what a copy-out reads
    copy_out: bool = False
    outputs: list[int] = field(default_factory=list)  # the outputs that view it
    handed: StorageWeakRef | None = None  # the storage object the last replay handed out

    def alive(self) -> bool:
        return self.handed is not None and not self.handed.expired()

    def hand_out(self) -> torch.UntypedStorage:
        storage = torch._C._construct_storage_from_data_pointer(self.base.data_ptr(), self.base.device,
                                                                 self.base.numel())
        self.handed = StorageWeakRef(storage)
        return storage


@dataclass
class _OutputRecipe:
    """How to remake output i after a replay: a view of an input, of an owned storage, or a constant."""

    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    input_index: int | None = None  # views the caller's input `input_index` ...
    byte_offset: int = 0  # ... this many bytes past that input's first element
    owned: _OwnedStorage | None = None  # or views this pool storage at storage_offset
    storage_offset: int = 0
    fixed: torch.Tensor | None = None  # or is this tensor (a view of the artifact's constants)


class CaptureGroup:
    """Graphs that share one memory pool (a backend's graphs on one device, such as a forward and its
    backward), in capture order. A later capture may place its outputs in memory an earlier graph
    used for intermediates, so a graph replays only when the outputs of every graph captured after
    it are dead; its own outputs never share memory with anything captured later, since they stay
    allocated."""

    def __init__(self) -> None:
        self.pool: Any = None  # made at the first capture (it needs CUDA)
        self.members: list["GraphedRunner"] = []

    def captured(self, runner: "GraphedRunner") -> None:
        if runner in self.members:
            self.members.remove(runner)
        self.members.append(runner)

    def later_than(self, runner: "GraphedRunner") -> list["GraphedRunner"]:
        return self.members[self.members.index(runner) + 1:] if runner in self.members else []


class GraphedRunner:
    """Stands in for a runtime.CompiledGraph (`run_checked`) and replays it as a CUDA graph."""

    def __init__(self, runner: Any, mutated: set[int], report: Callable[[str], None],
                 count: Callable[[str], None], group: CaptureGroup | None = None) -> None:
        self.runner, self.mutated = runner, mutated
        self.group = group or CaptureGroup()
        self._owned: list[_OwnedStorage] = []
        self._retired: list[_OwnedStorage] = []  # pool storages of replaced graphs the caller still holds
        self._report, self._count = report, count  # report(reason): this variant runs plainly from now on
        self.plain_reason: str | None = capture_blocker(runner.plan)
        if self.plain_reason:
            report(self.plain_reason)
        self.captures = 0
        self._plain_calls = 0
        self._blocked_calls = 0
        self._last_pointers: list[int] = []
        self._copied: set[int] = set()
        self._moving: set[int] = set()  # inputs seen at a new address after a capture
        self._graph: torch.cuda.CUDAGraph | None = None
        self._kept: set[int] | None = None  # outputs the caller keeps past the next call; None: not known yet
        self._watch: dict[int, StorageWeakRef] = {}  # output -> its copy, while learning which are kept

    def run_checked(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        if self.plain_reason is not None:
            return self.runner.run_checked(inputs)
        if self._graph is None:
            return self._before_capture(inputs)
        if self._watch:  # the outputs of the first replay were copies: those still alive are kept ones
            self._kept = {i for i, ref in self._watch.items() if not ref.expired()}
            self._watch = {}
            for owned in self._owned:
                owned.copy_out = any(i in self._kept for i in owned.outputs)
        moved = [i for i, pointer in self._static_pointers if inputs[i].data_ptr() != pointer]
        if moved:  # such an input moves from call to call: always copied from now on
            self._copied |= set(moved)
            self._moving |= set(moved)
            return self._capture(inputs)
        if self._copied - self._moving and self._copied_settled(inputs):  # they stopped moving: read in place
            self._copied = set(self._moving)
            return self._capture(inputs)
        alive = [owned for owned in self._owned if owned.alive()]
        if alive:  # the caller kept a view of the pool: it is theirs now; later replays copy these out
            self._kept = (self._kept or set()) | {i for owned in alive for i in owned.outputs}
            return self._capture(inputs)
        later = self.group.later_than(self)
        if later and any([other.holds_pool_memory(inputs) for other in later]):
            # a later graph's outputs sit where this one computes: run plainly; if that persists (they
            # are this graph's own inputs, say), a new capture places this graph after them
            self._blocked_calls += 1
            if self._blocked_calls > BLOCKED_CALLS:
                return self._capture(inputs)
            self._count("cuda_graph_plain_runs")
            return self.runner.run_checked(inputs)
        self._blocked_calls = 0
        return self._replay(inputs)

    def holds_pool_memory(self, reader_inputs: Sequence[torch.Tensor]) -> bool:
        """Whether the caller holds outputs of this graph that live in the pool. Those that are not
        inputs of the graph asking (`reader_inputs`) are copied out from now on: the caller keeps them."""
        alive = [owned for owned in self._owned if owned.alive()]
        read = {t.untyped_storage().data_ptr() for t in reader_inputs}
        kept = [owned for owned in alive if owned.base.data_ptr() not in read]
        for owned in kept:
            owned.copy_out = True
        if kept and self._kept is not None:
            self._kept |= {i for owned in kept for i in owned.outputs}
        self._retired = [owned for owned in self._retired if owned.alive()]
        return bool(alive or self._retired)

    def _retire_outputs(self) -> None:
        """Before a new capture or a give-up: the old graph's pool storages that the caller still holds
        stay here (their memory must outlive the caller's views, which own nothing) until they die."""
        self._retired = [owned for owned in self._retired + self._owned if owned.alive()]
        self._owned = []

    def _copied_settled(self, inputs: Sequence[torch.Tensor]) -> bool:
        """Whether the copied inputs sat at the same addresses for SETTLED_CALLS calls in a row (the
        backward's inputs after the forward's first replay, whose outputs were copies)."""
        pointers = [inputs[i].data_ptr() for i in sorted(self._copied - self._moving)]
        self._settled = self._settled + 1 if pointers == self._copied_pointers else 0
        self._copied_pointers = pointers
        return self._settled >= SETTLED_CALLS and self.captures < MAX_CAPTURES

    def _before_capture(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Plain runs until two calls in a row see the same input addresses (the backward's inputs
        move once, when the forward starts replaying), or a third call: then the capture."""
        pointers = [t.data_ptr() for t in inputs]
        if self._plain_calls and (pointers == self._last_pointers or self._plain_calls >= 2):
            self._copied = {i for i, (a, b) in enumerate(zip(pointers, self._last_pointers)) if a != b}
            return self._capture(inputs)
        self._plain_calls += 1
        self._last_pointers = pointers
        return self.runner.run_checked(inputs)

    # -- capture ----------------------------------------------------------------------

    def _capture(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        if self.captures >= MAX_CAPTURES:
            return self._give_up(inputs, f"input addresses or kept outputs changed after {MAX_CAPTURES} captures")
        self.captures += 1
        self._graph = None  # the previous graph goes; its pool lives while the caller holds its outputs
        self._retire_outputs()
        device = inputs[0].device
        overlapping = [i for i in sorted(self._copied) if _overlaps(_distinct(inputs[i]))]
        if overlapping:
            return self._give_up(inputs, f"input {overlapping[0]} has overlapping elements and its address changes "
                                         "between calls, so it cannot be copied into the graph")
        self._placeholders = {i: torch.empty_strided(inputs[i].shape, inputs[i].stride(), dtype=inputs[i].dtype,
                                                     device=device) for i in sorted(self._copied)}
        self._placeholder_views = [_distinct(p) for p in self._placeholders.values()]
        graph_inputs = [self._placeholders.get(i, t) for i, t in enumerate(inputs)]
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        if self.group.pool is None:
            self.group.pool = torch.cuda.graph_pool_handle()
        try:
            with torch.cuda.graph(graph, pool=self.group.pool):
                outputs = self.runner.run_checked(graph_inputs)
        except Exception as exc:  # an op the capture refused: the stream is out of capture mode again
            torch.cuda.synchronize(device)
            _reset_generator(device)
            return self._give_up(inputs, f"CUDA graph capture failed: {type(exc).__name__}: {str(exc)[:300]}")
        self._graph, self._recipes_ = graph, self._recipes(outputs, graph_inputs)
        del outputs
        self._owned = list({id(r.owned): r.owned for r in self._recipes_ if r.owned is not None}.values())
        for owned in self._owned:
            owned.copy_out = self._kept is None or any(i in self._kept for i in owned.outputs)
        self._static_pointers = [(i, t.data_ptr()) for i, t in enumerate(inputs) if i not in self._copied]
        self._copied_pointers, self._settled = [inputs[i].data_ptr() for i in sorted(self._copied - self._moving)], 0
        self._copy_back = [i for i in sorted(self._copied) if i in self.mutated]
        self.group.captured(self)
        self._blocked_calls = 0
        self._count("cuda_graphs_captured")
        outputs = self._replay(inputs)
        if self._kept is None:
            self._watch = {i: StorageWeakRef(out.untyped_storage()) for i, (out, recipe)
                           in enumerate(zip(outputs, self._recipes_)) if recipe.owned is not None}
        return outputs

    def _recipes(self, outputs: list[torch.Tensor], graph_inputs: list[torch.Tensor]) -> list[_OutputRecipe]:
        input_storages = {t.untyped_storage().data_ptr(): i for i, t in enumerate(graph_inputs) if t.numel()}
        constants = self.runner.constant_pointers(graph_inputs[0].device) if graph_inputs else set()
        owned: dict[int, _OwnedStorage] = {}
        recipes = []
        for index, out in enumerate(outputs):
            recipe = _OutputRecipe(out.dtype, tuple(out.shape), tuple(out.stride()))
            storage = out.untyped_storage()
            if out.numel() == 0 or storage.data_ptr() in constants:
                recipe.fixed = out
            elif storage.data_ptr() in input_storages:
                i = input_storages[storage.data_ptr()]
                recipe.input_index, recipe.byte_offset = i, out.data_ptr() - graph_inputs[i].data_ptr()
            else:
                if storage.data_ptr() not in owned:
                    base = torch.empty(0, dtype=torch.uint8, device=out.device).set_(storage, 0, (storage.nbytes(),), (1,))
                    owned[storage.data_ptr()] = _OwnedStorage(base)
                recipe.owned, recipe.storage_offset = owned[storage.data_ptr()], out.storage_offset()
                recipe.owned.outputs.append(index)
            recipes.append(recipe)
        return recipes

    def _give_up(self, inputs: Sequence[torch.Tensor], reason: str) -> list[torch.Tensor]:
        self._graph, self.plain_reason = None, reason
        self._retire_outputs()
        self._report(reason)
        return self.runner.run_checked(inputs)

    # -- replay -----------------------------------------------------------------------

    def _replay(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        if self._placeholders:
            torch._foreach_copy_(self._placeholder_views, [_distinct(inputs[i]) for i in self._placeholders])
        self._graph.replay()
        self._count("cuda_graph_replays")
        for i in self._copy_back:
            _distinct(inputs[i]).copy_(_distinct(self._placeholders[i]))
        storages = {id(o): o.base.clone().untyped_storage() if o.copy_out else o.hand_out() for o in self._owned}
        return [self._remake(recipe, inputs, storages) for recipe in self._recipes_]

    @staticmethod
    def _remake(recipe: _OutputRecipe, inputs: Sequence[torch.Tensor],
                storages: dict[int, torch.UntypedStorage]) -> torch.Tensor:
        if recipe.fixed is not None:
            return recipe.fixed
        if recipe.owned is not None:
            return torch.empty(0, dtype=recipe.dtype, device=recipe.owned.base.device).set_(
                storages[id(recipe.owned)], recipe.storage_offset, recipe.size, recipe.stride)
        source = inputs[recipe.input_index]
        return torch.empty(0, dtype=recipe.dtype, device=source.device).set_(
            source.untyped_storage(), (source.data_ptr() - source.untyped_storage().data_ptr() + recipe.byte_offset)
            // recipe.dtype.itemsize, recipe.size, recipe.stride)


def _distinct(tensor: torch.Tensor) -> torch.Tensor:
    """A view holding each distinct element of `tensor` once: its broadcast (stride-0) dims dropped."""
    if all(stride or size <= 1 for size, stride in zip(tensor.shape, tensor.stride())):
        return tensor
    return tensor[tuple(0 if stride == 0 and size > 1 else slice(None) for size, stride in zip(tensor.shape, tensor.stride()))]


def _overlaps(tensor: torch.Tensor) -> bool:
    """Whether two elements of `tensor` share memory (dims ordered by stride, each must step past the
    extent of the smaller ones)."""
    extent = 1
    dims = sorted(((stride, size) for size, stride in zip(tensor.shape, tensor.stride()) if size > 1))
    for stride, size in dims:
        if stride < extent:
            return True
        extent = stride * (size - 1) + extent
    return False


def _reset_generator(device: torch.device) -> None:
    """A capture that failed leaves torch's CUDA generator marked as capturing, and every later random
    op outside a capture then fails; an empty capture, which ends properly, clears the mark."""
    try:
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            pass
    except Exception:  # nothing more to do: the next random op will say what is wrong
        torch.cuda.synchronize(device)


def mutated_inputs(gm: torch.fx.GraphModule) -> set[int]:
    """Positions of the placeholders that some node of `gm` writes into (its schema's `Tensor(a!)`)."""
    placeholders = {node: i for i, node in enumerate(gm.graph.find_nodes(op="placeholder"))}
    written: set[int] = set()
    for node in gm.graph.nodes:
        schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
        if schema is None:
            continue
        for argument, value in zip(schema.arguments, node.args):
            if argument.alias_info is not None and argument.alias_info.is_write and value in placeholders:
                written.add(placeholders[value])
        for name, value in node.kwargs.items():
            argument = next((a for a in schema.arguments if a.name == name), None)
            if argument is not None and argument.alias_info is not None and argument.alias_info.is_write \
                    and value in placeholders:
                written.add(placeholders[value])
    return written
