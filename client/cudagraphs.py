"""CUDA-graph mode: an artifact's launches captured once into a CUDA graph and replayed.

    torch.compile(model, backend=client.backend.backend(cuda_graphs=True))   # or FUSEWIRE_CUDA_GRAPHS=1

Like Inductor's `mode="reduce-overhead"`: a replay is one host call for the whole graph, so a
step's host time no longer grows with its launches. `GraphedRunner` wraps one compiled variant
(static shapes, so one capture fits every call) and keeps it correct:

- Inputs. The first call runs plainly (a warm-up: cuBLAS handles, lazy loads). At the capture,
  an input at the same address as in the warm-up (parameters, the forward's saved tensors that
  the backward reads) is read in place and its address checked on every call; any other input
  is copied into a placeholder the graph reads. An address that changes later makes the input a
  copied one and the graph is captured again (at most MAX_CAPTURES times, then plain runs).
- Mutated inputs (BatchNorm's running statistics, `x.add_()` on an argument): a copied input
  the graph writes is copied back after each replay.
- Outputs. Outputs live in the graph's private memory pool and are overwritten by the next
  replay, so before a replay the outputs of the previous one must be dead. One that is still
  held (a loss the caller keeps, gradients kept as `.grad`) makes this call run plainly, and
  from then on its storage is copied out after each replay, so the caller's tensor is its own.
  Outputs that share a storage stay views of one copy; outputs that view an input are views of
  the caller's input, never of a placeholder.
- Random ops are ATen calls on torch's generator, which registers with the capture: each
  replay draws new numbers, as eager does.
- What cannot be captured (an extern call that synchronizes with the host, such as
  `aten.nonzero`; a capture that fails) runs plainly; the reason is in
  `Backend.uncaptured` and `Backend.stats["cuda_graph_fallbacks"]`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

MAX_CAPTURES = 3
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
    """A storage of the graph's pool that outputs view: held here, copied out when the caller keeps it."""

    storage: torch.UntypedStorage
    base: torch.Tensor  # uint8, the whole storage: what a copy-out reads
    baseline: int  # the storage's use count when only this object holds it
    copy_out: bool = False

    def alive(self) -> bool:
        return torch._C._storage_Use_Count(self.storage._cdata) > self.baseline


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


class GraphedRunner:
    """Stands in for a runtime.CompiledGraph (`run_checked`) and replays it as a CUDA graph."""

    def __init__(self, runner: Any, mutated: set[int], report: Callable[[str], None],
                 count: Callable[[str], None]) -> None:
        self.runner, self.mutated = runner, mutated
        self._report, self._count = report, count  # report(reason): this variant runs plainly from now on
        self.plain_reason: str | None = capture_blocker(runner.plan)
        if self.plain_reason:
            report(self.plain_reason)
        self.captures = 0
        self._warm_pointers: list[int] | None = None
        self._copied: set[int] = set()
        self._graph: torch.cuda.CUDAGraph | None = None

    def run_checked(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        if self.plain_reason is not None:
            return self.runner.run_checked(inputs)
        if self._graph is None:
            if self._warm_pointers is None:  # the first call: a plain run, and the addresses to compare
                self._warm_pointers = [t.data_ptr() for t in inputs]
                return self.runner.run_checked(inputs)
            self._copied = {i for i, t in enumerate(inputs) if t.data_ptr() != self._warm_pointers[i]}
            return self._capture(inputs)
        if any(inputs[i].data_ptr() != pointer for i, pointer in self._static_pointers):
            self._copied |= {i for i, pointer in self._static_pointers if inputs[i].data_ptr() != pointer}
            return self._capture(inputs)
        if any(owned.alive() for owned in self._owned):
            for owned in self._owned:  # the caller keeps these: copied out after every later replay
                owned.copy_out = owned.copy_out or owned.alive()
            self._count("cuda_graph_plain_runs")
            return self.runner.run_checked(inputs)
        return self._replay(inputs)

    # -- capture ----------------------------------------------------------------------

    def _capture(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        if self.captures >= MAX_CAPTURES:
            return self._give_up(inputs, f"input addresses kept changing after {MAX_CAPTURES} captures")
        self.captures += 1
        self._graph = None  # the previous graph and its pool go
        device = inputs[0].device
        overlapping = [i for i in sorted(self._copied) if torch._debug_has_internal_overlap(inputs[i]) != 0]
        if overlapping:
            return self._give_up(inputs, f"input {overlapping[0]} has overlapping elements (an expanded view) and "
                                         "its address changes between calls, so it cannot be copied into the graph")
        self._placeholders = {i: torch.empty_strided(inputs[i].shape, inputs[i].stride(), dtype=inputs[i].dtype,
                                                     device=device) for i in sorted(self._copied)}
        graph_inputs = [self._placeholders.get(i, t) for i, t in enumerate(inputs)]
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                outputs = self.runner.run_checked(graph_inputs)
        except Exception as exc:  # an op the capture refused: the stream is out of capture mode again
            torch.cuda.synchronize(device)
            return self._give_up(inputs, f"CUDA graph capture failed: {type(exc).__name__}: {str(exc)[:300]}")
        recipes = self._recipes(outputs, graph_inputs)
        if isinstance(recipes, str):
            return self._give_up(inputs, recipes)
        self._graph, self._recipes_ = graph, recipes
        self._owned = list({id(r.owned): r.owned for r in recipes if r.owned is not None}.values())
        self._static_pointers = [(i, t.data_ptr()) for i, t in enumerate(inputs) if i not in self._copied]
        self._copy_back = [i for i in sorted(self._copied) if i in self.mutated]
        del outputs
        for owned in self._owned:
            owned.baseline = torch._C._storage_Use_Count(owned.storage._cdata)
        self._count("cuda_graphs_captured")
        return self._replay(inputs)

    def _recipes(self, outputs: list[torch.Tensor], graph_inputs: list[torch.Tensor]) -> list[_OutputRecipe] | str:
        input_storages = {t.untyped_storage().data_ptr(): i for i, t in enumerate(graph_inputs) if t.numel()}
        constants = self.runner.constant_pointers(graph_inputs[0].device) if graph_inputs else set()
        owned: dict[int, _OwnedStorage] = {}
        recipes = []
        for out in outputs:
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
                    owned[storage.data_ptr()] = _OwnedStorage(storage, base, 0)
                recipe.owned, recipe.storage_offset = owned[storage.data_ptr()], out.storage_offset()
            recipes.append(recipe)
        return recipes

    def _give_up(self, inputs: Sequence[torch.Tensor], reason: str) -> list[torch.Tensor]:
        self._graph, self.plain_reason = None, reason
        self._report(reason)
        return self.runner.run_checked(inputs)

    # -- replay -----------------------------------------------------------------------

    def _replay(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        if self._placeholders:
            torch._foreach_copy_([self._placeholders[i] for i in self._placeholders],
                                 [inputs[i] for i in self._placeholders])
        self._graph.replay()
        self._count("cuda_graph_replays")
        for i in self._copy_back:
            inputs[i].copy_(self._placeholders[i])
        copies = {id(o): _copy_out(o) for o in self._owned if o.copy_out}
        return [self._remake(recipe, inputs, copies) for recipe in self._recipes_]

    @staticmethod
    def _remake(recipe: _OutputRecipe, inputs: Sequence[torch.Tensor], copies: dict[int, torch.Tensor]) -> torch.Tensor:
        if recipe.fixed is not None:
            return recipe.fixed
        if recipe.owned is not None:
            base = copies.get(id(recipe.owned), recipe.owned.base)
            return torch.empty(0, dtype=recipe.dtype, device=base.device).set_(
                base.untyped_storage(), recipe.storage_offset, recipe.size, recipe.stride)
        source = inputs[recipe.input_index]
        return torch.empty(0, dtype=recipe.dtype, device=source.device).set_(
            source.untyped_storage(), (source.data_ptr() - source.untyped_storage().data_ptr() + recipe.byte_offset)
            // recipe.dtype.itemsize, recipe.size, recipe.stride)


def _copy_out(owned: _OwnedStorage) -> torch.Tensor:
    return owned.base.clone()


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
