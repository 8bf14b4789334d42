"""The cubin build server that compiler/codegen/aot.py's pool runs, one per child process:
one JSON kernel entry per line on stdin, one JSON reply per line on stdout. Run as a script
(`python aot_server.py`), so it imports Triton and the standard library only, not fusewire:
a server starts in well under a second.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

def compile_kernel(entry: dict[str, Any]) -> tuple[Any, Any, dict[str, str]]:
    """Triton's compiled kernel for one entry (its source file, name, signature, constants, arch,
    warps and stages), with the jitted function and the full signature it was compiled with."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    spec = importlib.util.spec_from_file_location(f"aot_{entry['stem']}", entry["source"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, entry["name"])
    signature = dict(entry["signature"]) | {name: "constexpr" for name in entry["constants"]}
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(entry["signature"]))}
    source = ASTSource(fn, signature, constexprs=entry["constants"], attrs=attrs)
    compiled = triton.compile(source, target=GPUTarget("cuda", entry["arch"], 32),
                              options={"num_warps": entry["num_warps"], "num_stages": entry["num_stages"]})
    return compiled, fn, signature


def _compile_entry(entry: dict[str, Any]) -> None:
    compiled, fn, signature = compile_kernel(entry)
    metadata = compiled.metadata._asdict()
    metadata["target"] = {"backend": "cuda", "arch": entry["arch"], "warp_size": 32}
    out = Path(entry["out_dir"])
    (out / f"{entry['stem']}.cubin").write_bytes(compiled.asm["cubin"])
    (out / f"{entry['stem']}.json").write_text(json.dumps(
        {"metadata": metadata, "signature": signature, "constants": entry["constants"],
         "arg_names": list(fn.arg_names)}, default=str))


def serve() -> None:
    """The build server's loop: one JSON entry per line in, one JSON reply per line out."""
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever Triton or ptxas prints must not corrupt the replies
    import triton.compiler  # noqa: F401  at start-up, before the first request waits for it
    while line := sys.stdin.readline():
        try:
            _compile_entry(json.loads(line))
            reply: dict[str, Any] = {"ok": True}
        except Exception:  # reported to the parent, which raises AotError naming the kernel
            reply = {"ok": False, "error": traceback.format_exc()[-4000:]}
        replies.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    serve()
