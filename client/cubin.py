"""Launching an artifact's prebuilt cubins on a GPU without the Triton compiler.

Triton's own `CompiledKernel` loads a cubin plus its metadata (what its on-disk cache
holds) and launches it through Triton's small C launcher; nothing is compiled from
Triton source. Kernels were built assuming 16-byte aligned pointers, so an argument
that is not aligned is copied to an aligned tensor with the same strides (and copied
back if the kernel writes it).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

ALIGNMENT = 16


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
        major, minor = torch.cuda.get_device_capability()
        if major * 10 + minor != arch:
            raise RuntimeError(f"kernel {name} was built for sm_{arch}, this GPU is sm_{major}{minor}")

    def __getitem__(self, grid: tuple[int, int, int]):
        def launch(*pointers: torch.Tensor, **_compile_time: Any) -> None:
            aligned = [_aligned(t) for t in pointers]
            self.compiled[grid](*aligned, *self.constants)
            for original, used in zip(pointers, aligned):
                if used is not original:
                    original.copy_(used)
        return launch


def _aligned(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.data_ptr() % ALIGNMENT == 0:
        return tensor
    copy = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device=tensor.device)
    return copy.copy_(tensor)
