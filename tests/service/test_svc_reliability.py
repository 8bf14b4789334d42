"""Failures: a graph the compiler rejects becomes a failed job (and can be retried); a worker
killed mid-compile loses nothing: the job is redelivered and finished by another worker."""

import os
import signal
import time
from pathlib import Path

import pytest

from svc_helpers import (AUTH, TestClient, RedisServer, Worker, compiler_problem, make_app, make_graph, store_problems,
                         wait_for, wait_job)
from service.store import Store
from worker.tasks import TEST_DELAY_ENV


def unbroadcastable_graph(rows: int) -> dict:
    """Valid wire format (the API cannot know shapes don't broadcast), but no compiler can lower it."""
    graph = make_graph(rows)
    graph["inputs"][1]["shape"] = [rows + 1, 3]
    return graph


def test_compile_error_is_a_failed_job_and_resubmitting_retries(api, celery_worker, store, settings, fresh_graph):
    graph = unbroadcastable_graph(101)
    first = api.post("/compile", json={"graph": graph}, headers=AUTH)
    assert first.status_code == 202, first.text
    key = first.json()["key"]
    job = wait_job(api, key)
    assert job["state"] == "failed", job
    assert "broadcast" in job["error"].lower() and job["attempts"] == 1, job["error"]
    assert celery_worker.alive(), celery_worker.tail()

    again = api.post("/compile", json={"graph": graph}, headers=AUTH)
    assert again.status_code == 202 and again.json()["state"] == "queued"
    job = wait_job(api, key)
    assert job["state"] == "failed" and job["attempts"] == 2
    assert store.job(key)["compiles"] == "2"
    assert celery_worker.alive()
    assert celery_worker.name in [w["hostname"] for w in store.live_workers(settings.heartbeat_ttl_s)]

    # and the worker still compiles good graphs afterwards
    good = api.post("/compile", json={"graph": fresh_graph()}, headers=AUTH).json()["key"]
    expected = ("ready",) if compiler_problem() is None else ("ready", "failed")
    assert wait_job(api, good)["state"] in expected


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


@pytest.mark.timeout(240)
def test_killed_worker_mid_compile_is_redelivered_and_finished_elsewhere(settings, tmp_path):
    """A pool child killed mid-compile is requeued at once (reject_on_worker_lost); a whole worker
    SIGKILLed mid-compile leaves its message unacked, and another worker takes it after the
    visibility timeout. Own Redis and workers: this test needs a short visibility timeout."""
    server = RedisServer(tmp_path / "redis")
    fast = settings.model_copy(update={"redis_url": server.url, "key_prefix": "fwkill:", "visibility_timeout_s": 3.0,
                                       "unacked_restore_interval_s": 1.0})
    store = Store.from_settings(fast)
    slow = Worker(fast, tmp_path / "slow.log", "slow", {TEST_DELAY_ENV: "120"})
    rescuer = None
    try:
        slow.wait_ready(store)
        with TestClient(make_app(fast)) as api:
            key = api.post("/compile", json={"graph": make_graph(203)}, headers=AUTH).json()["key"]
            job = wait_job(api, key, 60, states=("running",))
            assert job["worker"].startswith(slow.name)

            # 1. the pool child dies: the message goes back to the queue, the pool's next child takes it
            child = _children(slow.process.pid)
            assert child, "prefork pool child not found"
            os.kill(child[0], signal.SIGKILL)
            wait_for(lambda: store.job(key)["deliveries"] == "2" and store.job(key)["state"] == "running", 90,
                     "redelivery after the pool child died")

            # 2. the whole worker dies, unannounced: its message stays unacked in Redis
            slow.kill()
            assert store.job(key)["state"] == "running"
            time.sleep(fast.visibility_timeout_s)
            rescuer = Worker(fast, tmp_path / "rescuer.log", "rescuer").wait_ready(store)
            job = wait_job(api, key, 120)
            assert job["worker"].startswith(rescuer.name), job
            assert job["deliveries"] == 3 and job["attempts"] == 1
            assert store.job(key)["compiles"] == "3"
            if compiler_problem() is None:
                assert job["state"] == "ready", job
                assert api.get(f"/artifacts/{key}", headers=AUTH).status_code == 200
                assert store_problems(store) == []  # bundle with its matching digest, nothing half-written
            assert rescuer.alive()
    finally:
        slow.stop()
        if rescuer is not None:
            rescuer.stop()
        server.stop()
