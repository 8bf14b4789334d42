"""Runs an artifact: follows its launch plan, launching kernels and extern ATen calls.

    run = load(artifact)            # an Artifact or its bytes
    outputs = run(*inputs)          # list of tensors

On CPU tensors the kernels run under Triton's interpreter (TRITON_INTERPRET=1 is set
for the kernels this module loads). On a GPU, kernels run from the artifact's cubins
when it carries them for this device, else from source through Triton's JIT.
Extern calls are limited to ATen/prims ops (`ALLOWED_NAMESPACES`). Kernel code (cubins, and the
sources the interpreter imports) is loaded only from artifacts whose signature checks
(compiler/signing.py, docs/TRUST.md).
"""

from __future__ import annotations

import importlib.util
import math
import os
from operator import itemgetter
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from client import default_cache_dir
from compiler.artifact import Artifact, constant_file
from compiler.signing import TrustedKeys, verify_artifact

ALLOWED_NAMESPACES = ("aten", "prims")
ALIGNMENT = 16  # bytes: kernels were built assuming pointers aligned so (Triton's divisibility hint)

if not torch.cuda.is_available():
    # Triton picks interpreter or compiler when it is imported: decide before anyone imports it.
    os.environ.setdefault("TRITON_INTERPRET", "1")


try:  # the C helpers Inductor's generated wrappers call: a view and an allocation without the dispatcher's overhead
    from torch._C._dynamo.guards import _empty_strided_cpu, _empty_strided_cuda, _reinterpret_tensor
except ImportError:  # pragma: no cover - older or newer torch: the public equivalents
    _reinterpret_tensor = None
    _empty_strided_cpu = _empty_strided_cuda = None


class RuntimeError_(RuntimeError):
    """The artifact cannot run with these inputs (or at all); the message says why."""


def load(artifact: Artifact | bytes, cache_dir: Path | None = None, trusted: TrustedKeys | None = None) -> "CompiledGraph":
    """`cache_dir` (default: default_cache_dir()) holds the kernel sources that CPU runs import.

    Nothing of an artifact is loaded before its signature checks against `trusted` (default: the
    keys of FUSEWIRE_TRUSTED_KEYS / FUSEWIRE_TRUSTED_KEYS_FILE); only an artifact this process
    compiled itself skips the check. Raises SignatureError (a ValueError) when it fails."""
    if isinstance(artifact, (bytes, bytearray)):
        artifact = Artifact.from_bytes(bytes(artifact))
    if not artifact.built_here:
        verify_artifact(artifact, trusted if trusted is not None else TrustedKeys.from_env())
    return CompiledGraph(artifact, cache_dir or default_cache_dir())


class CompiledGraph:
    """An artifact ready to run. Everything about its plan is worked out once per device
    (`_Program`): argument lists, grids, allocation sizes and reuse, views; a call checks the
    inputs' signature and walks the prepared steps."""

    def __init__(self, artifact: Artifact, cache_dir: Path) -> None:
        self.artifact = artifact
        self.cache_dir = cache_dir
        self.plan = artifact.plan
        self._programs: dict[torch.device, _Program] = {}
        self._input_specs = [(tuple(s["size"]), tuple(s["stride"]), getattr(torch, s["dtype"]))
                             for s in self.plan["inputs"]]

    def __call__(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        self._check_inputs(inputs)
        return self.run_checked(inputs)

    def run_checked(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Runs on inputs whose shapes, strides and dtypes the caller has checked already."""
        device = inputs[0].device if inputs else _CPU
        program = self._programs.get(device)
        if program is None:
            program = self._programs[device] = _Program(self, device)
        return program.run(inputs)

    def constant_pointers(self, device: torch.device) -> set[int]:
        """Addresses of the storages of the artifact's constants on `device` (prepared by a run there)."""
        program = self._programs.get(device)
        return {t.untyped_storage().data_ptr() for t in program.template if t is not None} if program else set()

    def _check_inputs(self, inputs: Sequence[torch.Tensor]) -> None:
        if len(inputs) != len(self._input_specs):
            raise RuntimeError_(f"expected {len(self._input_specs)} inputs, got {len(inputs)}")
        for i, ((size, stride, dtype), tensor) in enumerate(zip(self._input_specs, inputs)):
            if tensor.shape == size and tensor.dtype == dtype and tensor.stride() == stride:
                continue
            spec = self.plan["inputs"][i]
            if not _equivalent_strides(tensor, spec):
                got = (list(tensor.shape), list(tensor.stride()), str(tensor.dtype).removeprefix("torch."))
                raise RuntimeError_(f"input {i}: compiled for shape/stride/dtype "
                                    f"{(spec['size'], spec['stride'], spec['dtype'])}, got {got}")

    def _kernels_on(self, device: torch.device) -> dict[str, Any]:
        return {k["name"]: _load_kernel(self.artifact, k, device, self.cache_dir) for k in self.artifact.manifest["kernels"]}

    def _constants_on(self, device: torch.device) -> dict[str, torch.Tensor]:
        """The graph's constants on `device`, made from the artifact's bytes."""
        return {entry["buffer"]: _constant(self.artifact.files[constant_file(entry)], entry, device)
                for entry in self.plan.get("constants", [])}


_CPU = torch.device("cpu")
_data_ptr = torch.Tensor.data_ptr
Env = list  # a call's tensors, one slot per buffer of the plan
Unplanned = dict  # buffer -> planned layout, for extern results unlike their plan (read by no kernel)


class _Program:
    """The plan prepared for one device: each step a closure over slot numbers (buffers), its
    launcher and its grid. `run` fills a fresh slot list and calls the steps in order."""

    def __init__(self, graph: CompiledGraph, device: torch.device) -> None:
        plan = self.plan = graph.plan
        self.device = device
        self.slots: dict[str, int] = {spec["buffer"]: i for i, spec in enumerate(plan["inputs"])}
        self.inputs = len(self.slots)
        kernel_read = {name for step in plan["steps"] if step["op"] == "kernel" for name in step["args"]}
        constants = [(self._slot(name), tensor) for name, tensor in graph._constants_on(device).items()]
        self._constant_buffers = {entry["buffer"] for entry in plan.get("constants", [])}
        self._passed: set[str] = set()  # buffers an output hands out as they are (one output each)
        # (size, stride) of the tensor each buffer's slot holds, where the plan fixes it: allocations and
        # ATen results (unless `unplanned`). Not inputs: the strides of their size-1 dims may differ.
        self._held: dict[str, tuple] = {}
        self._extern_outputs: set[str] = set()
        kernels = graph._kernels_on(device)
        self.steps = [self._prepare(step, kernels, kernel_read) for step in plan["steps"]]
        self.outputs = [self._output(o) for o in plan["outputs"]]
        self.template: Env = [None] * len(self.slots)
        for slot, tensor in constants:
            self.template[slot] = tensor
        # inputs that kernels read directly: on a GPU their addresses must be 16-byte aligned
        self.aligned_inputs = [i for i, spec in enumerate(plan["inputs"]) if spec["buffer"] in kernel_read] \
            if device.type == "cuda" else []

    def _slot(self, buffer: str) -> int:
        return self.slots.setdefault(buffer, len(self.slots))

    def run(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        env = self.template.copy()
        env[:self.inputs] = inputs
        moved = [i for i in self.aligned_inputs if env[i].data_ptr() % ALIGNMENT]
        for i in moved:  # kernels were built for aligned pointers: run on an aligned copy
            env[i] = torch.empty_strided(inputs[i].shape, inputs[i].stride(), dtype=inputs[i].dtype,
                                         device=self.device).copy_(inputs[i])
        unplanned: Unplanned = {}
        if self.device.type == "cuda":
            stream = torch.cuda.current_stream(self.device).cuda_stream
            with torch.cuda.device(self.device):  # plan allocations go to the current device
                for step in self.steps:
                    step(env, unplanned, stream)
        else:
            for step in self.steps:
                step(env, unplanned, 0)
        for i in moved:  # the copy may have been written (a mutated input)
            inputs[i].copy_(env[i])
        return [output(env, unplanned) for output in self.outputs]

    def _prepare(self, step: dict[str, Any], kernels: dict[str, Any], kernel_read: set[str]) -> Callable:
        op = step["op"]
        if op == "alloc":
            return self._alloc(step)
        if op == "free":
            slot = self._slot(step["buffer"])
            if step.get("keep"):  # a later alloc reuses it (and clears the slot then)
                return lambda env, unplanned, stream: None

            def free(env: Env, unplanned: Unplanned, stream: int) -> None:
                env[slot] = None
            return free
        if op == "kernel":
            return self._kernel(step, kernels[step["kernel"]])
        if op == "extern":
            return self._extern(step, kernel_read)
        raise RuntimeError_(f"unknown plan step {op!r}")

    def _alloc(self, step: dict[str, Any]) -> Callable:
        buffer = step["buffer"]
        slot, meta = self._slot(buffer), self.plan["buffers"][buffer]
        own = _allocated_layout(meta)
        if "reuse" in step:
            old = self._slot(step["reuse"])
            if self._held.get(step["reuse"]) == own:
                def reuse(env: Env, unplanned: Unplanned, stream: int) -> None:
                    env[slot], env[old] = env[old], None
            else:  # viewed in its own layout once here, not at every use
                size, stride = own

                def reuse(env: Env, unplanned: Unplanned, stream: int) -> None:
                    env[slot], env[old] = _as_view(env[old], size, stride, 0), None
            self._held[buffer] = own
            return reuse
        self._held[buffer] = own
        return _allocator(slot, meta, self.device)

    def _kernel(self, step: dict[str, Any], kernel: Any) -> Callable:
        slots = [self._slot(name) for name in step["args"]]
        grid = tuple(step["grid"])
        if hasattr(kernel, "launcher"):  # a prebuilt cubin: the cheapest launch path there is
            # Pointers go to Triton's launcher as ints: given tensors, it asks the driver about each
            # pointer (cuPointerGetAttribute) on every launch. Every slot holds a tensor on this device.
            launch = kernel.launcher(grid)
            if len(slots) == 1:
                (only,) = slots

                def run_cubin_1(env: Env, unplanned: Unplanned, stream: int) -> None:
                    launch(stream, env[only].data_ptr())
                return run_cubin_1
            arguments = itemgetter(*slots)

            def run_cubin(env: Env, unplanned: Unplanned, stream: int) -> None:
                launch(stream, *map(_data_ptr, arguments(env)))
            return run_cubin
        config = step["config"]
        fixed = dict(xnumel=step["xnumel"], rnumel=step["rnumel"], XBLOCK=config["XBLOCK"], RBLOCK=config["RBLOCK"],
                     num_warps=config["num_warps"], num_stages=config.get("num_stages", 1))
        launch = kernel[grid]

        def run_source(env: Env, unplanned: Unplanned, stream: int) -> None:
            launch(*[env[i] for i in slots], **fixed)
        return run_source

    def _extern(self, step: dict[str, Any], kernel_read: set[str]) -> Callable:
        namespace, name, overload = step["target"].split(".")
        if namespace not in ALLOWED_NAMESPACES:
            raise RuntimeError_(f"extern call to {step['target']} is not allowed")
        op = getattr(getattr(getattr(torch.ops, namespace), name), overload)
        args = [self._value(a) for a in step["args"]]
        kwargs = {k: self._value(v) for k, v in step["kwargs"].items()}
        positions = step.get("positions")
        outputs = [(self._slot(b), b, _Planned(layout, self.device), b in kernel_read)
                   for b, layout in zip(step["outputs"], step["layouts"])]
        for b, layout in zip(step["outputs"], step["layouts"]):
            self._held[b] = _shape_of(layout)
            self._extern_outputs.add(b)
        target = step["target"]

        def call(env: Env, unplanned: Unplanned, stream: int) -> None:
            result = op(*[a(env, unplanned) for a in args], **{k: v(env, unplanned) for k, v in kwargs.items()})
            results = [result] if isinstance(result, torch.Tensor) else list(result) if result is not None else []
            if positions is not None:
                results = [results[i] for i in positions]
            for (slot, buffer, planned, read_by_kernel), tensor in zip(outputs, results):
                if planned.matches(tensor):
                    env[slot] = tensor
                elif not read_by_kernel and planned.unlike(tensor):
                    # e.g. the CPU kernel's empty (or bf16) batch-norm statistics where PyTorch's meta kernel
                    # says float32 of the channel count: read only by other ATen calls, which agree with it
                    env[slot], unplanned[buffer] = tensor, planned.layout
                else:
                    env[slot] = planned.convert(tensor, target)
        return call

    def _value(self, value: Any) -> Callable[[Env, Unplanned], Any]:
        """An extern argument, as a function of the call's slots."""
        if isinstance(value, list):
            items = [self._value(v) for v in value]
            return lambda env, unplanned: [item(env, unplanned) for item in items]
        if isinstance(value, dict) and "tensor" in value:
            return self._viewer(value["tensor"])
        constant = _extern_constant(value, self.device)
        return lambda env, unplanned: constant

    def _viewer(self, layout: dict[str, Any]) -> Callable[[Env, Unplanned], torch.Tensor]:
        """A function of the call's slots giving `layout`'s view of its buffer: the buffer's tensor itself
        when it already has that shape and strides (an input, an ATen result, a buffer allocated in its
        own layout), else a view made without the dispatcher (`_reinterpret_tensor`)."""
        slot, buffer = self._slot(layout["buffer"]), layout["buffer"]
        whole_or_view = self._view_maker(layout, pass_whole=True)
        if whole_or_view is None:  # the slot holds this very view (or, unplanned, what ATen calls read)
            return lambda env, unplanned: env[slot]
        if buffer not in self._extern_outputs:
            return lambda env, unplanned: whole_or_view(env[slot])

        def view(env: Env, unplanned: Unplanned) -> torch.Tensor:
            if buffer in unplanned:
                return env[slot]  # an ATen result unlike its plan, read by ATen calls only
            return whole_or_view(env[slot])
        return view

    def _output(self, layout: dict[str, Any]) -> Callable[[Env, Unplanned], torch.Tensor]:
        slot, buffer = self._slot(layout["buffer"]), layout["buffer"]
        # an input or constant is handed out as a view, never as the caller's (or our) tensor object
        may_pass = slot >= self.inputs and buffer not in self._constant_buffers and buffer not in self._passed
        self._passed.add(buffer)
        make_view = self._view_maker(layout, pass_whole=may_pass) or (lambda tensor: tensor)
        if buffer not in self._extern_outputs:
            return lambda env, unplanned: make_view(env[slot])

        def output(env: Env, unplanned: Unplanned) -> torch.Tensor:
            planned = unplanned.get(buffer)
            if planned is not None:
                return _unplanned_output(env[slot], layout, planned)
            return make_view(env[slot])
        return output

    def _view_maker(self, layout: dict[str, Any], pass_whole: bool) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """base -> `layout`'s view of it; None when, with `pass_whole`, the slot is known to hold that
        very view (the tensor itself is handed on, no check at run time)."""
        held = self._held.get(layout["buffer"])
        if pass_whole and held is not None and not layout["offset"] and held == _shape_of(layout):
            return None
        return _view_maker(layout, pass_whole=pass_whole and held is None)


class _Planned:
    """An extern result's planned layout, checked cheaply: most results match it as ATen made them."""

    def __init__(self, layout: dict[str, Any], device: torch.device) -> None:
        self.layout, self.device = layout, device
        self.size, self.stride = tuple(layout["size"]), tuple(layout["stride"])
        self.dtype = getattr(torch, layout["dtype"])
        self.check_alignment = device.type == "cuda"
        self.strides_matter = 1 < math.prod(self.size)

    def matches(self, tensor: torch.Tensor) -> bool:
        return (tensor.dtype == self.dtype and tensor.shape == self.size
                and (not self.strides_matter or tensor.stride() == self.stride)
                and not (self.check_alignment and tensor.data_ptr() % ALIGNMENT))

    def unlike(self, tensor: torch.Tensor) -> bool:
        return tensor.shape != self.size or tensor.dtype != self.dtype

    def convert(self, tensor: torch.Tensor, target: str) -> torch.Tensor:
        """The result in the layout and dtype the plan gives it (PyTorch's meta kernel's), so kernels that
        read it index it as planned. Some CPU kernels disagree with their meta kernel (bf16 batch norm
        statistics come back bf16, not float32): converted, as is a view at an address kernels cannot
        take (not 16-byte aligned). A shape that disagrees is refused, since no kernel could read it
        safely."""
        if tensor.shape != self.size:
            raise RuntimeError_(f"{target} returned a tensor of shape {list(tensor.shape)} where the plan (PyTorch's "
                                f"meta kernel for it) has {list(self.size)}")
        return torch.empty_strided(self.size, self.stride, dtype=self.dtype, device=self.device).copy_(tensor)


def _shape_of(layout: dict[str, Any]) -> tuple:
    return tuple(layout["size"]), tuple(layout["stride"])


def _as_view(base: torch.Tensor, size: tuple, stride: tuple, offset: int) -> torch.Tensor:
    if _reinterpret_tensor is not None:
        return _reinterpret_tensor(base, size, stride, offset)
    return base.as_strided(size, stride, base.storage_offset() + offset)


def _view_maker(layout: dict[str, Any], pass_whole: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """base -> `layout`'s view of it; with `pass_whole`, base itself when it already is that view."""
    size, stride, offset = tuple(layout["size"]), tuple(layout["stride"]), layout["offset"]
    if not pass_whole or offset:
        return lambda base: _as_view(base, size, stride, offset)
    return lambda base: base if base.shape == size and base.stride() == stride else _as_view(base, size, stride, 0)


def _allocated_layout(meta: dict[str, Any]) -> tuple:
    """(size, stride) a plan buffer is allocated with: its own layout when the plan gives one, else flat."""
    return (tuple(meta["size"]), tuple(meta["stride"])) if "size" in meta else ((meta["numel"],), (1,))


def _allocator(slot: int, meta: dict[str, Any], device: torch.device) -> Callable:
    """A plan buffer, in its own layout when the plan gives one (extern calls and outputs then take
    the tensor as it is), else flat."""
    dtype = getattr(torch, meta["dtype"])
    size, stride = _allocated_layout(meta)
    fast = _empty_strided_cuda if device.type == "cuda" else _empty_strided_cpu if device.type == "cpu" else None
    if fast is not None:
        def alloc(env: Env, unplanned: Unplanned, stream: int) -> None:
            env[slot] = fast(size, stride, dtype)
        return alloc

    def alloc_any(env: Env, unplanned: Unplanned, stream: int) -> None:
        env[slot] = torch.empty_strided(size, stride, dtype=dtype, device=device)
    return alloc_any


def _constant(raw: bytes, entry: dict[str, Any], device: torch.device) -> torch.Tensor:
    dtype = getattr(torch, entry["dtype"])
    flat = torch.frombuffer(bytearray(raw), dtype=dtype) if raw else torch.empty(0, dtype=dtype)
    return flat.to(device)


def _equivalent_strides(tensor: torch.Tensor, spec: dict[str, Any]) -> bool:
    """Strides of size-1 dims never matter."""
    if list(tensor.shape) != spec["size"] or str(tensor.dtype).removeprefix("torch.") != spec["dtype"]:
        return False
    return all(s == 1 or a == b for s, a, b in zip(spec["size"], tensor.stride(), spec["stride"]))


def _unplanned_output(base: torch.Tensor, layout: dict[str, Any], planned: dict) -> torch.Tensor:
    """A graph output that is an extern result unlike its plan: handed over as ATen made it, when it is
    the whole result (a view of it cannot be made safely)."""
    if [layout["size"], layout["stride"], layout["offset"]] != [planned["size"], planned["stride"], planned["offset"]]:
        raise RuntimeError_(f"an output views an ATen result of shape {list(base.shape)} as {layout['size']}, "
                            "the shape PyTorch's meta kernel gives it")
    return base


def _extern_constant(value: Any, device: torch.device) -> Any:
    """A non-tensor extern argument as ATen takes it (dtypes, devices, floats written as strings...)."""
    if isinstance(value, dict):
        if "dtype" in value:
            return getattr(torch, value["dtype"])
        if "device" in value:
            return device
        if "float" in value:
            return float(value["float"])
        if "layout" in value:
            return getattr(torch, value["layout"])
        if "memory_format" in value:
            return getattr(torch, value["memory_format"])
    return value


def _load_kernel(artifact: Artifact, entry: dict[str, Any], device: torch.device, cache_dir: Path) -> Any:
    if device.type == "cuda" and entry.get("cubin"):
        from client.cubin import CubinKernel

        return CubinKernel(entry, artifact.files[entry["cubin"]])
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError_("CPU tensors run under Triton's interpreter: set TRITON_INTERPRET=1 before importing triton")
    # Triton reads a kernel's source back from its file, so kernels are imported from disk.
    path = cache_dir / "kernels" / artifact.key / f"{entry['name']}.py"
    source = artifact.kernel_source(entry)
    if not path.exists() or path.read_text() != source:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(source)
        partial.replace(path)
    spec = importlib.util.spec_from_file_location(f"fusewire_kernels.k{artifact.key[:16]}.{entry['name']}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, entry["name"])
