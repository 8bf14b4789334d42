"""Session fixtures shared by tests/service and tests/client: a REAL redis-server on a free
port, the service settings pointing at it, its Store, and a REAL Celery worker subprocess.

They live here, above both folders, so that one redis-server and one worker serve the whole
session (a fixture defined in two sibling conftests would start two of each). Helpers are in
tests/service/svc_helpers.py, imported lazily so that compiler-only runs do not load them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_SERVICE_TESTS = str(Path(__file__).resolve().parent / "service")
if _SERVICE_TESTS not in sys.path:
    sys.path.insert(0, _SERVICE_TESTS)  # `import svc_helpers`, the same module the service tests import


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    from svc_helpers import RedisServer

    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def settings(redis_server):
    from service.settings import Settings
    from svc_helpers import PREFIX, TOKENS

    return Settings(
        redis_url=redis_server.url, key_prefix=PREFIX, tokens=",".join(f"{t}={team}" for t, team in TOKENS.items()),
        rate_limit_per_minute=100_000, heartbeat_interval_s=0.5, heartbeat_ttl_s=3.0,
        soft_time_limit_s=120, hard_time_limit_s=150,
    )


@pytest.fixture(scope="session")
def store(settings):
    from service.store import Store

    return Store.from_settings(settings)


@pytest.fixture(scope="session")
def celery_worker(settings, store, tmp_path_factory):
    from svc_helpers import Worker

    worker = Worker(settings, tmp_path_factory.mktemp("worker") / "worker.log", "main")
    try:
        yield worker.wait_ready(store)
    finally:
        worker.stop()
