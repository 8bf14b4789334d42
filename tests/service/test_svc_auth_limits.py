"""Bearer tokens, open mode, per-team rate limits (429 + Retry-After), body size (413)."""

import json

import pytest

from svc_helpers import AUTH, TestClient, make_app, make_graph


def test_missing_token_is_401(api):
    response = api.post("/compile", json={"graph": make_graph(5)})
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json()["error"] == "unauthenticated"
    assert api.get("/jobs/" + "0" * 64).status_code == 401
    assert api.get("/artifacts/" + "0" * 64).status_code == 401
    assert api.post("/compile", json={}, headers={"Authorization": "Basic abc"}).status_code == 401


def test_unknown_token_is_403(api):
    response = api.post("/compile", json={"graph": make_graph(5)}, headers={"Authorization": "Bearer nope"})
    assert response.status_code == 403
    assert response.json()["error"] == "forbidden"


def test_health_endpoints_need_no_token(api, celery_worker):
    assert api.get("/healthz").json()["status"] == "ok"
    ready = api.get("/readyz").json()
    assert ready["ready"] and ready["redis"] and ready["auth"] == "tokens"
    assert api.get("/metrics").status_code == 200


def test_tokens_file(settings, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("# team tokens\ntok-file = gamma\n")
    app = make_app(settings.model_copy(update={"tokens": "", "tokens_file": tokens}))
    with TestClient(app) as client:
        assert client.get("/jobs/" + "0" * 64, headers={"Authorization": "Bearer tok-file"}).status_code == 404
        assert client.get("/jobs/" + "0" * 64, headers=AUTH).status_code == 403


def test_open_mode_accepts_anyone(settings, caplog):
    with caplog.at_level("WARNING"):
        app = make_app(settings.model_copy(update={"tokens": ""}))
    assert "AUTH IS OFF" in caplog.text
    with TestClient(app) as client:
        assert client.get("/jobs/" + "0" * 64).status_code == 404
        assert client.get("/readyz").json()["auth"] == "open"


def test_rate_limit_is_per_team_with_retry_after(settings, fresh_graph):
    app = make_app(settings.model_copy(update={"rate_limit_per_minute": 3, "team_rate_limits": {"beta": 1},
                                               "key_prefix": settings.key_prefix + "rl:"}))
    with TestClient(app) as client:
        statuses = [client.post("/compile", json={"graph": fresh_graph(), "target": "cuda:sm_80"}, headers=AUTH).status_code
                    for _ in range(4)]
        assert statuses[:3] == [202, 202, 202] and statuses[3] == 429
        limited = client.post("/compile", json={"graph": fresh_graph()}, headers=AUTH)
        assert limited.status_code == 429
        assert 1 <= int(limited.headers["retry-after"]) <= 60
        assert "alpha" in limited.json()["detail"] and "3 submissions per minute" in limited.json()["detail"]
        beta = {"Authorization": "Bearer tok-beta"}  # another team has its own counter (and limit)
        assert client.post("/compile", json={"graph": fresh_graph(), "target": "cuda:sm_80"}, headers=beta).status_code == 202
        assert client.post("/compile", json={"graph": fresh_graph(), "target": "cuda:sm_80"}, headers=beta).status_code == 429
        # reads are not rate limited
        assert client.get("/jobs/" + "0" * 64, headers=AUTH).status_code == 404


def test_request_over_size_limit_is_413(settings):
    app = make_app(settings.model_copy(update={"max_request_bytes": 64 * 1024}))
    big = make_graph(5)
    big["nodes"] += [{"name": f"pad{i}", "target": "aten.relu.default", "args": [{"ref": "x"}], "kwargs": {}}
                     for i in range(2000)]
    body = json.dumps({"graph": big}).encode()
    assert len(body) > 64 * 1024
    with TestClient(app) as client:
        response = client.post("/compile", content=body, headers={**AUTH, "content-type": "application/json"})
        assert response.status_code == 413
        assert "65536 bytes" in response.json()["detail"]

        def chunks():  # no Content-Length: counted as it streams
            for i in range(0, len(body), 8192):
                yield body[i:i + 8192]

        streamed = client.post("/compile", content=chunks(), headers={**AUTH, "content-type": "application/json"})
        assert streamed.status_code == 413, streamed.text
        small = client.post("/compile", json={"graph": make_graph(5), "target": "cuda:sm_80"}, headers=AUTH)
        assert small.status_code in (200, 202)


@pytest.mark.parametrize("target", ["cuda:sm_90"])
def test_targets_can_be_restricted(settings, target):
    app = make_app(settings.model_copy(update={"targets": ["cpu"]}))
    with TestClient(app) as client:
        response = client.post("/compile", json={"graph": make_graph(5), "target": target}, headers=AUTH)
        assert response.status_code == 422 and response.json()["where"] == "target"
