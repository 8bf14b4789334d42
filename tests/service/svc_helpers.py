"""Helpers for the service tests: a REAL redis-server on a free port, a REAL Celery
worker subprocess pointed at it, and the real FastAPI app (in-process, TestClient).

Nothing here fakes Redis or Celery.
"""

from __future__ import annotations

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
    def __init__(self, tmp: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed (scripts/bootstrap.sh installs it)")
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        tmp.mkdir(parents=True, exist_ok=True)
        self.log = tmp / "redis.log"
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(tmp), "--daemonize", "no", "--logfile", str(self.log)],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )
        client = redis.Redis.from_url(self.url)
        wait_for(lambda: _pings(client), 10, "redis-server")
        client.close()

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

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
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
