"""Fixtures for the service tests: a REAL redis-server on a free port, a REAL Celery
worker subprocess pointed at it, and the real FastAPI app (in-process, TestClient).

Nothing here fakes Redis or Celery. Graph keys are made unique per test (by shape), so
tests share one Redis and one worker without seeing each other's artifacts. The session
fixtures `redis_server`, `settings`, `store` and `celery_worker` are in tests/conftest.py,
shared with the client tests (tests/client/).
"""

from __future__ import annotations

import pytest

from svc_helpers import TestClient, compiler_problem, make_app, next_graph


def pytest_configure(config):
    config.addinivalue_line("filterwarnings", "ignore:Using `httpx` with `starlette.testclient`")


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
