"""Fixtures for the service tests: a REAL redis-server on a free port, a REAL Celery
worker subprocess pointed at it, and the real FastAPI app (in-process, TestClient).

Nothing here fakes Redis or Celery. Graph keys are made unique per test (by shape), so
tests share one Redis and one worker without seeing each other's artifacts.
"""

from __future__ import annotations

import pytest

from service.settings import Settings
from service.store import Store
from svc_helpers import PREFIX, TOKENS, RedisServer, TestClient, Worker, compiler_problem, make_app, next_graph


def pytest_configure(config):
    config.addinivalue_line("filterwarnings", "ignore:Using `httpx` with `starlette.testclient`")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def settings(redis_server) -> Settings:
    return Settings(
        redis_url=redis_server.url, key_prefix=PREFIX, tokens=",".join(f"{t}={team}" for t, team in TOKENS.items()),
        rate_limit_per_minute=100_000, heartbeat_interval_s=0.5, heartbeat_ttl_s=3.0,
        soft_time_limit_s=120, hard_time_limit_s=150,
    )


@pytest.fixture(scope="session")
def store(settings) -> Store:
    return Store.from_settings(settings)


@pytest.fixture(scope="session")
def celery_worker(settings, store, tmp_path_factory):
    worker = Worker(settings, tmp_path_factory.mktemp("worker") / "worker.log", "main")
    try:
        yield worker.wait_ready(store)
    finally:
        worker.stop()


@pytest.fixture(scope="session")
def api(settings):
    """The real app in-process (TestClient runs its lifespan); Redis and Celery are real."""
    with TestClient(make_app(settings)) as client:
        yield client


@pytest.fixture
def graph() -> dict:
    """A graph no other test submits."""
    return next_graph()


@pytest.fixture
def fresh_graph():
    return next_graph


@pytest.fixture
def needs_compiler():
    problem = compiler_problem()
    if problem:
        pytest.skip(f"needs a working compiler.compile and client.runtime: {problem}")
