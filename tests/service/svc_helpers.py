"""Helpers for the service tests: a REAL redis-server on a free port, a REAL Celery
worker subprocess pointed at it, and the real FastAPI app (in-process, TestClient).

Nothing here fakes Redis or Celery.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from functools import lru_cache
from pathlib import Path

import pytest
import redis

from service.settings import Settings
from service.store import Store

with warnings.catch_warnings():  # starlette's note about httpx2; the TestClient works as it is
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient  # noqa: F401  (re-exported for the tests)

# Artifacts run on CPU through Triton's interpreter (as `make test` sets it), before triton loads.
os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "fwtest:"
TOKENS = {"tok-alpha": "alpha", "tok-beta": "beta"}
AUTH = {"Authorization": "Bearer tok-alpha"}


# -- processes ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class RedisServer:
    """A redis-server on a free port, data in `tmp`. With `aof=True` every write is appended and fsynced
    (`--appendonly yes --appendfsync always`), so `kill()` loses nothing and `start()` (same port, same
    folder) brings back everything from the AOF."""

    def __init__(self, tmp: Path, aof: bool = False) -> None:
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            pytest.skip("redis-server is not installed (scripts/bootstrap.sh installs it)")
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        tmp.mkdir(parents=True, exist_ok=True)
        self.dir, self.aof = tmp, aof
        self.log = tmp / "redis.log"
        self.start()

    def start(self) -> None:
        """Starts (again) on the same port and folder; returns once it answers PING (AOF loaded)."""
        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if self.aof else ["--appendonly", "no"]
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", *persistence,
             "--dir", str(self.dir), "--daemonize", "no", "--logfile", str(self.log)],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )
        client = redis.Redis.from_url(self.url)
        wait_for(lambda: _pings(client), 10, "redis-server")
        client.close()

    def kill(self) -> None:
        """SIGKILL: no shutdown, no final save (with `aof=True` every acknowledged write is on disk)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        stop_process(self.process)


def stop_process(process: subprocess.Popen, grace_s: float = 10) -> None:
    """SIGTERM, then SIGKILL if it has not exited after `grace_s`."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _pings(client) -> bool:
    try:
        return client.ping()
    except redis.RedisError:
        return False


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that gives a subprocess these settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSEWIRE_") and k != "REDIS_URL"}
    for name, value in settings.model_dump(exclude_none=True).items():
        env[f"FUSEWIRE_{name.upper()}"] = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    env["TRITON_INTERPRET"] = "1"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


class Worker:
    """A real `celery -A worker.app:app worker` process group (prefork pool, concurrency 1)."""

    def __init__(self, settings: Settings, log: Path, name: str, extra_env: dict[str, str] | None = None) -> None:
        self.name = f"{name}@{socket.gethostname()}"
        self.settings = settings
        self.log = log
        env = settings_env(settings) | (extra_env or {})
        with open(log, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "worker.app:app", "worker", "-Q", "compile.cpu",
                 "--pool", "prefork", "--concurrency", "1", "-n", self.name, "-l", "info",
                 "--without-gossip", "--without-mingle", "--without-heartbeat"],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )

    def wait_ready(self, store: Store, timeout: float = 90) -> "Worker":
        def up():
            assert self.process.poll() is None, f"worker exited ({self.process.returncode}):\n{self.tail()}"
            return any(w["hostname"] == self.name for w in store.live_workers(self.settings.heartbeat_ttl_s))

        wait_for(up, timeout, f"worker {self.name} heartbeat")
        return self

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole worker (main process and its pool children): no goodbye, no ack."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(10)

    def pause(self) -> None:
        """SIGSTOP the whole worker (main process and pool children): alive, silent, holding its task."""
        os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                os.killpg(self.process.pid, signal.SIGCONT)  # a paused worker must run to see its SIGTERM
            except ProcessLookupError:
                pass
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


# -- graphs --------------------------------------------------------------------------

_sizes = itertools.count(3)


def next_graph() -> dict:
    """A graph no other test submits (its shape makes its key)."""
    return make_graph(next(_sizes) * 7 + 1)


def make_graph(rows: int, cols: int = 8) -> dict:
    """add -> relu -> sum(dim=1): small fp32, the shape makes the key."""
    return {
        "version": 1,
        "inputs": [{"name": "x", "dtype": "float32", "shape": [rows, cols]},
                   {"name": "y", "dtype": "float32", "shape": [rows, cols]}],
        "nodes": [
            {"name": "s", "target": "aten.add.Tensor", "args": [{"ref": "x"}, {"ref": "y"}], "kwargs": {}},
            {"name": "r", "target": "aten.relu.default", "args": [{"ref": "s"}], "kwargs": {}},
            {"name": "t", "target": "aten.sum.dim_IntList", "args": [{"ref": "r"}, [1]], "kwargs": {}},
        ],
        "outputs": [{"ref": "t"}, {"ref": "r"}],
    }


def make_app(settings: Settings):
    from service.app import create_app

    return create_app(settings)


def wait_job(client, key: str, timeout: float = 90, states=("ready", "failed"), headers=AUTH) -> dict:
    def done():
        job = client.get(f"/jobs/{key}", headers=headers).json()
        return job if job.get("state") in states else None

    return wait_for(done, timeout, f"job {key[:12]} to reach {states}", interval=0.1)


def store_problems(store: Store, settled: bool = True) -> list[str]:
    """What breaks the store's promises, read straight from Redis (empty when all hold): every bundle
    has its digest and matches it, no digest without its bundle; a ready job has its artifact (and the
    digest it records is the stored one); a failed job says why; with `settled`, no job is still
    queued or running."""
    problems = []
    r, base = store.redis, store.prefix + "artifact:"
    for name in r.scan_iter(match=base + "*", count=1000):
        rest = name.decode()[len(base):]
        if rest.endswith(":digest"):
            if not r.exists(base + rest[:-len(":digest")]):
                problems.append(f"digest without its bundle: {rest}")
            continue
        blob, digest = r.mget(base + rest, base + rest + ":digest")
        if digest is None or hashlib.sha256(blob).hexdigest() != digest.decode():
            problems.append(f"bundle {rest[:12]} without a matching digest ({digest!r})")
    for name in r.scan_iter(match=store.prefix + "job:*", count=1000):
        key = name.decode()[len(store.prefix + "job:"):]
        job = store.job(key) or {}
        state = job.get("state")
        if state == "ready":
            stored = r.get(base + key + ":digest")
            if stored is None:
                problems.append(f"job {key[:12]} ready without an artifact")
            elif job.get("digest") and job["digest"] != stored.decode():
                problems.append(f"job {key[:12]} records digest {job['digest'][:12]}, "
                                f"the stored one is {stored.decode()[:12]}")
        elif state == "failed":
            if not job.get("error"):
                problems.append(f"job {key[:12]} failed without a reason")
        elif settled or state not in ("queued", "running"):
            problems.append(f"job {key[:12]} is {state!r} (stage {job.get('stage')!r})")
    return problems


@lru_cache(maxsize=1)
def compiler_problem() -> str | None:
    """None when the lead's compiler compiles our test graph in-process; else why not."""
    try:
        import compiler
        from compiler.graph import parse_graph

        compiler.compile(parse_graph(make_graph(4)), "cpu")
        import client.runtime  # noqa: F401
    except Exception as exc:  # not there yet, or broken: the tests that need it skip, saying why
        return f"{type(exc).__name__}: {exc}"
    return None
