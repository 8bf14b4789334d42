"""The API process stays small: importing service.app pulls in neither torch nor triton."""

import subprocess
import sys

from svc_helpers import ROOT

CHECK = """
import sys
import service.app
import client.http, client.cli
heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton', 'numpy', 'sympy'))
print(heavy)
sys.exit(1 if heavy else 0)
"""


def test_api_imports_neither_torch_nor_triton():
    result = subprocess.run([sys.executable, "-c", CHECK], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"the API process imported: {result.stdout} {result.stderr[-2000:]}"


def test_openapi_documents_the_routes(api):
    spec = api.get("/openapi.json").json()
    paths = spec["paths"]
    for path in ("/compile", "/jobs/{key}", "/artifacts/{key}", "/healthz", "/readyz", "/metrics"):
        assert path in paths, path
    assert "head" in paths["/artifacts/{key}"] and "get" in paths["/artifacts/{key}"]
    compile_responses = paths["/compile"]["post"]["responses"]
    assert {"200", "202", "400", "401", "403", "413", "422", "429"} <= set(compile_responses)
    assert "SubmitResponse" in spec["components"]["schemas"] and "JobStatus" in spec["components"]["schemas"]
    for path, method in (("/compile", "post"), ("/jobs/{key}", "get"), ("/artifacts/{key}", "get")):
        schema = paths[path][method]["responses"]["422"]["content"]["application/json"]["schema"]
        assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (path, schema)
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    graph = spec["components"]["schemas"]["WireGraph"]["properties"]
    assert {"inputs", "nodes", "outputs", "constants"} <= set(graph)
    assert api.get("/docs").status_code == 200
