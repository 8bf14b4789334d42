"""Load on the service's hot paths: cache hits, on loopback.

    python bench/service_load.py                      # starts redis-server + `fusewire serve`, 50 clients
    python bench/service_load.py --api-workers 2 --clients 50 --duration 10
    python bench/service_load.py --url http://127.0.0.1:8000 --token T --redis-url redis://...   # a running stack

Two phases, each `--duration` seconds (after a 1 s warm-up) with `--clients` concurrent
keep-alive connections:
  fetch   GET /artifacts/{key} of a ~1 MB artifact (`--artifact-mb`)
  submit  POST /compile of a graph whose artifact is already stored (answered 200 'ready')
and prints requests/s, MB/s and latency percentiles per phase.

The artifacts are put in Redis the way a worker puts them (Store.put_artifact: digest
checked, MSETNX): this measures serving, not compiling, so no Celery worker is needed.
Clients are raw asyncio HTTP/1.1 connections, spread over `--client-procs` processes, so
that the load generator costs as little CPU as possible. Every loop is bounded in time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_graph(rows: int) -> dict:
    return {
        "version": 1,
        "inputs": [{"name": "x", "dtype": "float32", "shape": [rows, 64]}, {"name": "y", "dtype": "float32", "shape": [rows, 64]}],
        "nodes": [
            {"name": "s", "target": "aten.add.Tensor", "args": [{"ref": "x"}, {"ref": "y"}], "kwargs": {}},
            {"name": "r", "target": "aten.relu.default", "args": [{"ref": "s"}], "kwargs": {}},
            {"name": "t", "target": "aten.sum.dim_IntList", "args": [{"ref": "r"}, [1]], "kwargs": {}},
        ],
        "outputs": [{"ref": "t"}],
    }


def seed(redis_url: str, prefix: str, megabytes: float) -> tuple[str, dict, int]:
    """Stores a ~`megabytes` artifact under the key of a bench graph; returns (key, graph, size)."""
    from compiler.artifact import Artifact, digest_of
    from compiler.graph import key as graph_key, parse_graph
    from service.store import Store

    graph = bench_graph(4096 + int(time.time()) % 1000)
    key = graph_key(parse_graph(graph), "cpu")
    payload = os.urandom(int(megabytes * 1024 * 1024))  # incompressible: the ZIP stays this size
    artifact = Artifact(manifest={"format": 1, "key": key, "target": "cpu", "kernels": [
        {"name": "bench_kernel_0", "source": "bench_kernel_0.py"}]},
        files={"bench_kernel_0.py": b"# bench\n", "padding.bin": payload})
    blob = artifact.to_bytes()
    Store.from_url(redis_url, prefix).put_artifact(key, blob, digest_of(blob))
    return key, graph, len(blob)


# -- the load generator -------------------------------------------------------------------


async def _client(host: str, port: int, request: bytes, start: float, warm_end: float, end: float,
                  latencies: list[float], errors: list[str]) -> None:
    reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
    try:
        while time.perf_counter() < start:
            await asyncio.sleep(0.001)
        while (now := time.perf_counter()) < end:
            writer.write(request)
            status = await reader.readline()
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.lower() == b"content-length":
                    length = int(value)
            if length:
                await reader.readexactly(length)
            done = time.perf_counter()
            if not status.startswith(b"HTTP/1.1 200"):
                errors.append(status.decode(errors="replace").strip())
            elif now >= warm_end:
                latencies.append(done - now)
    finally:
        writer.close()


def _client_proc(host, port, request, clients, start, warmup, duration, queue) -> None:
    async def run():
        latencies: list[float] = []
        errors: list[str] = []
        await asyncio.gather(*(_client(host, port, request, start, start + warmup, start + warmup + duration,
                                       latencies, errors) for _ in range(clients)))
        return latencies, errors

    queue.put(asyncio.run(run()))


def load(url: str, request: bytes, clients: int, procs: int, warmup: float, duration: float) -> dict:
    parts = urlsplit(url)
    host, port = parts.hostname, parts.port or 80
    queue = multiprocessing.Queue()
    start = time.perf_counter() + 1.0  # every process connects, then all start together
    shares = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
    workers = [multiprocessing.Process(target=_client_proc, args=(host, port, request, n, start, warmup, duration, queue))
               for n in shares if n]
    for w in workers:
        w.start()
    latencies, errors = [], []
    for _ in workers:
        got_latencies, got_errors = queue.get(timeout=duration + warmup + 60)
        latencies += got_latencies
        errors += got_errors
    for w in workers:
        w.join(10)
    latencies.sort()
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000 if latencies else float("nan")  # noqa: E731
    return {"requests": len(latencies), "errors": len(errors), "first_error": errors[0] if errors else None,
            "req_per_s": len(latencies) / duration, "p50_ms": pick(0.50), "p90_ms": pick(0.90), "p99_ms": pick(0.99),
            "max_ms": latencies[-1] * 1000 if latencies else float("nan"),
            "mean_ms": statistics.fmean(latencies) * 1000 if latencies else float("nan")}


def http_request(method: str, path: str, host: str, token: str | None, body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Accept: */*"]
    if token:
        lines.append(f"Authorization: Bearer {token}")
    if body:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


# -- a stack of its own ---------------------------------------------------------------------


class OwnStack:
    def __init__(self, api_workers: int) -> None:
        self.redis_port, self.api_port = free_port(), free_port()
        self.redis_url = f"redis://127.0.0.1:{self.redis_port}/0"
        self.url = f"http://127.0.0.1:{self.api_port}"
        self.dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"fusewire-bench-{os.getpid()}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.redis = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", str(self.redis_port),
                                       "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(self.dir)],
                                      stdout=subprocess.DEVNULL, start_new_session=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("FUSEWIRE_")}
        env.update(FUSEWIRE_REDIS_URL=self.redis_url, FUSEWIRE_TOKENS="bench-token=bench",
                   FUSEWIRE_RATE_LIMIT_PER_MINUTE="0", PYTHONPATH=str(ROOT))
        self.api = subprocess.Popen([sys.executable, "-m", "client.cli", "serve", "--port", str(self.api_port),
                                     "--workers", str(api_workers), "--log-level", "warning"],
                                    cwd=ROOT, env=env, stdout=open(self.dir / "api.log", "wb"), stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self._wait()

    def _wait(self) -> None:
        import httpx

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise RuntimeError(f"API did not start; see {self.dir / 'api.log'}")

    def stop(self) -> None:
        for process in (self.api, self.redis):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(20)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running API (default: start redis-server + API here)")
    parser.add_argument("--token", default=os.environ.get("FUSEWIRE_TOKEN"))
    parser.add_argument("--redis-url", help="the running stack's Redis, to seed the artifact (with --url)")
    parser.add_argument("--prefix", default="fw:", help="key prefix of the running stack")
    parser.add_argument("--api-workers", type=int, default=1, help="uvicorn processes of the API it starts")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--client-procs", type=int, default=1)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds measured per phase (max 120)")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--artifact-mb", type=float, default=1.0)
    parser.add_argument("--phases", default="fetch,submit")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    duration = min(args.duration, 120.0)

    stack = None
    if args.url is None:
        stack = OwnStack(args.api_workers)
        url, token, redis_url, prefix = stack.url, "bench-token", stack.redis_url, "fw:"
    else:
        if not args.redis_url:
            parser.error("--url needs --redis-url to seed the artifact")
        url, token, redis_url, prefix = args.url.rstrip("/"), args.token, args.redis_url, args.prefix
    try:
        key, graph, size = seed(redis_url, prefix, args.artifact_mb)
        host = urlsplit(url).netloc
        requests = {
            "fetch": http_request("GET", f"/artifacts/{key}", host, token),
            "submit": http_request("POST", "/compile", host, token, json.dumps({"graph": graph, "target": "cpu"}).encode()),
        }
        results = {}
        for phase in args.phases.split(","):
            results[phase] = load(url, requests[phase], args.clients, args.client_procs, args.warmup, duration)
            if phase == "fetch":
                results[phase]["MB_per_s"] = results[phase]["req_per_s"] * size / 1e6
    finally:
        if stack is not None:
            stack.stop()
    header = {"artifact_bytes": size, "clients": args.clients, "client_procs": args.client_procs,
              "api_workers": args.api_workers if stack else None, "duration_s": duration, "cpus": os.cpu_count()}
    if args.json:
        print(json.dumps({**header, "results": results}, indent=1))
        return
    print(" ".join(f"{k}={v}" for k, v in header.items()))
    for phase, r in results.items():
        extra = f"  {r['MB_per_s']:.0f} MB/s" if "MB_per_s" in r else ""
        print(f"{phase:<7} {r['req_per_s']:8.0f} req/s{extra}  p50 {r['p50_ms']:.2f} ms  p90 {r['p90_ms']:.2f} ms  "
              f"p99 {r['p99_ms']:.2f} ms  max {r['max_ms']:.1f} ms  errors {r['errors']}"
              + (f" ({r['first_error']})" if r["first_error"] else ""))


if __name__ == "__main__":
    main()
