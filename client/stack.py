"""`fusewire up`: the whole local stack — redis-server, a Celery worker, the API — as child
processes of one command, started in order, watched, and stopped in reverse order.

    stack = Stack(StackConfig(port=8000))
    stack.start()          # returns once the API answers and the worker heartbeats
    stack.watch()          # until a child dies (raises StackError) or KeyboardInterrupt
    stack.stop()           # API, then worker (warm shutdown), then redis-server

Each child runs in its own session, so a Ctrl-C in the terminal reaches only this
process, which then stops the children in order; each also gets SIGTERM if this process
dies (Linux PR_SET_PDEATHSIG). Logs go to <state_dir>/logs/.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from service.models import EXAMPLE_GRAPH


class StackError(RuntimeError):
    pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(host: str, port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


@dataclass
class StackConfig:
    host: str = "127.0.0.1"
    port: int = 8000  # 0: a free port
    redis_url: str | None = None  # None: start our own redis-server
    redis_port: int = 0  # 0: a free port
    state_dir: Path = Path(".fusewire")
    targets: list[str] = field(default_factory=lambda: ["cpu"])
    worker_concurrency: int = 1
    api_workers: int = 1
    ready_timeout_s: float = 180.0  # the worker's first start imports torch
    signing_key: Path | None = None  # None: <state_dir>/keys/dev-signing.pem, made on first start
    trust_file: Path | None = None  # where the key's public half is trusted; None: the client's default file
    trust_dev_key: bool = True


@dataclass
class Child:
    name: str
    process: subprocess.Popen
    log: Path


class Stack:
    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.children: list[Child] = []
        self.redis_url = config.redis_url
        self.url = ""
        self.worker_name = f"fusewire-up-{os.getpid()}@{socket.gethostname()}"
        self.logs = Path(config.state_dir) / "logs"
        self.signing_key = Path(config.signing_key or Path(config.state_dir) / "keys" / "dev-signing.pem").resolve()
        self.key_id = ""
        self.trusted_in: Path | None = None

    # -- start -------------------------------------------------------------------

    def start(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        try:
            self._prepare_signing_key()
            if self.redis_url is None:
                self._start_redis()
            env = self._env()
            self._start_worker(env)
            self._start_api(env)
            self._wait_ready()
            (Path(self.config.state_dir) / "example-graph.json").write_text(json.dumps(EXAMPLE_GRAPH, indent=1))
        except BaseException:
            self.stop()
            raise

    def _prepare_signing_key(self) -> None:
        """The worker's signing key (a dev key is made on first start) and, unless told otherwise, its
        public half added to the trusted-keys file that clients on this machine read (docs/TRUST.md)."""
        from compiler.signing import (KeyFileError, add_trusted_key, default_trusted_keys_file, generate_key,
                                      key_id, load_private_key, public_line, write_private_key)

        if not self.signing_key.exists():
            if self.config.signing_key is not None:
                raise StackError(f"signing key {self.signing_key} does not exist (make one: fusewire keygen)")
            private = generate_key()
            write_private_key(private, self.signing_key)
            self.signing_key.with_suffix(".pub").write_text(public_line(private.public_key(), "fusewire up dev key") + "\n")
        try:
            public = load_private_key(self.signing_key).public_key()
        except KeyFileError as exc:
            raise StackError(str(exc)) from None
        self.key_id = key_id(public)
        if self.config.trust_dev_key:
            env_file = os.environ.get("FUSEWIRE_TRUSTED_KEYS_FILE")
            self.trusted_in = Path(self.config.trust_file or env_file or default_trusted_keys_file()).expanduser()
            add_trusted_key(self.trusted_in, public, f"fusewire up signing key {self.signing_key}")

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Child:
        log = self.logs / f"{name}.log"
        with open(log, "ab") as out:
            process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       env=env, start_new_session=True, preexec_fn=_die_with_parent)
        child = Child(name, process, log)
        self.children.append(child)
        return child

    def _start_redis(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise StackError("redis-server not found: install it (apt-get install redis-server) or set REDIS_URL")
        port = self.config.redis_port or free_port()
        if port_in_use("127.0.0.1", port):
            raise StackError(f"port {port} for redis-server is in use; pass --redis-port or set REDIS_URL")
        data = Path(self.config.state_dir).resolve() / "redis"
        data.mkdir(parents=True, exist_ok=True)
        self._spawn("redis", [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
                              "--save", "60 1", "--appendonly", "no", "--daemonize", "no"])
        self.redis_url = f"redis://127.0.0.1:{port}/0"
        import redis

        client = redis.Redis.from_url(self.redis_url, socket_connect_timeout=1)
        self._until(lambda: _pings(client), 20, "redis-server to answer")

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("REDIS_URL", None)
        env["FUSEWIRE_REDIS_URL"] = self.redis_url
        env["FUSEWIRE_SIGNING_KEY_FILE"] = str(self.signing_key)
        return env

    def _start_worker(self, env: dict[str, str]) -> None:
        worker_env = dict(env)
        if self.config.targets == ["cpu"]:
            worker_env.setdefault("TRITON_INTERPRET", "1")  # no GPU work: Triton's interpreter
        queues = ",".join("compile." + t.replace(":", ".") for t in self.config.targets)
        self._spawn("worker", [sys.executable, "-m", "celery", "-A", "worker.app:app", "worker", "-Q", queues,
                               "--pool", "prefork", "--concurrency", str(self.config.worker_concurrency),
                               "-n", self.worker_name, "-l", "info",
                               "--without-gossip", "--without-mingle", "--without-heartbeat"], worker_env)

    def _start_api(self, env: dict[str, str]) -> None:
        port = self.config.port or free_port(self.config.host)
        if port_in_use(self.config.host, port):
            raise StackError(f"port {port} is in use; pass --port (0 picks a free one)")
        argv = [sys.executable, "-m", "client.cli", "serve", "--host", self.config.host, "--port", str(port),
                "--workers", str(self.config.api_workers)]
        self._spawn("api", argv, env)
        host = "127.0.0.1" if self.config.host in ("0.0.0.0", "::") else self.config.host
        self.url = f"http://{host}:{port}"

    def _wait_ready(self) -> None:
        import httpx

        def api_up() -> bool:
            try:
                return httpx.get(self.url + "/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        def worker_up() -> bool:
            try:
                ready = httpx.get(self.url + "/readyz", timeout=2).json()
            except (httpx.HTTPError, ValueError):
                return False
            return any(w["hostname"] == self.worker_name for w in ready.get("workers", []))

        self._until(api_up, 60, "the API to answer /healthz")
        self._until(worker_up, self.config.ready_timeout_s, "the worker's first heartbeat")

    def _until(self, check, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_children()
            if check():
                return
            time.sleep(0.2)
        raise StackError(f"timed out after {timeout:g} s waiting for {what}; logs in {self.logs}")

    # -- watch and stop ------------------------------------------------------------

    def _check_children(self) -> None:
        for child in self.children:
            code = child.process.poll()
            if code is not None:
                tail = child.log.read_text(errors="replace").splitlines()[-15:]
                raise StackError(f"{child.name} exited with code {code}; last lines of {child.log}:\n" + "\n".join(tail))

    def watch(self, interval: float = 0.5) -> None:
        while True:
            self._check_children()
            time.sleep(interval)

    def stop(self, timeout: float = 20.0) -> None:
        """Stops children in reverse start order: SIGTERM, then SIGKILL to the group after `timeout`."""
        for child in reversed(self.children):
            process = child.process
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                try:
                    process.wait(timeout)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
            # the worker's pool children share its session: make sure none outlive it
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.children.clear()


def _pings(client) -> bool:
    import redis

    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
