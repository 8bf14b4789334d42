"""Bad input is a 4xx that names what is wrong and where; never a 500, never a dead worker."""

import copy
import json

import pytest

from compiler.graph import Limits
from svc_helpers import AUTH, make_graph


def mutate(change):
    graph = make_graph(5)
    change(graph)
    return graph


def set_node(index, **fields):
    return lambda g: g["nodes"][index].update(fields)


CASES = {
    "unknown op": (
        mutate(set_node(1, target="aten.frobnicate.default")),
        422, "graph.nodes[1] 'r'.target", "unknown ATen op 'aten.frobnicate.default'"),
    "not an op name": (
        mutate(set_node(0, target="os.system")), 422, "graph.nodes[0] 's'.target", "is not an op name"),
    "too many args for a known op": (
        mutate(set_node(1, args=[{"ref": "s"}, 1, 2, 3])), 422, "graph.nodes[1] 'r'.args", "at most 1 positional"),
    "unknown kwarg": (
        mutate(set_node(2, kwargs={"bogus": 1})), 422, "graph.nodes[2] 't'.kwargs.bogus", "has no argument 'bogus'"),
    "missing required arg": (
        mutate(set_node(0, args=[])), 422, "graph.nodes[0] 's'.args", "missing required argument"),
    "dangling ref": (
        mutate(set_node(1, args=[{"ref": "nowhere"}])), 422, "graph.nodes[1] 'r'.args[0]", "'nowhere'"),
    "out-of-order ref (a cycle)": (
        mutate(set_node(0, args=[{"ref": "t"}, {"ref": "y"}])), 422, "graph.nodes[0] 's'.args[0]", "earlier node"),
    "duplicate name": (
        mutate(set_node(1, name="s")), 422, "graph.nodes[1] 's'.name", "duplicate name"),
    "bad dtype": (
        mutate(lambda g: g["inputs"][0].update(dtype="float8")), 422, "graph.inputs[0] 'x'.dtype", "unknown dtype"),
    "negative size": (
        mutate(lambda g: g["inputs"][1].update(shape=[5, -8])), 422, "graph.inputs[1] 'y'.shape", ">= 0"),
    "output index on a single-output node": (
        mutate(lambda g: g["outputs"].__setitem__(0, {"ref": "t", "index": 3})), 422, "graph.outputs[0].index", "single output"),
    "wrong version": (
        mutate(lambda g: g.update(version=2)), 422, "graph.version", ""),
    "missing nodes": (
        mutate(lambda g: g.pop("nodes")), 422, "graph.nodes", "required"),
    "too many nodes": (
        mutate(lambda g: g.update(nodes=[
            {"name": f"n{i}", "target": "aten.relu.default", "args": [{"ref": "x"}], "kwargs": {}} for i in range(Limits().max_nodes + 1)],
            outputs=[{"ref": "n0"}])),
        422, "graph.nodes", f"over the limit of {Limits().max_nodes}"),
    "constant bytes that do not match its shape": (
        mutate(lambda g: g.update(constants=[{"name": "c", "dtype": "float32", "shape": [5, 8], "data": "AAAAAA=="}])),
        422, "graph.constants[0] 'c'.data", "holds 4 bytes; shape [5, 8], strides [8, 1] and dtype float32 need 160"),
    "constant over the size limit": (
        mutate(lambda g: g.update(constants=[{"name": "c", "dtype": "uint8", "shape": [5 * 2**20],
                                              "data": "A" * (4 * (5 * 2**20 // 3 + 1))}])),
        422, "graph.constants[0] 'c'.data", "over the limit of 4194304 bytes per constant"),
    "args nested too deep": (
        mutate(set_node(2, args=[{"ref": "r"}, [[[[[[1]]]]]]])), 422, "graph.nodes[2] 't'.args[1]", "nest"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_invalid_graph_is_422_naming_the_problem(api, case):
    graph, status, where, problem = CASES[case]
    response = api.post("/compile", json={"graph": graph, "target": "cpu"}, headers=AUTH)
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] == "invalid_graph"
    assert body["where"].startswith(where), body
    assert problem in body["detail"] and where in body["detail"], body


@pytest.mark.parametrize("raw, where", [
    (b"{not json", "body"),
    (b'{"graph": {"version": 1, "inputs": [}', "body"),
    (b"\xff\xfe\x00garbage", "body"),
])
def test_malformed_json_is_400(api, raw, where):
    response = api.post("/compile", content=raw, headers={**AUTH, "content-type": "application/json"})
    assert response.status_code == 400, response.text
    assert response.json()["error"] == "bad_json" and response.json()["where"] == where


def test_deeply_nested_json_is_4xx(api):
    raw = b'{"graph": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    response = api.post("/compile", content=raw, headers={**AUTH, "content-type": "application/json"})
    assert 400 <= response.status_code < 500, response.text


@pytest.mark.parametrize("body, status, where, text", [
    ({"target": "cpu"}, 422, "graph", "required"),
    ({"graph": [1, 2]}, 422, "graph", "dictionary"),
    ({"graph": "x"}, 422, "graph", "dictionary"),
    ([1, 2, 3], 422, "body", ""),
    ({"graph": make_graph(5), "target": "tpu:v5"}, 422, "target", "unknown target 'tpu:v5'"),
    ({"graph": make_graph(5), "options": {"max_fusion_size": 0}}, 422, "options.max_fusion_size", "greater than or equal"),
    ({"graph": make_graph(5), "options": {"turbo": True}}, 422, "options.turbo", "not permitted"),
    ({"graph": make_graph(5), "options": {"released_inputs": [0, 7]}}, 422, "options.released_inputs",
     "input 7 does not exist"),
    ({"graph": make_graph(5), "options": {"released_inputs": [-1]}}, 422, "options.released_inputs[0]",
     "greater than or equal"),
    ({"graph": make_graph(5), "options": {"released_inputs": ["0"]}}, 422, "options.released_inputs[0]",
     "valid integer"),
])
def test_bad_request_fields_are_422(api, body, status, where, text):
    response = api.post("/compile", json=body, headers=AUTH)
    assert response.status_code == status, response.text
    assert response.json()["where"] == where, response.json()
    assert text in response.json()["detail"]


def test_bad_keys_and_paths_are_4xx(api):
    assert api.get("/jobs/not-a-key", headers=AUTH).status_code == 422
    assert api.get("/artifacts/" + "z" * 64, headers=AUTH).status_code == 422
    assert api.get("/jobs/" + "0" * 64, headers=AUTH).status_code == 404
    assert api.get("/artifacts/" + "0" * 64, headers=AUTH).status_code == 404
    assert api.head("/artifacts/" + "0" * 64, headers=AUTH).status_code == 404
    assert api.get("/nope", headers=AUTH).status_code == 404
    assert api.put("/compile", headers=AUTH).status_code == 405


def test_worker_survives_bad_input(api, celery_worker, store, settings):
    """Bad graphs never reach the worker; it is alive and heartbeating after all of the above."""
    for graph, *_ in list(CASES.values())[:5]:
        api.post("/compile", json={"graph": copy.deepcopy(graph)}, headers=AUTH)
    assert celery_worker.alive()
    names = [w["hostname"] for w in store.live_workers(settings.heartbeat_ttl_s)]
    assert celery_worker.name in names
    assert api.get("/readyz").json()["ready"] is True


def test_error_bodies_are_json_everywhere(api):
    response = api.post("/compile", content=json.dumps({"graph": make_graph(5)}).encode(),
                        headers={"content-type": "application/json"})
    assert response.status_code == 401
    assert set(response.json()) == {"error", "detail", "where"}
