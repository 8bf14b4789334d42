"""Fixtures for the client tests. The real stack (redis-server, Celery worker, the API as a
uvicorn subprocess) and the kernel-cache and dynamo-reset fixtures are in tests/conftest.py,
shared with tests/models. Nothing is mocked.
"""

from __future__ import annotations

import pytest

from svc_helpers import free_port


@pytest.fixture
def closed_url() -> str:
    """A URL where nothing listens."""
    return f"http://127.0.0.1:{free_port()}"
