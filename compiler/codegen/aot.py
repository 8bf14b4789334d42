"""Ahead-of-time cubins: compiles generated Triton kernels for a CUDA arch on a machine
that may have no GPU (Triton ships ptxas; it needs no driver to compile).

The build runs in a child process with Triton's interpreter switched off, because a
process that imported Triton in interpreter mode (CI, CPU workers) cannot compile.
Pointer arguments are compiled as 16-byte aligned; the runtime copies any argument that
is not (see client/cubin.py).

    python -m compiler.codegen.aot job.json out_dir     (what build_cubins runs)
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

POINTER_TYPES = {
    "float32": "*fp32", "float16": "*fp16", "bfloat16": "*bf16", "float64": "*fp64", "int64": "*i64",
    "int32": "*i32", "int16": "*i16", "int8": "*i8", "uint8": "*u8", "bool": "*i1",
}
CONSTEXPRS = ("xnumel", "rnumel", "XBLOCK", "RBLOCK")


class AotError(RuntimeError):
    """Triton could not build a kernel for the target."""


def cuda_arch(target: str) -> int:
    """'cuda:sm_90' -> 90 ('cuda:sm_90a' too: Triton picks the arch-specific features itself)."""
    return int(target.removeprefix("cuda:sm_").rstrip("a"))


def build_cubins(kernels: list[Any], dtypes: dict[str, str], target: str, timeout_s: float = 600) -> None:
    """Fills `cubin` and `cubin_metadata` of every KernelSource in place."""
    if not kernels:
        return
    with tempfile.TemporaryDirectory(prefix="fusewire-aot-") as work:
        # several builds of one kernel (autotuning candidates) share its name: files get an index
        job = {"arch": cuda_arch(target),
               "kernels": [_job_entry(k, dtypes, Path(work), f"{i}_{k.name}") for i, k in enumerate(kernels)]}
        (Path(work) / "job.json").write_text(json.dumps(job))
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["TRITON_CACHE_DIR"] = str(Path(work) / "triton-cache")
        done = subprocess.run([sys.executable, "-m", "compiler.codegen.aot", str(Path(work) / "job.json"), work],
                              env=env, capture_output=True, text=True, timeout=timeout_s,
                              cwd=str(Path(__file__).resolve().parents[2]))
        if done.returncode != 0:
            raise AotError(f"building cubins for {target} failed:\n{done.stderr[-4000:]}")
        for i, kernel in enumerate(kernels):
            kernel.cubin = (Path(work) / f"{i}_{kernel.name}.cubin").read_bytes()
            kernel.cubin_metadata = json.loads((Path(work) / f"{i}_{kernel.name}.json").read_text())


def _job_entry(kernel: Any, dtypes: dict[str, str], work: Path, stem: str) -> dict[str, Any]:
    source = work / f"{stem}_src.py"
    source.write_text(kernel.source)
    signature = {f"ptr_{b}": POINTER_TYPES[dtypes[b]] for b in kernel.arguments}
    constants = {"xnumel": kernel.numel, "rnumel": kernel.rnumel,
                 "XBLOCK": kernel.config["XBLOCK"], "RBLOCK": kernel.config["RBLOCK"]}
    return {"name": kernel.name, "stem": stem, "source": str(source), "signature": signature, "constants": constants,
            "num_warps": kernel.config["num_warps"], "num_stages": kernel.config["num_stages"]}


def _compile_job(job_path: str, out_dir: str) -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    job = json.loads(Path(job_path).read_text())
    target = GPUTarget("cuda", job["arch"], 32)
    for entry in job["kernels"]:
        spec = importlib.util.spec_from_file_location(f"aot_{entry['stem']}", entry["source"])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        fn = getattr(module, entry["name"])
        signature = dict(entry["signature"]) | {name: "constexpr" for name in CONSTEXPRS}
        attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(entry["signature"]))}
        source = ASTSource(fn, signature, constexprs=entry["constants"], attrs=attrs)
        compiled = triton.compile(source, target=target,
                                  options={"num_warps": entry["num_warps"], "num_stages": entry["num_stages"]})
        metadata = compiled.metadata._asdict()
        metadata["target"] = {"backend": target.backend, "arch": target.arch, "warp_size": target.warp_size}
        (Path(out_dir) / f"{entry['stem']}.cubin").write_bytes(compiled.asm["cubin"])
        (Path(out_dir) / f"{entry['stem']}.json").write_text(json.dumps(
            {"metadata": metadata, "signature": signature, "constants": entry["constants"],
             "arg_names": list(fn.arg_names)}, default=str))


if __name__ == "__main__":
    _compile_job(sys.argv[1], sys.argv[2])
