"""Runs an artifact: follows its launch plan, launching kernels and extern ATen calls.

    run = load(artifact)            # an Artifact or its bytes
    outputs = run(*inputs)          # list of tensors

On CPU tensors the kernels run under Triton's interpreter (TRITON_INTERPRET=1 is set
for the kernels this module loads). On a GPU, kernels run from the artifact's cubins
when it carries them for this device, else from source through Triton's JIT.
Extern calls are limited to ATen/prims ops (`ALLOWED_NAMESPACES`).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any, Sequence

import torch

from client import default_cache_dir
from compiler.artifact import Artifact, constant_file

ALLOWED_NAMESPACES = ("aten", "prims")

if not torch.cuda.is_available():
    # Triton picks interpreter or compiler when it is imported: decide before anyone imports it.
    os.environ.setdefault("TRITON_INTERPRET", "1")


class RuntimeError_(RuntimeError):
    """The artifact cannot run with these inputs (or at all); the message says why."""


def load(artifact: Artifact | bytes, cache_dir: Path | None = None) -> "CompiledGraph":
    """`cache_dir` (default: default_cache_dir()) holds the kernel sources that CPU runs import."""
    if isinstance(artifact, (bytes, bytearray)):
        artifact = Artifact.from_bytes(bytes(artifact))
    return CompiledGraph(artifact, cache_dir or default_cache_dir())


class CompiledGraph:
    def __init__(self, artifact: Artifact, cache_dir: Path) -> None:
        self.artifact = artifact
        self.cache_dir = cache_dir
        self.plan = artifact.plan
        self._kernels: dict[str, dict[str, Any]] = {}  # device type -> name -> launcher
        self._constants: dict[torch.device, dict[str, torch.Tensor]] = {}  # device -> buffer -> values
        # buffers kernels read or write: they must have exactly their planned layout and dtype
        self._kernel_read = {name for step in self.plan["steps"] if step["op"] == "kernel" for name in step["args"]}

    def __call__(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        self._check_inputs(inputs)
        device = inputs[0].device if inputs else torch.device("cpu")
        kernels = self._kernels_for(device)
        env: dict[str, torch.Tensor] = {spec["buffer"]: t for spec, t in zip(self.plan["inputs"], inputs)}
        env.update(self._constants_on(device))
        kept: dict[str, torch.Tensor] = {}  # freed buffers a later allocation reuses
        unplanned: dict[str, dict] = {}  # extern results unlike their planned layout (read by no kernel) -> plan
        for step in self.plan["steps"]:
            op = step["op"]
            if op == "alloc" and "reuse" in step:
                env[step["buffer"]] = kept.pop(step["reuse"])
            elif op == "alloc":
                meta = self.plan["buffers"][step["buffer"]]
                env[step["buffer"]] = torch.empty(meta["numel"], dtype=getattr(torch, meta["dtype"]), device=device)
            elif op == "free":
                tensor = env.pop(step["buffer"], None)
                if step.get("keep"):
                    kept[step["buffer"]] = tensor
            elif op == "kernel":
                self._launch(kernels[step["kernel"]], step, env)
            elif op == "extern":
                self._extern(step, env, device, unplanned)
            else:
                raise RuntimeError_(f"unknown plan step {op!r}")
        return [_output(env[o["buffer"]], o, unplanned.get(o["buffer"])) for o in self.plan["outputs"]]

    def _check_inputs(self, inputs: Sequence[torch.Tensor]) -> None:
        specs = self.plan["inputs"]
        if len(inputs) != len(specs):
            raise RuntimeError_(f"expected {len(specs)} inputs, got {len(inputs)}")
        for i, (spec, tensor) in enumerate(zip(specs, inputs)):
            got = (list(tensor.shape), list(tensor.stride()), str(tensor.dtype).removeprefix("torch."))
            want = (spec["size"], spec["stride"], spec["dtype"])
            if got != want and not _equivalent_strides(tensor, spec):
                raise RuntimeError_(f"input {i}: compiled for shape/stride/dtype {want}, got {got}")

    def _constants_on(self, device: torch.device) -> dict[str, torch.Tensor]:
        """The graph's constants on `device`, made once from the artifact's bytes."""
        if device not in self._constants:
            self._constants[device] = {entry["buffer"]: _constant(self.artifact.files[constant_file(entry)], entry, device)
                                       for entry in self.plan.get("constants", [])}
        return self._constants[device]

    def _kernels_for(self, device: torch.device) -> dict[str, Any]:
        if device.type not in self._kernels:
            self._kernels[device.type] = {k["name"]: _load_kernel(self.artifact, k, device, self.cache_dir)
                                          for k in self.artifact.manifest["kernels"]}
        return self._kernels[device.type]

    @staticmethod
    def _launch(kernel: Any, step: dict[str, Any], env: dict[str, torch.Tensor]) -> None:
        config = step["config"]
        args = [env[name] for name in step["args"]]
        grid = tuple(step["grid"])
        kernel[grid](*args, xnumel=step["xnumel"], rnumel=step["rnumel"], XBLOCK=config["XBLOCK"],
                     RBLOCK=config["RBLOCK"], num_warps=config["num_warps"], num_stages=config.get("num_stages", 1))

    def _extern(self, step: dict[str, Any], env: dict[str, torch.Tensor], device: torch.device,
                unplanned: dict[str, dict]) -> None:
        namespace, name, overload = step["target"].split(".")
        if namespace not in ALLOWED_NAMESPACES:
            raise RuntimeError_(f"extern call to {step['target']} is not allowed")
        op = getattr(getattr(getattr(torch.ops, namespace), name), overload)
        args = [_extern_value(a, env, device, unplanned) for a in step["args"]]
        kwargs = {k: _extern_value(v, env, device, unplanned) for k, v in step["kwargs"].items()}
        result = op(*args, **kwargs)
        results = [result] if isinstance(result, torch.Tensor) else list(result) if result is not None else []
        if "positions" in step:
            results = [results[i] for i in step["positions"]]
        for buffer, tensor, layout in zip(step["outputs"], results, step["layouts"]):
            unlike = list(tensor.shape) != layout["size"] or str(tensor.dtype).removeprefix("torch.") != layout["dtype"]
            if unlike and buffer not in self._kernel_read:
                # e.g. the CPU kernel's empty (or bf16) batch-norm statistics where PyTorch's meta kernel
                # says float32 of the channel count: read only by other ATen calls, which agree with it
                env[buffer], unplanned[buffer] = tensor, layout
                continue
            env[buffer] = _as_planned(tensor, layout, step["target"], device)


def _as_planned(tensor: torch.Tensor, layout: dict[str, Any], target: str, device: torch.device) -> torch.Tensor:
    """An extern result in the layout and dtype the plan gives it (PyTorch's meta kernel's), so kernels
    that read it index it as planned. Some CPU kernels disagree with their meta kernel (bf16 batch
    norm statistics come back bf16, not float32): converted. A shape that disagrees is refused, since
    no kernel could read it safely."""
    if list(tensor.shape) != layout["size"]:
        raise RuntimeError_(f"{target} returned a tensor of shape {list(tensor.shape)} where the plan (PyTorch's "
                            f"meta kernel for it) has {layout['size']}")
    dtype = getattr(torch, layout["dtype"])
    if tensor.dtype != dtype or (list(tensor.stride()) != layout["stride"] and tensor.numel() > 1):
        tensor = torch.empty_strided(layout["size"], layout["stride"], dtype=dtype, device=device).copy_(tensor)
    return tensor


def _constant(raw: bytes, entry: dict[str, Any], device: torch.device) -> torch.Tensor:
    dtype = getattr(torch, entry["dtype"])
    flat = torch.frombuffer(bytearray(raw), dtype=dtype) if raw else torch.empty(0, dtype=dtype)
    return flat.to(device)


def _equivalent_strides(tensor: torch.Tensor, spec: dict[str, Any]) -> bool:
    """Strides of size-1 dims never matter."""
    if list(tensor.shape) != spec["size"] or str(tensor.dtype).removeprefix("torch.") != spec["dtype"]:
        return False
    return all(s == 1 or a == b for s, a, b in zip(spec["size"], tensor.stride(), spec["stride"]))


def _view(base: torch.Tensor, layout: dict[str, Any]) -> torch.Tensor:
    return base.as_strided(layout["size"], layout["stride"], base.storage_offset() + layout["offset"])


def _output(base: torch.Tensor, layout: dict[str, Any], planned: dict | None) -> torch.Tensor:
    """A graph output; an extern result unlike its plan is handed over as ATen made it, when it is the
    whole result (a view of it cannot be made safely)."""
    if planned is None:
        return _view(base, layout)
    if [layout["size"], layout["stride"], layout["offset"]] != [planned["size"], planned["stride"], planned["offset"]]:
        raise RuntimeError_(f"an output views an ATen result of shape {list(base.shape)} as {layout['size']}, "
                            "the shape PyTorch's meta kernel gives it")
    return base


def _extern_value(value: Any, env: dict[str, torch.Tensor], device: torch.device, unplanned: dict = {}) -> Any:  # noqa: B006
    if isinstance(value, list):
        return [_extern_value(v, env, device, unplanned) for v in value]
    if isinstance(value, dict):
        if "tensor" in value:
            buffer = value["tensor"]["buffer"]
            return env[buffer] if buffer in unplanned else _view(env[buffer], value["tensor"])
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
