"""GET/HEAD /artifacts: bytes, ETag, immutable caching, 304, digest checked, never a corrupt read.

Artifacts are put in the store as a worker puts them (Store.put_artifact), so these tests
do not wait on the compiler.
"""

import os

import pytest

from client.http import ArtifactVerificationError, FusewireClient, ServiceError
from compiler.artifact import Artifact, digest_of
from svc_helpers import AUTH, TestClient, make_app
from service.store import CorruptArtifact


def seed(store, signed, payload: bytes = b"") -> tuple[str, bytes]:
    key = os.urandom(32).hex()
    artifact = Artifact(manifest={"format": 1, "key": key, "target": "cpu",
                                  "kernels": [{"name": "triton_fused_add_relu_0", "source": "k0.py"}]},
                        files={"k0.py": b"# kernel\n" + payload})
    blob = signed(artifact)
    assert store.put_artifact(key, blob, digest_of(blob))
    return key, blob


def test_get_and_head(api, store, signed):
    key, blob = seed(store, signed)
    response = api.get(f"/artifacts/{key}", headers=AUTH)
    assert response.status_code == 200 and response.content == blob
    assert response.headers["etag"] == f'"{key}"'
    assert response.headers["cache-control"] == "public, max-age=31536000, immutable"
    assert response.headers["x-fusewire-digest"] == digest_of(blob)
    assert response.headers["content-type"] == "application/zip"
    head = api.head(f"/artifacts/{key}", headers=AUTH)
    assert head.status_code == 200 and int(head.headers["content-length"]) == len(blob) and head.content == b""
    not_modified = api.get(f"/artifacts/{key}", headers={**AUTH, "If-None-Match": f'"{key}"'})
    assert not_modified.status_code == 304 and not_modified.content == b""


def test_artifacts_are_written_once(store, signed):
    key, blob = seed(store, signed)
    other = Artifact(manifest={"format": 1, "key": key, "kernels": []}).to_bytes()
    assert store.put_artifact(key, other, digest_of(other)) is False
    assert store.get_artifact(key) == (blob, digest_of(blob))


def test_a_blob_that_does_not_match_its_digest_is_never_stored(store):
    key = os.urandom(32).hex()
    with pytest.raises(CorruptArtifact):
        store.put_artifact(key, b"some bytes", digest_of(b"other bytes"))
    assert not store.has_artifact(key)


def test_corrupt_stored_bytes_are_never_served(settings, store, signed):
    key, blob = seed(store, signed)
    store.redis.set(store.k("artifact", key), blob[:-10] + b"0123456789")  # bit rot / a bad hand edit
    with TestClient(make_app(settings)) as client:  # a fresh process cache
        response = client.get(f"/artifacts/{key}", headers=AUTH)
    assert response.status_code == 500
    assert response.json()["error"] == "artifact_corrupt"
    assert blob[:20] not in response.content


def test_http_client_verifies_what_it_fetches(api, store, signed):
    key, blob = seed(store, signed)
    client = FusewireClient("http://testserver", token="tok-alpha", http=api)
    assert client.exists(key)
    assert client.fetch_bytes(key) == blob
    assert client.fetch(key).manifest["kernels"][0]["name"] == "triton_fused_add_relu_0"
    assert not client.exists("0" * 64)
    with pytest.raises(ServiceError) as missing:
        client.fetch_bytes("0" * 64)
    assert missing.value.status == 404
    # an artifact stored under another key is refused by the client
    wrong_key, wrong_blob = seed(store, signed)
    forged = os.urandom(32).hex()
    store.put_artifact(forged, wrong_blob, digest_of(wrong_blob))
    with pytest.raises(ArtifactVerificationError):
        client.fetch_bytes(forged)


def test_metrics_count_hits_misses_and_bytes(api, store, signed):
    key, blob = seed(store, signed, os.urandom(1000))
    before = _metric(api, "fusewire_artifact_bytes_served_total")
    api.get(f"/artifacts/{key}", headers=AUTH)
    api.get(f"/artifacts/{'0' * 64}", headers=AUTH)
    text = api.get("/metrics").text
    assert _metric(api, "fusewire_artifact_bytes_served_total") - before == len(blob)
    for name in ("fusewire_http_requests_total", "fusewire_http_request_seconds_bucket", 'fusewire_cache_hits_total{via="fetch"}',
                 'fusewire_cache_misses_total{via="fetch"}', "fusewire_jobs_active", "fusewire_workers_alive",
                 "fusewire_compile_seconds_bucket", "fusewire_queue_depth"):
        assert name in text, name
    assert 'route="/artifacts/{key}"' in text


def _metric(api, name: str) -> float:
    for line in api.get("/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
