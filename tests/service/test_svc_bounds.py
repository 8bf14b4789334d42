"""Bounded work at the service: sizes the graph states are refused with a 422 before anything is
queued; sizes known only after shape inference fail the job at once with the reason; a team past
its compile-seconds budget gets 429 for new compiles, never for what is already compiled."""

from __future__ import annotations

from svc_helpers import AUTH, TestClient, make_app, next_graph, wait_job

BETA = {"Authorization": "Bearer tok-beta"}


def _full_graph(n: int) -> dict:
    return {"version": 1, "inputs": [{"name": "x", "dtype": "float32", "shape": [3]}],
            "nodes": [{"name": "f", "target": "aten.full.default", "args": [[n], 2.0],
                       "kwargs": {"dtype": {"dtype": "float32"}}},
                      {"name": "s", "target": "aten.sum.default", "args": [{"ref": "f"}], "kwargs": {}},
                      {"name": "o", "target": "aten.add.Tensor", "args": [{"ref": "x"}, {"ref": "s"}], "kwargs": {}}],
            "outputs": [{"ref": "o"}]}


def test_a_size_written_in_the_graph_over_the_limit_is_422(api):
    response = api.post("/compile", json={"graph": _full_graph(10**13), "target": "cpu"}, headers=AUTH)
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["error"] == "over_limit" and body["where"] == "graph.nodes[0] 'f'.size"
    assert "10,000,000,000,000 elements" in body["detail"]
    assert api.post("/compile", json={"graph": _full_graph(10**6), "target": "cpu"}, headers=AUTH).status_code in (200, 202)


def test_a_size_known_only_after_shape_inference_fails_the_job_with_the_reason(api, celery_worker):
    graph = next_graph()
    graph["nodes"].append({"name": "big", "target": "aten.repeat.default",
                           "args": [{"ref": graph["outputs"][0]["ref"]}, [10**6, 10**6]], "kwargs": {}})
    graph["outputs"] = [{"ref": "big"}]
    response = api.post("/compile", json={"graph": graph, "target": "cpu"}, headers=AUTH)
    assert response.status_code == 202, response.text
    job = wait_job(api, response.json()["key"])
    assert job["state"] == "failed"
    assert "LimitExceeded" in job["error"] and "node 'big'" in job["error"] and "aten.repeat" in job["error"], job["error"]


def test_a_team_past_its_compile_budget_gets_429_for_new_compiles_only(settings, celery_worker):
    budgeted = settings.model_copy(update={"team_compile_budgets": {"beta": 0.001}})
    with TestClient(make_app(budgeted)) as client:
        first = next_graph()
        submitted = client.post("/compile", json={"graph": first, "target": "cpu"}, headers=BETA)
        assert submitted.status_code == 202, submitted.text
        assert wait_job(client, submitted.json()["key"], headers=BETA)["state"] == "ready"
        refused = client.post("/compile", json={"graph": next_graph(), "target": "cpu"}, headers=BETA)
        assert refused.status_code == 429 and refused.json()["error"] == "compile_budget_exhausted"
        assert 1 <= int(refused.headers["retry-after"]) <= 3600
        assert "beta" in refused.json()["detail"]
        # what is compiled is still served, and another team keeps its own budget
        assert client.post("/compile", json={"graph": first, "target": "cpu"}, headers=BETA).status_code == 200
        assert client.post("/compile", json={"graph": next_graph(), "target": "cpu"}, headers=AUTH).status_code == 202
