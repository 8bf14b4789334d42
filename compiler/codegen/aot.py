"""Ahead-of-time cubins: compiles generated Triton kernels for a CUDA arch on a machine
that may have no GPU (Triton ships ptxas; it needs no driver to compile).

Builds run in long-lived child processes ("build servers") with Triton's interpreter
switched off, because a process that imported Triton in interpreter mode (CI, CPU workers)
cannot compile. A pool of them builds one batch's kernels in parallel (autotuning
candidates, benchmark-driven fusion's fused kernel and parts) and stays up between
batches, so a worker pays Python and Triton start-up once per server, not once per build.
Plain subprocesses rather than multiprocessing: Celery's prefork children are daemonic and
may not start multiprocessing children.

Pointer arguments are compiled as 16-byte aligned; the runtime copies any argument that
is not (see client/cubin.py).

The server is compiler/codegen/aot_server.py, run as a script so that it imports only Triton.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import queue
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, IO

POINTER_TYPES = {
    "float32": "*fp32", "float16": "*fp16", "bfloat16": "*bf16", "float64": "*fp64", "int64": "*i64",
    "int32": "*i32", "int16": "*i16", "int8": "*i8", "uint8": "*u8", "bool": "*i1",
}
BUILD_PROCESSES_ENV = "FUSEWIRE_BUILD_PROCESSES"  # how many build servers (default: cores, at most 8)
BUILDS_PER_SERVER = 500  # then the server is replaced, so a long-lived worker does not grow
SERVER_SCRIPT = Path(__file__).with_name("aot_server.py")  # run as a script: it imports Triton, not fusewire


class AotError(RuntimeError):
    """Triton could not build a kernel for the target."""


def cuda_arch(target: str) -> int:
    """'cuda:sm_90' -> 90 ('cuda:sm_90a' too: Triton picks the arch-specific features itself)."""
    return int(target.removeprefix("cuda:sm_").rstrip("a"))


# The shared memory one block may use, by arch (CUDA's opt-in limit per block; on an H100 Triton's
# OutOfResources names the same 232448). A cubin that needs more builds, but does not load.
MAX_SHARED_BYTES = {70: 98304, 75: 65536, 80: 166912, 86: 101376, 87: 166912, 89: 101376, 90: 232448}


def shared_bytes(kernel: Any) -> int:
    """The shared memory a built kernel's cubin needs per block."""
    return int(kernel.cubin_metadata["metadata"].get("shared", 0))


def fits_target(kernel: Any, target: str) -> bool:
    """Whether a built kernel's cubin loads on the target (its shared memory; an arch not listed passes)."""
    limit = MAX_SHARED_BYTES.get(cuda_arch(target))
    return limit is None or shared_bytes(kernel) <= limit


def build_cubins(kernels: list[Any], dtypes: dict[str, str], target: str, timeout_s: float = 600) -> None:
    """Fills `cubin` and `cubin_metadata` of every KernelSource in place, building in parallel."""
    if not kernels:
        return
    with tempfile.TemporaryDirectory(prefix="fusewire-aot-") as work:
        # several builds of one kernel (autotuning candidates) share its name: files get an index
        entries = [_job_entry(k, dtypes, Path(work), f"{i}_{k.name}") | {"arch": cuda_arch(target), "out_dir": work}
                   for i, k in enumerate(kernels)]
        build_pool().build_all(entries, time.monotonic() + timeout_s)
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


class BuildServer:
    """One child process that builds kernels on request, with the interpreter off."""

    def __init__(self, triton_cache: str) -> None:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_CACHE_DIR": triton_cache}
        self.log: IO[bytes] = tempfile.TemporaryFile(prefix="fusewire-aot-log-")
        self.process = subprocess.Popen([sys.executable, str(SERVER_SCRIPT)], env=env, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.log)
        self.builds = 0

    def build(self, entry: dict[str, Any], deadline: float) -> None:
        self.builds += 1
        try:
            self.process.stdin.write(json.dumps(entry).encode() + b"\n")
            self.process.stdin.flush()
        except OSError:
            raise AotError(f"the build process exited before building {entry['name']}:\n{self._log_tail()}") from None
        ready, _, _ = select.select([self.process.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise AotError(f"building {entry['name']} took longer than its deadline")
        line = self.process.stdout.readline()
        if not line:
            raise AotError(f"the build process exited while building {entry['name']}:\n{self._log_tail()}")
        reply = json.loads(line)
        if not reply["ok"]:
            raise AotError(f"building {entry['name']} failed:\n{reply['error']}")

    def _log_tail(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-4000:]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout, self.log):
            with contextlib.suppress(OSError):  # unsent bytes to a dead process
                pipe.close()


class BuildPool:
    """Up to `size` build servers, started on demand and kept for later batches."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.triton_cache = tempfile.mkdtemp(prefix="fusewire-triton-")
        self._idle: queue.Queue[BuildServer] = queue.Queue()
        self._started = 0
        self._lock = threading.Lock()
        self._threads = ThreadPoolExecutor(max_workers=size, thread_name_prefix="fusewire-aot")

    def warm(self) -> None:
        """Starts every server now, in the background, so a first compile does not wait for them."""
        for _ in range(self.size):
            self._threads.submit(self._start_idle_server)

    def _start_idle_server(self) -> None:
        with self._lock:
            if self._started >= self.size:
                return
            self._started += 1
        self._idle.put(self._start_server())

    def build_all(self, entries: list[dict[str, Any]], deadline: float) -> None:
        futures = [self._threads.submit(self._build_one, entry, deadline) for entry in entries]
        failures = [f.exception() for f in futures if f.exception() is not None]
        if failures:
            raise failures[0]

    def _build_one(self, entry: dict[str, Any], deadline: float) -> None:
        server = self._take()
        try:
            server.build(entry, deadline)
        except BaseException:
            self._retire(server)  # a timed-out or broken server is not reused
            raise
        if server.builds >= BUILDS_PER_SERVER:
            self._retire(server)
        else:
            self._idle.put(server)

    def _take(self) -> BuildServer:
        while True:
            with self._lock:
                start = self._idle.empty() and self._started < self.size
                self._started += start
            if start:
                return self._start_server()
            try:
                return self._idle.get(timeout=0.1)  # polled: a retired server frees a slot, not the queue
            except queue.Empty:
                continue

    def _start_server(self) -> BuildServer:
        try:
            return BuildServer(self.triton_cache)
        except BaseException:
            with self._lock:
                self._started -= 1
            raise

    def _retire(self, server: BuildServer) -> None:
        server.close()
        with self._lock:
            self._started -= 1

    def close(self) -> None:
        while not self._idle.empty():
            self._idle.get_nowait().close()
        self._threads.shutdown(wait=False)
        shutil.rmtree(self.triton_cache, ignore_errors=True)


_pool: BuildPool | None = None
_pool_lock = threading.Lock()


def build_pool() -> BuildPool:
    """The process's pool, created on first use and closed at exit."""
    global _pool
    with _pool_lock:
        if _pool is None:
            size = int(os.environ.get(BUILD_PROCESSES_ENV) or min(8, os.cpu_count() or 1))
            _pool = BuildPool(max(1, size))
            atexit.register(_pool.close)
        return _pool
