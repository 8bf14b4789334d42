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
import keyword
import math
import os
import re
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from client import default_cache_dir
from compiler.artifact import Artifact, constant_file, tensor_buffers
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

    def run_checked(self, inputs: Sequence[torch.Tensor], release: bool = False) -> list[torch.Tensor]:
        """Runs on inputs whose shapes, strides and dtypes the caller has checked already. With
        `release`, `inputs` is a list the caller hands over: it is emptied, and each input is dropped
        after the last step that reads it, so its memory can go before the graph ends (a backward's
        saved activations; what Inductor's wrappers do with aot_autograd's boxed calls)."""
        device = inputs[0].device if inputs else _CPU
        program = self._programs.get(device)
        if program is None:
            program = self._programs[device] = _Program(self, device)
        return program.run(inputs, release)

    def constant_pointers(self, device: torch.device) -> set[int]:
        """Addresses of the storages of the artifact's constants on `device` (prepared by a run there)."""
        program = self._programs.get(device)
        return {t.untyped_storage().data_ptr() for t in program.constants.values()} if program else set()

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
Unplanned = dict  # buffer -> planned layout, for extern results unlike their plan (read by no kernel)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,80}")  # kernel and op names become names in the source: or not


class _Program:
    """The plan prepared for one device, as one generated Python function (`source`): every buffer a
    local variable, every step a line: allocations with their sizes, launches with their grids and
    pointer lists, extern calls with their views, frees. This is what Inductor's generated wrapper
    is, without the per-step closure calls and list indexing a loop over prepared steps costs.

    The source names only local variables (`s<slot>`) and objects it is handed (`_names`); nothing of
    the plan but integers is written into it."""

    def __init__(self, graph: CompiledGraph, device: torch.device) -> None:
        plan = self.plan = graph.plan
        self.device = device
        self.slots: dict[str, int] = {spec["buffer"]: i for i, spec in enumerate(plan["inputs"])}
        self.inputs = len(self.slots)
        kernel_read = {name for step in plan["steps"] if step["op"] == "kernel" for name in step["args"]}
        self._constant_buffers = {entry["buffer"] for entry in plan.get("constants", [])}
        self._passed: set[str] = set()  # buffers an output hands out as they are (one output each)
        # (size, stride) of the tensor each buffer's variable holds, where the plan fixes it: allocations and
        # ATen results (unless `unplanned`), inputs without size-1 dims (whose strides may differ: unheld).
        self._held: dict[str, tuple] = {spec["buffer"]: (tuple(spec["size"]), tuple(spec["stride"]))
                                         for spec in plan["inputs"] if 1 not in spec["size"]}
        self._extern_outputs: set[str] = set()
        self._donated: set[str] = set()  # buffers whose storage an in-place kernel output took over
        self._names: dict[str, Any] = {"Tensor": torch.Tensor, "view": _as_view, "results_of": _results_of,
                                       "empty": _allocator(device), "unplanned_output": _unplanned_output}
        self._lines: list[str] = []
        self.constants = graph._constants_on(device)
        for buffer, tensor in self.constants.items():
            self._line(f"{self._var(buffer)} = {self._name(tensor, 'constant')}")
        kernels = graph._kernels_on(device)
        last_reads = _last_reads(plan, {spec["buffer"] for spec in plan["inputs"]})
        for i, step in enumerate(plan["steps"]):
            self._prepare(step, kernels, kernel_read)
            for buffer in last_reads.get(i, ()):
                self._line(f"{self._var(buffer)} = None  # an input, last read above")
        outputs = [self._output(o) for o in plan["outputs"]]
        self._line(f"return [{', '.join(outputs)}]")
        self.source = self._function_source()
        namespace = dict(self._names)
        exec(compile(self.source, f"<fusewire plan {graph.artifact.key[:12]}>", "exec"), namespace)
        self._steps = namespace["steps"]
        # inputs that kernels read directly: on a GPU their addresses must be 16-byte aligned
        self.aligned_inputs = [i for i, spec in enumerate(plan["inputs"]) if spec["buffer"] in kernel_read] \
            if device.type == "cuda" else []
        self._raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)

    # -- building the source --------------------------------------------------------------------

    def _var(self, buffer: str) -> str:
        return f"s{self.slots.setdefault(buffer, len(self.slots))}"

    def _name(self, value: Any, hint: str) -> str:
        """A name the source can use for `value` (handed to the function, never written as text)."""
        if value is None or value is True or value is False or type(value) is int:
            return repr(value)
        name = f"{hint if _IDENTIFIER.fullmatch(hint) else 'value'}_{len(self._names)}"
        self._names[name] = value
        return name

    def _line(self, text: str) -> None:
        self._lines.append(text)

    def _function_source(self) -> str:
        inputs = [f"s{i}" for i in range(self.inputs)]
        head = ["def steps(inputs, stream):"]
        if inputs:
            head.append(f"    {', '.join(inputs)}, = inputs")
            head.append("    inputs.clear()")
        head.append("    unplanned = {}")
        return "\n".join(head + [f"    {line}" for line in self._lines]) + "\n"

    def _prepare(self, step: dict[str, Any], kernels: dict[str, Any], kernel_read: set[str]) -> None:
        op = step["op"]
        if op == "alloc":
            self._alloc(step)
        elif op == "free":
            # kept: a later alloc reuses it (and clears the variable then); taken over in place by the
            # kernel that just read it: the storage lives on in the kernel's output
            if not step.get("keep") or step["buffer"] in self._donated:
                self._line(f"{self._var(step['buffer'])} = None")
        elif op == "kernel":
            self._kernel(step, kernels[step["kernel"]])
        elif op == "extern":
            self._extern(step, kernel_read)
        else:
            raise RuntimeError_(f"unknown plan step {op!r}")

    def _alloc(self, step: dict[str, Any]) -> None:
        buffer = step["buffer"]
        var, meta = self._var(buffer), self.plan["buffers"][buffer]
        own = _allocated_layout(meta)
        size, stride = (self._name(v, "shape") for v in own)
        if step.get("inplace"):  # the next kernel reads the old buffer and writes this one over it
            self._line(f"{var} = {self._in_own_layout(step['reuse'], own, size, stride)}")
            self._donated.add(step["reuse"])
        elif "reuse" in step:
            self._line(f"{var}, {self._var(step['reuse'])} = {self._in_own_layout(step['reuse'], own, size, stride)}, None")
        else:
            self._line(f"{var} = empty({size}, {stride}, {self._name(getattr(torch, meta['dtype']), 'dtype')})")
        self._held[buffer] = own

    def _in_own_layout(self, reused: str, own: tuple, size: str, stride: str) -> str:
        """The reused buffer's variable as the new buffer: itself when it is held in the new buffer's
        layout, else a view of its storage in that layout (made once here, not at every use)."""
        old = self._var(reused)
        return old if self._held.get(reused) == own else f"view({old}, {size}, {stride}, 0)"

    def _kernel(self, step: dict[str, Any], kernel: Any) -> None:
        variables = [self._var(name) for name in step["args"]]
        grid = tuple(step["grid"])
        if hasattr(kernel, "launcher"):  # a prebuilt cubin: the cheapest launch path there is
            # Pointers go to Triton's launcher as ints: given tensors, it asks the driver about each
            # pointer (cuPointerGetAttribute) on every launch. Every variable holds a tensor on this device.
            pointers = [f"{v}.data_ptr()" for v in variables]
            direct = kernel.direct_call(grid)
            if direct is None:  # scratch memory or a profiler's launch hooks: Triton's slower path
                self._line(f"{self._name(kernel.launcher(grid), 'launch')}(stream, {', '.join(pointers)})")
                return
            c_launch, before, after = direct
            before = [self._name(v, "launch_arg") for v in before]
            after = [self._name(v, "launch_arg") for v in after]
            arguments = [*before[:3], "stream", *before[3:], *pointers, *after]
            self._line(f"{self._name(c_launch, step['kernel'])}({', '.join(arguments)})")
            return
        config = step["config"]
        fixed = dict(xnumel=step["xnumel"], rnumel=step["rnumel"], XBLOCK=config["XBLOCK"], RBLOCK=config["RBLOCK"],
                     num_warps=config["num_warps"], num_stages=config.get("num_stages", 1))
        self._line(f"{self._name(kernel[grid], step['kernel'])}({', '.join(variables)}, **{self._name(fixed, 'config')})")

    def _extern(self, step: dict[str, Any], kernel_read: set[str]) -> None:
        namespace, name, overload = step["target"].split(".")
        if namespace not in ALLOWED_NAMESPACES:
            raise RuntimeError_(f"extern call to {step['target']} is not allowed")
        op = getattr(getattr(getattr(torch.ops, namespace), name), overload)
        arguments = [self._value(a) for a in step["args"]]
        for key, value in step["kwargs"].items():
            if not key.isidentifier() or keyword.iskeyword(key):
                raise RuntimeError_(f"extern call to {step['target']}: {key!r} is not an argument name")
            arguments.append(f"{key}={self._value(value)}")
        op = channels_last_call(step, op, self.device) or op
        call = f"{self._name(op, name)}({', '.join(arguments)})"
        outputs = list(zip(step["outputs"], step["layouts"]))
        if not outputs:
            self._line(call)
            return
        positions = step.get("positions")
        if len(outputs) == 1 and positions is None:
            var = self._var(outputs[0][0])
            self._line(f"{var} = {call}")
            self._line(f"if not isinstance({var}, Tensor): {var} = results_of({var}, None, 1)[0]")
        else:
            self._line(f"result = results_of({call}, {self._name(positions, 'positions')}, {len(outputs)})")
            for i, (buffer, _) in enumerate(outputs):
                self._line(f"{self._var(buffer)} = result[{i}]")
            self._line("result = None")  # no reference outlives the buffers' frees
        for buffer, layout in outputs:
            var, planned = self._var(buffer), _Planned(layout, self.device)
            fix = planned.fixer(buffer, step["target"], read_by_kernel=buffer in kernel_read)
            self._line(f"if not ({planned.check_source(var, self._name)}): {var} = {self._name(fix, 'fix')}({var}, unplanned)")
            self._held[buffer] = _shape_of(layout)
            self._extern_outputs.add(buffer)

    def _value(self, value: Any) -> str:
        """An extern argument, as source."""
        if isinstance(value, list):
            return f"[{', '.join(self._value(v) for v in value)}]"
        if isinstance(value, dict) and "tensor" in value:
            return self._viewer(value["tensor"])
        return self._name(_extern_constant(value, self.device), "argument")

    def _viewer(self, layout: dict[str, Any]) -> str:
        """Source for `layout`'s view of its buffer: the buffer's tensor itself when it already has that
        shape and strides (an input, an ATen result, a buffer allocated in its own layout), else a view
        made without the dispatcher (`_reinterpret_tensor`)."""
        var, buffer = self._var(layout["buffer"]), layout["buffer"]
        view = self._view_source(var, layout, pass_whole=True)
        if view == var or buffer not in self._extern_outputs:
            return view
        # an ATen result unlike its plan (unplanned) is read by ATen calls only, as ATen made it
        return f"({var} if {self._name(buffer, 'buffer')} in unplanned else {view})"

    def _output(self, layout: dict[str, Any]) -> str:
        var, buffer = self._var(layout["buffer"]), layout["buffer"]
        # an input or constant is handed out as a view, never as the caller's (or our) tensor object
        may_pass = (self.slots[buffer] >= self.inputs and buffer not in self._constant_buffers
                    and buffer not in self._passed)
        self._passed.add(buffer)
        view = self._view_source(var, layout, pass_whole=may_pass)
        if buffer not in self._extern_outputs:
            return view
        key = self._name(buffer, "buffer")
        return f"(unplanned_output({var}, {self._name(layout, 'layout')}, unplanned[{key}]) if {key} in unplanned else {view})"

    def _view_source(self, var: str, layout: dict[str, Any], pass_whole: bool) -> str:
        """Source for `layout`'s view of the tensor in `var`; with `pass_whole`, `var` itself where it
        is known to hold that very view (no check at run time), or is found to at run time."""
        held = self._held.get(layout["buffer"])
        size, stride, offset = tuple(layout["size"]), tuple(layout["stride"]), layout["offset"]
        if pass_whole and held is not None and not offset and held == (size, stride):
            return var
        size_name, stride_name = self._name(size, "shape"), self._name(stride, "shape")
        made = f"view({var}, {size_name}, {stride_name}, {int(offset)})"
        if pass_whole and held is None and not offset:
            return f"({var} if {var}.shape == {size_name} and {var}.stride() == {stride_name} else {made})"
        return made

    # -- running ----------------------------------------------------------------------------------

    def run(self, inputs: Sequence[torch.Tensor], release: bool = False) -> list[torch.Tensor]:
        """`release`: `inputs` is a list handed over (the steps empty it and drop each input after its
        last use); else the caller's sequence is left as it is."""
        if not release:
            inputs = list(inputs)
        moved = {i: inputs[i] for i in self.aligned_inputs if inputs[i].data_ptr() % ALIGNMENT}
        copies = {}
        for i, given in moved.items():  # kernels were built for aligned pointers: run on aligned copies
            inputs[i] = copies[i] = torch.empty_strided(given.shape, given.stride(), dtype=given.dtype,
                                                        device=self.device).copy_(given)
        if self.device.type == "cuda":
            with torch.cuda.device(self.device):  # plan allocations go to this device
                stream = self._raw_stream(self.device.index) if self._raw_stream else \
                    torch.cuda.current_stream(self.device).cuda_stream
                outputs = self._steps(inputs, stream)
        else:
            outputs = self._steps(inputs, 0)
        for i, given in moved.items():  # the copy may have been written (a mutated input)
            given.copy_(copies[i])
        return outputs


def _last_reads(plan: dict[str, Any], inputs: set[str]) -> dict[int, list[str]]:
    """step index -> the inputs no later step reads (and no output hands out): dropped after it."""
    last: dict[str, int] = {}
    for i, step in enumerate(plan["steps"]):
        for buffer in _buffers_of(step):
            if buffer in inputs:
                last[buffer] = i
    kept = {o["buffer"] for o in plan["outputs"]}
    after: dict[int, list[str]] = {}
    for buffer, i in last.items():
        if buffer not in kept:
            after.setdefault(i, []).append(buffer)
    return after


# target -> (positions of its 4-D tensors, of `transposed`, of `groups`)
CHANNELS_LAST_CONVOLUTIONS = {"aten.convolution.default": ((0, 1), 6, 8),
                              "aten.convolution_backward.default": ((0, 1, 2), 7, 9)}


def channels_last_call(step: dict[str, Any], op: Callable, device: torch.device) -> Callable | None:
    """For a grouped (depthwise) 2-D convolution or its backward in bf16/fp16 on a GPU: `op` (the
    step's ATen op) called on channels-last copies of its 4-D tensors, else None. On NCHW tensors
    ATen runs its own depthwise kernels, several times slower than cuDNN's channels-last ones (H100,
    2026-11-25, EfficientNet-B0's training step: 5.7 of its 10.5 ms of GPU time); the planned-layout
    check converts the results to the plan's layout (the meta kernel's, NCHW)."""
    found = CHANNELS_LAST_CONVOLUTIONS.get(step["target"])
    if device.type != "cuda" or found is None:
        return None
    tensors, transposed, groups = found
    args = step["args"]
    if len(args) <= groups or args[transposed] is not False or not isinstance(args[groups], int) or args[groups] < 2:
        return None
    layouts = [args[i].get("tensor") if isinstance(args[i], dict) else None for i in tensors]
    if any(layout is None or len(layout["size"]) != 4 or layout["dtype"] not in ("bfloat16", "float16")
           for layout in layouts):
        return None
    return _on_channels_last(op, tensors)


def _on_channels_last(op: Callable, positions: Sequence[int]) -> Callable:
    def call(*args: Any, **kwargs: Any) -> Any:
        args = tuple(a.contiguous(memory_format=torch.channels_last) if i in positions else a for i, a in enumerate(args))
        return op(*args, **kwargs)
    return call


def _buffers_of(step: dict[str, Any]) -> set[str]:
    """Every buffer a plan step names."""
    if step["op"] == "kernel":
        return set(step["args"])
    if step["op"] == "extern":
        return set(step["outputs"]) | tensor_buffers([step["args"], step["kwargs"]])
    return {step.get("buffer"), step.get("reuse")} - {None}


def _results_of(result: Any, positions: list[int] | None, count: int) -> list[torch.Tensor]:
    """An extern call's tensors, in the order of its planned outputs (`positions` picks them from
    what it returned)."""
    results = [result] if isinstance(result, torch.Tensor) else list(result) if result is not None else []
    if positions is not None:
        results = [results[i] for i in positions]
    if len(results) < count:
        raise RuntimeError_(f"an extern call returned {len(results)} tensors where the plan expects {count}")
    return results


class _Planned:
    """An extern result's planned layout, checked cheaply: most results match it as ATen made them."""

    def __init__(self, layout: dict[str, Any], device: torch.device) -> None:
        self.layout, self.device = layout, device
        self.size, self.stride = tuple(layout["size"]), tuple(layout["stride"])
        self.dtype = getattr(torch, layout["dtype"])
        self.check_alignment = device.type == "cuda"
        self.strides_matter = 1 < math.prod(self.size)

    def check_source(self, var: str, name: Callable[[Any, str], str]) -> str:
        """Source of the check that the tensor in `var` is the planned one: most results are, as ATen
        made them. `name` names the objects the source uses."""
        parts = [f"{var}.dtype is {name(self.dtype, 'dtype')}", f"{var}.shape == {name(self.size, 'shape')}"]
        if self.strides_matter:
            parts.append(f"{var}.stride() == {name(self.stride, 'shape')}")
        if self.check_alignment:
            parts.append(f"not {var}.data_ptr() % {ALIGNMENT}")
        return " and ".join(parts)

    def fixer(self, buffer: str, target: str, read_by_kernel: bool) -> Callable[[torch.Tensor, Unplanned], torch.Tensor]:
        """What becomes of a result that fails the check: kept as ATen made it (and marked unplanned)
        when only ATen calls read it and it differs in shape or dtype, else converted."""
        def fix(tensor: torch.Tensor, unplanned: Unplanned) -> torch.Tensor:
            if not read_by_kernel and self.unlike(tensor):
                # e.g. the CPU kernel's empty (or bf16) batch-norm statistics where PyTorch's meta kernel
                # says float32 of the channel count: read only by other ATen calls, which agree with it
                unplanned[buffer] = self.layout
                return tensor
            return self.convert(tensor, target)
        return fix

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


def _allocated_layout(meta: dict[str, Any]) -> tuple:
    """(size, stride) a plan buffer is allocated with: its own layout when the plan gives one, else flat."""
    return (tuple(meta["size"]), tuple(meta["stride"])) if "size" in meta else ((meta["numel"],), (1,))


def _allocator(device: torch.device) -> Callable[[tuple, tuple, torch.dtype], torch.Tensor]:
    """`empty(size, stride, dtype)` on `device`: the C allocator Inductor's wrappers use where there is one."""
    fast = _empty_strided_cuda if device.type == "cuda" else _empty_strided_cpu if device.type == "cpu" else None
    if fast is not None:
        return fast
    return lambda size, stride, dtype: torch.empty_strided(size, stride, dtype=dtype, device=device)


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
