"""Session fixtures shared by tests/service, tests/client and tests/models: a REAL redis-server
on a free port, the service settings pointing at it, its Store, a REAL Celery worker subprocess,
and the real API as a uvicorn subprocess (the backend speaks HTTP).

They live here, above both folders, so that one redis-server and one worker serve the whole
session (a fixture defined in two sibling conftests would start two of each). Helpers are in
tests/service/svc_helpers.py, imported lazily so that compiler-only runs do not load them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

for _folder in ("service", "client"):  # `import svc_helpers` / `client_helpers`: the modules those tests import
    _path = str(Path(__file__).resolve().parent / _folder)
    if _path not in sys.path:
        sys.path.insert(0, _path)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    from svc_helpers import RedisServer

    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture(scope="session", autouse=True)
def signing_key(tmp_path_factory):
    """The session's worker signing key (its path), trusted by every client of the session through a
    trusted-keys file (FUSEWIRE_TRUSTED_KEYS_FILE, inherited by client subprocesses). Never ~/.config."""
    from compiler.signing import add_trusted_key, generate_key, write_private_key

    folder = tmp_path_factory.mktemp("keys")
    private = generate_key()
    write_private_key(private, folder / "worker.pem")
    add_trusted_key(folder / "trusted_keys", private.public_key(), "the test session's workers")
    old = {name: os.environ.get(name) for name in ("FUSEWIRE_TRUSTED_KEYS_FILE", "FUSEWIRE_TRUSTED_KEYS")}
    os.environ["FUSEWIRE_TRUSTED_KEYS_FILE"] = str(folder / "trusted_keys")
    os.environ.pop("FUSEWIRE_TRUSTED_KEYS", None)
    yield folder / "worker.pem"
    for name, value in old.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def signed(signing_key):
    """artifact -> its bytes, signed with the session's worker key (as a worker would send them)."""
    from compiler.signing import load_private_key, sign_artifact

    private = load_private_key(signing_key)

    def sign(artifact) -> bytes:
        sign_artifact(artifact, private)
        return artifact.to_bytes()
    return sign


@pytest.fixture(scope="session")
def settings(redis_server, signing_key):
    from service.settings import Settings
    from svc_helpers import PREFIX, TOKENS

    return Settings(
        redis_url=redis_server.url, key_prefix=PREFIX, tokens=",".join(f"{t}={team}" for t, team in TOKENS.items()),
        rate_limit_per_minute=100_000, heartbeat_interval_s=0.5, heartbeat_ttl_s=3.0,
        soft_time_limit_s=120, hard_time_limit_s=150, signing_key_file=signing_key,
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


@pytest.fixture(scope="session")
def api_server(settings, celery_worker, tmp_path_factory):
    from client_helpers import ApiServer

    server = ApiServer(settings, tmp_path_factory.mktemp("api") / "api.log")
    yield server
    server.stop()


@pytest.fixture
def compiles(store):
    """How many compiles the workers have started so far (Redis counter the workers keep)."""
    return lambda: int(store.redis.get(store.k("stats", "compiles")) or 0)


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
    dynamo = sys.modules.get("torch._dynamo")  # tests that never compiled have nothing to reset
    if dynamo is not None:
        dynamo.reset()
    yield
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()
