"""The OpenAPI document describes the API, and schemathesis run against the real service agrees.

- /openapi.json: every error response is an ErrorBody (no FastAPI HTTPValidationError), `graph`
  is the wire format's JSON Schema (compiler.wire_schema) with inputs, nodes, outputs, constants.
- That schema accepts every graph of the corpus and refuses what it can state.
- schemathesis (all phases, all checks, bounded examples, fixed seed) against the real uvicorn
  API, with a real Redis and a real Celery worker: no 5xx, no response off its schema, no
  schema-valid request rejected except for the semantic rules the schema documents
  (tests/service/schemathesis_hooks.py says how that is checked). docs/RELIABILITY.md has the figures.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from compiler.graph import parse_graph
from compiler.wire_schema import SEMANTIC_RULES, graph_json_schema
from svc_helpers import AUTH, ROOT, TOKENS, compiler_problem, make_graph, next_graph, wait_job

jsonschema_rs = pytest.importorskip("jsonschema_rs")  # comes with schemathesis (the dev extra)

HOOKS = Path(__file__).with_name("schemathesis_hooks.py")
MAX_EXAMPLES = int(os.environ.get("FUSEWIRE_FUZZ_EXAMPLES", "75"))  # per operation and phase
SEED = int(os.environ.get("FUSEWIRE_FUZZ_SEED", "1"))
TOKEN = next(iter(TOKENS))
FUZZ_OPS = ["aten.relu.default", "aten.add.Tensor", "aten.mul.Tensor", "aten.neg.default", "aten.sum.default",
            "aten.exp.default", "aten.clone.default", "aten.topk.default", "aten.var_mean.correction"]
FUZZ_NAMES = ["x", "y", "s", "r"]


# -- the document -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def spec(api) -> dict:
    return api.get("/openapi.json").json()


def test_no_fastapi_validation_error_schema_is_left(spec):
    text = json.dumps(spec)
    assert "HTTPValidationError" not in text and '"ValidationError"' not in text


def test_every_error_response_is_an_error_body(spec):
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                if int(status) < 400 or method == "head" or path == "/readyz":  # /readyz: 503 is a Readiness
                    continue
                schema = response["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (method, path, status)
    body = spec["components"]["schemas"]["ErrorBody"]
    assert set(body["required"]) == {"error", "detail", "where"} and body["additionalProperties"] is False


def test_routes_declare_what_they_answer(spec):
    paths = spec["paths"]
    assert {"200", "202", "400", "401", "403", "413", "422", "429", "503"} <= set(paths["/compile"]["post"]["responses"])
    assert {"200", "304", "401", "403", "404", "422", "500", "503"} <= set(paths["/artifacts/{key}"]["get"]["responses"])
    assert {"200", "401", "403", "404", "422", "503"} <= set(paths["/jobs/{key}"]["get"]["responses"])
    assert paths["/compile"]["post"]["responses"]["202"]["headers"]["Location"]["required"] is True
    assert "Retry-After" in paths["/compile"]["post"]["responses"]["429"]["headers"]
    assert paths["/compile"]["post"]["security"] == [{"bearer": []}]
    assert "security" not in paths["/healthz"]["get"]


def test_graph_is_the_wire_format_schema(spec):
    schemas = spec["components"]["schemas"]
    request = schemas["CompileRequest"]["properties"]
    assert request["graph"]["allOf"] == [{"$ref": "#/components/schemas/WireGraph"}]
    graph = schemas["WireGraph"]
    assert {"version", "inputs", "nodes", "outputs", "constants"} <= set(graph["properties"])
    assert graph["additionalProperties"] is False and graph["properties"]["outputs"]["minItems"] == 1
    assert schemas["WireTensorSpec"]["properties"]["dtype"]["enum"][:2] == ["float32", "float16"]
    assert "data" in schemas["WireConstantSpec"]["required"]
    assert all(rule in graph["description"] for rule in SEMANTIC_RULES)
    assert request["options"]["anyOf"][0] == {"$ref": "#/components/schemas/CompileOptions"}
    assert request["target"]["pattern"].startswith("^(cpu|cuda")


def test_a_service_with_a_target_list_documents_it(settings):
    from svc_helpers import make_app

    spec = make_app(settings.model_copy(update={"targets": ["cuda:sm_90"]})).openapi()
    request = spec["components"]["schemas"]["CompileRequest"]
    assert request["properties"]["target"]["enum"] == ["cuda:sm_90"] and "target" in request["required"]
    assert request["properties"]["target"]["examples"] == ["cuda:sm_90"]


# -- the wire schema against parse_graph -----------------------------------------------


@pytest.fixture(scope="module")
def validator():
    return jsonschema_rs.validator_for(graph_json_schema())


def test_every_corpus_graph_is_schema_valid(validator):
    from tests.corpus import GRAPHS_DIR, corpus_names

    for name in corpus_names():
        graph = json.loads((GRAPHS_DIR / f"{name}.json").read_text())
        parse_graph(graph)
        errors = [str(e) for e in validator.iter_errors(graph)]
        assert not errors, (name, errors[:3])


def _mutated(change) -> dict:
    graph = make_graph(5)
    change(graph)
    return graph


SCHEMA_STATES = {  # rules JSON Schema can state: the schema and parse_graph both refuse these
    "bad dtype": lambda g: g["inputs"][0].update(dtype="float8"),
    "negative size": lambda g: g["inputs"][0].update(shape=[5, -8]),
    "rank 9": lambda g: g["inputs"][0].update(shape=[1] * 9),
    "bad name": lambda g: g["inputs"][0].update(name="1x"),
    "name with a newline": lambda g: g["inputs"][0].update(name="x\n"),
    "not an op name": lambda g: g["nodes"][0].update(target="os.system"),
    "no outputs": lambda g: g.update(outputs=[]),
    "version true": lambda g: g.update(version=True),
    "version 2": lambda g: g.update(version=2),
    "unknown field": lambda g: g.update(extra=1),
    "negative index": lambda g: g["outputs"].__setitem__(0, {"ref": "t", "index": -1}),
    "args nested too deep": lambda g: g["nodes"][2].update(args=[{"ref": "r"}, [[[[[1]]]]]]),
    "bad dtype arg": lambda g: g["nodes"][2].update(kwargs={"dtype": {"dtype": "float8"}}),
    "bad device arg": lambda g: g["nodes"][2].update(kwargs={"dtype": {"device": "tpu"}}),
    "bad base64": lambda g: g.update(constants=[{"name": "c", "dtype": "uint8", "shape": [3], "data": "AAAA===="}]),
    "non-canonical base64": lambda g: g.update(constants=[{"name": "c", "dtype": "uint8", "shape": [1], "data": "AB=="}]),
}


@pytest.mark.parametrize("case", list(SCHEMA_STATES))
def test_schema_and_parser_refuse_the_same(validator, case):
    graph = _mutated(SCHEMA_STATES[case])
    assert not validator.is_valid(graph)
    with pytest.raises(ValueError):
        parse_graph(copy.deepcopy(graph))


def test_deepest_allowed_nesting_is_valid_for_both(validator):
    graph = _mutated(lambda g: g["nodes"][2].update(args=[{"ref": "r"}, [[[[[]]]]]]))
    assert validator.is_valid(graph)
    parse_graph(graph)


def test_every_semantic_rule_has_its_details():
    import schemathesis_hooks  # tests/service is on sys.path (tests/conftest.py)

    assert set(schemathesis_hooks.SEMANTIC_DETAILS) == set(SEMANTIC_RULES)
    rejected = {"graph.nodes[1] 'r'.target": "unknown ATen op 'aten.frobnicate.default'",
                "graph.outputs[0]": "ref 'A' names no input or node (dangling ref)"}
    for where, problem in rejected.items():
        assert schemathesis_hooks.semantic_rule({"error": "invalid_graph", "detail": f"{where}: {problem}", "where": where})
    over = "graph.nodes[0] 'f'.size: this tensor has 2,000,000 elements (shape [2000, 1000]), over this service's " \
           "limit of 1,000 per tensor"
    assert schemathesis_hooks.semantic_rule({"error": "over_limit", "detail": over, "where": "graph.nodes[0] 'f'.size"}) \
        == "tensor-size"
    assert schemathesis_hooks.semantic_rule(
        {"error": "invalid_graph", "detail": "graph.version: unsupported", "where": "graph.version"}) is None


# -- schemathesis against the real service ----------------------------------------------


def _seed_artifact(url: str) -> tuple[str, str]:
    """A graph compiled through the API, so that the artifact routes also answer 200 and 304
    (when the compiler works: the run checks the API, so it goes on either way); key and state."""
    response = httpx.post(f"{url}/compile", json={"graph": next_graph(), "target": "cpu"}, headers=AUTH, timeout=30)
    assert response.status_code in (200, 202), response.text
    key = response.json()["key"]
    with httpx.Client(base_url=url, timeout=10) as client:
        return key, wait_job(client, key, timeout=120)["state"]


def _config(key: str, token: str, workdir: Path) -> str:
    """schemathesis.toml for the run: all checks (the CLI says `--checks all`), positive data may
    be refused with a 422 only under the hooks' semantic-rule check, artifact keys sometimes real."""
    return f"""
seed = {SEED}
hooks = "{HOOKS}"
workers = 1
request-timeout = 60

[cache]
enabled = false  # no crash replays from earlier runs: each run stands alone

[generation]
max-examples = {MAX_EXAMPLES}
database = "none"

[checks.positive_data_acceptance]
# the defaults, plus 422: which 422 passes is decided by positive_422_is_a_semantic_rule
expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "422", "429", "5xx"]

[auth.openapi.bearer]
bearer = "{token}"

[dictionaries.keys]
values = ["{key}"]

[dictionaries.etags]
values = ['"{key}"', "*"]

[parameters."path.key"]
dictionary = "keys"
probability = 0.3

[parameters."header.If-None-Match"]
dictionary = "etags"
probability = 0.3

# Random op names and refs almost never resolve; drawing some from these lets more graphs reach
# the deeper rules (signatures, output counts) and the compile path.
[dictionaries.ops]
values = {json.dumps(FUZZ_OPS)}

[dictionaries.names]
values = {json.dumps(FUZZ_NAMES)}

[parameters."body.graph.nodes[*].target"]
dictionary = "ops"
probability = 0.5

[parameters."body.graph.inputs[*].name"]
dictionary = "names"
probability = 0.5

[parameters."body.graph.nodes[*].name"]
dictionary = "names"
probability = 0.5

[parameters."body.graph.outputs[*].ref"]
dictionary = "names"
probability = 0.5

[parameters."body.graph.nodes[*].args[*].ref"]
dictionary = "names"
probability = 0.5

[reports]
directory = "{workdir}"
"""


def _figures(har: dict, report: dict) -> dict:
    statuses = Counter(entry["response"]["status"] for entry in har["log"]["entries"])
    by_class = Counter(f"{status // 100}xx" for status in statuses.elements())
    return {"requests": sum(statuses.values()), "test_cases": report["test_cases"]["generated"],
            "statuses": dict(sorted(statuses.items())), "classes": dict(sorted(by_class.items())),
            "operations": report["operations"]["tested"], "failures": report["failures"],
            "phases": {name: phase["status"] for name, phase in report["phases"].items()}}


def _cpu_jobs(har: dict) -> set[str]:
    """Keys of the compiles for target cpu that the run started (202), which the worker runs."""
    keys = set()
    for entry in har["log"]["entries"]:
        request, response = entry["request"], entry["response"]
        if request["method"] == "POST" and response["status"] == 202:
            if json.loads(request["postData"]["text"]).get("target", "cpu") == "cpu":
                keys.add(json.loads(response["content"]["text"])["key"])
    return keys


def _finish(url: str, keys: set[str]) -> dict[str, int]:
    """Waits for the run's compiles (so the session's one worker is free for the tests after this
    one); their final states."""
    with httpx.Client(base_url=url, timeout=10) as client:
        return dict(Counter(wait_job(client, key, timeout=300)["state"] for key in sorted(keys)))


def test_schemathesis_finds_nothing(api_server, celery_worker, tmp_path):
    key, seed_state = _seed_artifact(api_server.url)
    config = tmp_path / "schemathesis.toml"
    config.write_text(_config(key, TOKEN, tmp_path))
    har, report = tmp_path / "run.har", tmp_path / "run.json"
    command = [sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run",
               f"{api_server.url}/openapi.json", "--checks", "all", "--no-color",
               "--report", "har,json", "--report-har-path", str(har), "--report-json-path", str(report)]
    rules = tmp_path / "rules.txt"
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "TRITON_INTERPRET": "1", "FUSEWIRE_FUZZ_RULES": str(rules)})
    output = result.stdout[-6000:] + result.stderr[-3000:]
    assert har.exists() and report.exists(), output
    log = json.loads(har.read_text())
    figures = _figures(log, json.loads(report.read_text()))
    started = time.monotonic()
    figures["cpu_compiles"] = _finish(api_server.url, _cpu_jobs(log))
    figures["cpu_compiles_wait_s"] = round(time.monotonic() - started, 1)
    figures["seed_artifact"] = seed_state
    figures["positive_422_by_rule"] = dict(Counter(rules.read_text().split()).most_common()) if rules.exists() else {}
    print("schemathesis figures:", json.dumps(figures))
    if os.environ.get("FUSEWIRE_FUZZ_FIGURES"):  # where docs/RELIABILITY.md's figures come from
        Path(os.environ["FUSEWIRE_FUZZ_FIGURES"]).write_text(json.dumps(figures, indent=1) + "\n" + output)
    assert result.returncode == 0, output
    assert not figures["failures"] and figures["operations"] == 7, figures
    assert figures["classes"].get("5xx", 0) == 0, figures
    assert set(figures["phases"].values()) == {"success"}, figures
    # every compile the run started finished and the worker lives; with a working compiler, all ready
    finished = {"ready"} if compiler_problem() is None else {"ready", "failed"}
    assert set(figures["cpu_compiles"]) | {seed_state} <= finished and celery_worker.alive(), figures
