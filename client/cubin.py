"""Launching an artifact's prebuilt cubins on a GPU without the Triton compiler.

Triton's own `CompiledKernel` loads a cubin plus its metadata (what its on-disk cache
holds) and launches it through Triton's small C launcher; nothing is compiled from
Triton source. `launcher(grid)` binds everything but the stream and the pointers once, and
calls Triton's C launcher directly (what `CompiledKernel[grid](...)` reaches after several
Python layers per launch). Kernels were built assuming 16-byte aligned pointers: the runtime
hands them aligned tensors only.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import torch


def cuda_target(device: int | torch.device | None = None) -> str:
    """The compile target of a CUDA device (the current one by default): 'cuda:sm_XY'."""
    major, minor = torch.cuda.get_device_capability(device)
    return f"cuda:sm_{major}{minor}"


class CubinKernel:
    def __init__(self, entry: dict[str, Any], cubin: bytes) -> None:
        from triton.compiler.compiler import CompiledKernel

        built = entry["cubin_metadata"]
        self._check_device(built["metadata"]["target"]["arch"], entry["name"])
        folder = Path(tempfile.mkdtemp(prefix=f"fusewire-{entry['name']}-"))
        metadata_path = folder / f"{entry['name']}.json"
        cubin_path = folder / f"{entry['name']}.cubin"
        metadata_path.write_text(json.dumps(built["metadata"]))
        cubin_path.write_bytes(cubin)
        # the manifest is stored with sorted keys: take the argument order from arg_names, a list
        signature = {name: built["signature"][name] for name in built["arg_names"]}
        source = SimpleNamespace(signature=signature, constants=built["constants"],
                                 fn=SimpleNamespace(arg_names=built["arg_names"]))
        self.compiled = CompiledKernel(source, {metadata_path.name: str(metadata_path), cubin_path.name: str(cubin_path)},
                                       entry["name"])
        self.constants = [built["constants"][name] for name in built["arg_names"] if name in built["constants"]]

    @staticmethod
    def _check_device(arch: int, name: str) -> None:
        here = cuda_target()
        if here != f"cuda:sm_{arch}":
            raise RuntimeError(f"kernel {name} was built for sm_{arch}, this GPU is {here.removeprefix('cuda:')}")

    def launcher(self, grid: tuple[int, int, int], use_hooks: bool = True) -> Callable[..., None]:
        """`launch(stream, *pointers)` runs the kernel on `grid`, the pointers given as ints (`data_ptr()`:
        given tensors, Triton's launcher asks the driver about each pointer on every launch); through
        Triton's launch hooks when some are installed (a profiler's), unless `use_hooks` is False."""
        from triton.runtime import _allocation

        compiled, constants = self.compiled, self.constants
        direct = self.direct_call(grid, use_hooks)
        if direct is not None:
            c_launch, before, after = direct

            def launch(stream: int, *pointers: int) -> None:
                c_launch(*before[:3], stream, *before[3:], *pointers, *after)
            return launch
        run = compiled.run
        if use_hooks and _hooked():
            def launch_hooked(stream: int, *pointers: int) -> None:  # a profiler hook wants its metadata
                compiled[grid](*pointers, *constants, stream=stream)
            return launch_hooked
        c_launch = run.launch
        x, y, z = grid
        programs = x * y * z * run.num_ctas

        def scratch(size: int | None, align: int, allocator: Any, stream: int) -> Any:
            return allocator.get()(programs * size, align, stream) if size else None

        head = (compiled.function, run.launch_cooperative_grid, run.launch_pdl)
        tail = (compiled.packed_metadata, None, None, None)

        def launch_with_scratch(stream: int, *pointers: int) -> None:
            global_scratch = scratch(run.global_scratch_size, run.global_scratch_align, _allocation._allocator, stream)
            profile_scratch = scratch(run.profile_scratch_size, run.profile_scratch_align,
                                      _allocation._profile_allocator, stream)
            c_launch(x, y, z, stream, *head, global_scratch, profile_scratch, *tail, *pointers, *constants)
        return launch_with_scratch

    def direct_call(self, grid: tuple[int, int, int], use_hooks: bool = True) -> tuple[Callable, tuple, tuple] | None:
        """Triton's C launcher and what it takes around the stream and the pointers, for a launch with
        no scratch memory and no launch hooks: `c_launch(*before[:3], stream, *before[3:], *pointers,
        *after)` runs the kernel on `grid`. None when this kernel or an installed hook needs more."""
        compiled = self.compiled
        compiled._init_handles()
        run = compiled.run  # Triton's CudaLauncher for this kernel
        if (use_hooks and _hooked()) or run.global_scratch_size or run.profile_scratch_size:
            return None
        before = (*grid, compiled.function, run.launch_cooperative_grid, run.launch_pdl, None, None,
                  compiled.packed_metadata, None, None, None)
        return run.launch, before, tuple(self.constants)


def _hooked() -> bool:
    from triton import knobs

    return _active(knobs.runtime.launch_enter_hook) or _active(knobs.runtime.launch_exit_hook)


def _active(hook: Any) -> bool:
    """Whether a Triton launch hook would do anything: Triton 3.6 keeps a HookChain, empty by default."""
    return hook is not None and bool(getattr(hook, "calls", True))
