"""Submit -> queued -> ready -> fetch -> run; hits; one compile for many submissions."""

from concurrent.futures import ThreadPoolExecutor

from compiler.artifact import Artifact
from compiler.graph import key as graph_key, parse_graph
from svc_helpers import AUTH, wait_job


def test_submit_compile_fetch_and_run(api, celery_worker, store, graph, needs_compiler):
    import torch

    from client import runtime
    from compiler.fx_import import random_inputs, run_eager

    response = api.post("/compile", json={"graph": graph, "target": "cpu"}, headers=AUTH)
    assert response.status_code == 202, response.text
    body = response.json()
    assert body["state"] in ("queued", "running")
    key = body["key"]
    assert key == graph_key(parse_graph(graph), "cpu")  # the client can compute the key itself
    assert response.headers["location"] == f"/jobs/{key}"

    job = wait_job(api, key)
    assert job["state"] == "ready", job
    assert job["stage"] == "done" and job["progress"] == 1.0
    assert job["compile_s"] is not None and job["size"] > 0

    fetched = api.get(f"/artifacts/{key}", headers=AUTH)
    assert fetched.status_code == 200
    assert fetched.headers["etag"] == f'"{key}"'
    assert "immutable" in fetched.headers["cache-control"] and "max-age=31536000" in fetched.headers["cache-control"]
    artifact = Artifact.from_bytes(fetched.content)
    assert artifact.key == key and artifact.digest == job["digest"]
    assert store.redis.exists(store.k("graph", key)) == 0, "the graph is dropped once compiled"

    wire = parse_graph(graph)
    inputs = random_inputs(wire, seed=1)
    got = runtime.load(fetched.content)(*inputs)
    want = run_eager(wire, inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)

    # a hit: 200 at once, no new job, no new compile
    again = api.post("/compile", json={"graph": graph, "target": "cpu"}, headers=AUTH)
    assert again.status_code == 200 and again.json() == {"key": key, "state": "ready"}
    assert store.job(key)["compiles"] == "1" and store.job(key)["attempts"] == "1"


def test_hit_is_answered_without_a_job(api, store, graph):
    """An artifact already in the store (as a worker writes it): 200 ready, no job created."""
    key = graph_key(parse_graph(graph), "cpu")
    blob = Artifact(manifest={"format": 1, "key": key, "target": "cpu", "kernels": []}).to_bytes()
    from compiler.artifact import digest_of

    assert store.put_artifact(key, blob, digest_of(blob))
    response = api.post("/compile", json={"graph": graph, "target": "cpu"}, headers=AUTH)
    assert response.status_code == 200 and response.json() == {"key": key, "state": "ready"}
    assert store.job(key) is None
    assert api.get(f"/jobs/{key}", headers=AUTH).json()["state"] == "ready"


def test_twenty_concurrent_submissions_make_one_compile(api, celery_worker, store, graph):
    def submit(_):
        return api.post("/compile", json={"graph": graph, "target": "cpu"}, headers=AUTH)

    with ThreadPoolExecutor(20) as pool:
        responses = list(pool.map(submit, range(20)))
    assert all(r.status_code in (200, 202) for r in responses), [r.text for r in responses]
    keys = {r.json()["key"] for r in responses}
    assert len(keys) == 1
    key = keys.pop()
    job = wait_job(api, key)
    # one job, one compile: whether the compiler succeeded or not, it ran exactly once
    record = store.job(key)
    assert record["attempts"] == "1", record
    assert record["compiles"] == "1", record
    assert job["deliveries"] == 1


def test_options_and_target_are_part_of_the_key(api, graph):
    base = api.post("/compile", json={"graph": graph}, headers=AUTH).json()["key"]
    other = api.post("/compile", json={"graph": graph, "options": {"fusion": False}}, headers=AUTH).json()["key"]
    sm90 = api.post("/compile", json={"graph": graph, "target": "cuda:sm_90"}, headers=AUTH).json()["key"]
    released = api.post("/compile", json={"graph": graph, "options": {"released_inputs": [0]}}, headers=AUTH).json()
    assert len({base, other, sm90, released["key"]}) == 4, released
    assert released["key"] == graph_key(parse_graph(graph), "cpu", {"released_inputs": [0]})
