"""Fixtures for the client tests: the real API as a uvicorn subprocess on a free port (the
backend speaks HTTP, so the TestClient the service tests use is not enough), in front of the
REAL redis-server and Celery worker of tests/conftest.py. Nothing is mocked.
"""

from __future__ import annotations

import os

import pytest
import torch

from client_helpers import ApiServer
from svc_helpers import free_port


@pytest.fixture(scope="session")
def api_server(settings, celery_worker, tmp_path_factory):
    server = ApiServer(settings, tmp_path_factory.mktemp("api") / "api.log")
    yield server
    server.stop()


@pytest.fixture(scope="session", autouse=True)
def kernel_dir(tmp_path_factory):
    """The runtime writes kernel sources under FUSEWIRE_CACHE_DIR/kernels: keep them out of ~/.cache."""
    path = tmp_path_factory.mktemp("kernels")
    old = os.environ.get("FUSEWIRE_CACHE_DIR")
    os.environ["FUSEWIRE_CACHE_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("FUSEWIRE_CACHE_DIR", None)
    else:
        os.environ["FUSEWIRE_CACHE_DIR"] = old


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch (and never meets dynamo's recompile limit)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def closed_url() -> str:
    """A URL where nothing listens."""
    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture
def compiles(store):
    """How many compiles the workers have started so far (Redis counter the workers keep)."""
    return lambda: int(store.redis.get(store.k("stats", "compiles")) or 0)
