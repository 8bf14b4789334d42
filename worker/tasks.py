"""The compile task: graph from Redis -> `compiler.compile` -> artifact into Redis.

Small and idempotent: a delivery first asks the store what to do (`Store.begin`), so a
redelivered or duplicated message finds the artifact already stored, a superseded
attempt, or a graph that killed workers too often, and stops there.

Failures split in two:
- the graph fails to compile (any exception from the compiler, a soft time limit):
  recorded on the job as `failed` with its error, never retried, never fatal to the worker;
- infrastructure (Redis connection errors): retried by Celery, a bounded number of times.
A worker that dies mid-compile (SIGKILL, OOM) leaves its message unacknowledged; Redis
redelivers it after the visibility timeout (or at once, to a live pool, for a lost child).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import traceback

from celery import Task
from celery.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from service.settings import get_settings
from service.store import Store
from worker.app import app
from worker.config import TASK_NAME

log = logging.getLogger("fusewire.worker")

INFRA_ERRORS = (RedisConnectionError, RedisTimeoutError)
# TEST HOOK ONLY: seconds the task sleeps (reporting stage 'test-delay') before compiling,
# so that tests can kill a worker while a compile is running. Never set it in production.
TEST_DELAY_ENV = "FUSEWIRE_TEST_COMPILE_DELAY_S"
MAX_ERROR_CHARS = 4000

_store: Store | None = None


def store() -> Store:
    global _store
    if _store is None:
        _store = Store.from_settings(get_settings())
    return _store


def worker_name(nodename: str | None) -> str:
    """The Celery node name (as in /readyz) and the pid of the process running the compile."""
    return f"{nodename or socket.gethostname()} pid {os.getpid()}"


class CompileTask(Task):
    """Records a job failed when Celery gives up on it (hard time limit, retries exhausted)."""

    def on_failure(self, exc, task_id, args, kwargs, einfo):
        key = args[0] if args else kwargs.get("key")
        if key is None:
            return
        if isinstance(exc, TimeLimitExceeded):
            error = f"compile exceeded the hard time limit of {get_settings().hard_time_limit_s:g} s; its process was killed"
        else:
            error = f"the worker gave up on this job: {describe(exc)}"
        try:
            store().finish(key, "failed", get_settings().job_ttl_s, error=error)
        except INFRA_ERRORS:
            log.exception("could not record job %s as failed; a new submission will retry it once it is stale", key)


@app.task(
    name=TASK_NAME,
    base=CompileTask,
    autoretry_for=INFRA_ERRORS,
    max_retries=get_settings().infra_retries,
    retry_backoff=True,
    retry_backoff_max=30,
    retry_jitter=True,
    bind=True,
)
def compile_graph(self, key: str, attempt: int = 0) -> str:
    """Compiles the graph stored for `key`; returns what happened ('ready', 'failed', or why it skipped)."""
    settings = get_settings()
    db = store()
    begin = db.begin(key, attempt, worker_name(self.request.hostname), settings.max_deliveries)
    if begin.action != "run":
        log.info("job %s: %s, nothing to do", key[:12], begin.action)
        return begin.action
    log.info("job %s: compiling for %s (delivery %d)", key[:12], begin.target, begin.delivery)
    started = time.monotonic()
    try:
        _test_delay(db, key)
        blob, digest = _compile(key, begin.graph, begin.target, begin.options, lambda s, f: _report(db, key, s, f))
    except INFRA_ERRORS:
        raise  # Celery retries it (autoretry_for); the job stays 'running' meanwhile
    except SoftTimeLimitExceeded:
        error = f"compile exceeded the soft time limit of {settings.soft_time_limit_s:g} s"
        _finish(db, key, "failed", started, error=error)
        return "failed"
    except Exception as exc:  # the graph failed to compile: record it, keep the worker alive
        log.warning("job %s failed: %s", key[:12], describe(exc))
        _finish(db, key, "failed", started, error=describe(exc))
        return "failed"
    stored, size = db.put_artifact(key, blob, digest), len(blob)
    if not stored:  # another delivery of this job stored its bundle first: that one stands, so the job describes it
        digest, size = db.artifact_digest(key) or digest, db.artifact_size(key)
    _finish(db, key, "ready", started, digest=digest, size=size)
    log.info("job %s ready: %d bytes%s", key[:12], len(blob),
             "" if stored else " (already stored by another delivery: kept)")
    return "ready"


def _finish(db: Store, key: str, state: str, started: float, **fields) -> None:
    """Charges the compile's seconds to its team's budget (best effort; before the outcome shows, so a
    client that sees it finished sees the budget spent), then records the outcome."""
    seconds = time.monotonic() - started
    try:
        db.charge_compile_seconds(key, seconds)
    except INFRA_ERRORS:
        log.warning("job %s: could not charge %.1f compile seconds to its team", key[:12], seconds)
    db.finish(key, state, get_settings().job_ttl_s, seconds, **fields)


def _compile(key: str, graph_json: str, target: str, options_json: str, progress) -> tuple[bytes, str]:
    """Runs the compiler and checks its artifact before anything is stored."""
    import compiler
    from compiler.artifact import Artifact, digest_of
    from compiler.graph import parse_graph
    from compiler.signing import sign_artifact
    from compiler.version import check_toolchain

    check_toolchain()
    signing_key = _signing_key()
    graph = parse_graph(graph_json)  # stored graphs were validated, but a worker trusts nothing
    options = json.loads(options_json) if options_json else None
    artifact = compiler.compile(graph, target, options, progress=progress, tuning_cache=StoreTuningCache(store()),
                                limits=get_settings().work_limits())
    sign_artifact(artifact, signing_key)
    blob = artifact.to_bytes()
    digest = digest_of(blob)
    manifest = Artifact.from_bytes(blob).manifest  # round-trips: well-formed, nothing missing
    if manifest.get("key") != key:
        raise RuntimeError(f"compiler produced an artifact keyed {manifest.get('key')!r}, the service expects {key}")
    return blob, digest


_key_cache: dict = {}


def _signing_key():
    """The worker's Ed25519 key (FUSEWIRE_SIGNING_KEY_FILE), read once per process. Without one a
    compile fails at once: clients refuse unsigned artifacts, so building one would waste the work."""
    from compiler.signing import load_private_key

    path = get_settings().signing_key_file
    if path is None:
        raise RuntimeError("this worker has no signing key: set FUSEWIRE_SIGNING_KEY_FILE to an Ed25519 key "
                           "(`fusewire keygen`, docs/TRUST.md); clients refuse unsigned artifacts")
    if path not in _key_cache:
        _key_cache[path] = load_private_key(path)
    return _key_cache[path]


class StoreTuningCache:
    """compiler.autotune's cache, shared through Redis by every worker: a kernel is tuned once."""

    def __init__(self, db: Store) -> None:
        self.db = db

    def get(self, key: str) -> dict | None:
        return self.db.get_tuning(key)

    def put(self, key: str, value: dict) -> None:
        self.db.put_tuning(key, value)


def _report(db: Store, key: str, stage: str, fraction: float) -> None:
    """Progress is best effort: a Redis hiccup here must not fail the compile."""
    try:
        db.progress(key, stage, fraction)
    except INFRA_ERRORS:
        log.warning("job %s: could not record progress %s %.2f", key[:12], stage, fraction)


def _test_delay(db: Store, key: str) -> None:
    delay = float(os.environ.get(TEST_DELAY_ENV) or 0)
    if delay <= 0:
        return
    log.warning("%s=%s: sleeping before the compile (test hook)", TEST_DELAY_ENV, delay)
    end = time.monotonic() + delay
    while (left := end - time.monotonic()) > 0:
        _report(db, key, "test-delay", 1 - left / delay)
        time.sleep(min(0.2, left))


def describe(exc: BaseException) -> str:
    """'ValueError: message (at compiler/lowering.py:120 in lower_node)', bounded in length."""
    text = f"{type(exc).__name__}: {exc}"
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        last = frames[-1]
        where = last.filename
        for root in ("compiler", "worker", "site-packages"):
            if f"/{root}/" in where:
                where = f"{root}/{where.split(f'/{root}/', 1)[1]}"
                break
        text += f" (at {where}:{last.lineno} in {last.name})"
    return text[:MAX_ERROR_CHARS]
