"""The web dashboard (/ui): auth like the API's (bearer header or the login form's cookie; open
mode with a banner), a compiled job's page with its kernels, fusion decisions and graph picture,
a failed job's error, the overview, and the whole thing in a real headless Chromium.

Real Redis, a real Celery worker, the real app (TestClient) and, for the browser test, the API
as a uvicorn subprocess; graphs are corpus graphs with options that give them keys of their own.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import xml.etree.ElementTree as ET
from html import unescape
from pathlib import Path

import httpx
import pytest

from compiler.artifact import Artifact
from svc_helpers import AUTH, ROOT, TestClient, compiler_problem, make_app, make_graph, wait_job

HTML = {"Accept": "text/html"}
SVG_NS = "{http://www.w3.org/2000/svg}"
SCREENSHOTS_ENV = "FUSEWIRE_DASHBOARD_SCREENSHOTS"  # a folder: the browser test saves its screenshots there


def corpus(name: str) -> dict:
    return json.loads((ROOT / "tests" / "graphs" / f"{name}.json").read_text())


def compile_job(client, graph: dict, budget: float, headers=AUTH) -> str:
    """Submits `graph` with an autotuning budget no other test uses (a key of its own; a CPU compile
    does not tune), waits until it is ready, returns its key."""
    response = client.post("/compile", json={"graph": graph, "options": {"autotune_budget_s": budget}}, headers=headers)
    assert response.status_code == 202, response.text
    key = response.json()["key"]
    job = wait_job(client, key, headers=headers)
    assert job["state"] == "ready", job
    return key


def transformer_block() -> dict:
    """A GPT-style block (layer norms, attention, MLP, residuals) captured with make_fx: the kind of
    graph a model author sends, with kernels, ATen calls and views to draw."""
    import torch
    import torch.nn.functional as F
    from torch.fx.experimental.proxy_tensor import make_fx

    from compiler.fx_import import from_fx

    def block(x, ln1_w, ln1_b, w_qkv, w_proj, ln2_w, ln2_b, w_fc, b_fc, w_out):
        b, t, d = x.shape
        q, k, v = (F.layer_norm(x, (d,), ln1_w, ln1_b) @ w_qkv).split(d, dim=-1)
        q, k, v = (z.view(b, t, 2, d // 2).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (d // 2) ** -0.5
        att = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        x = x + (att @ v).transpose(1, 2).reshape(b, t, d) @ w_proj
        return x + F.gelu(F.layer_norm(x, (d,), ln2_w, ln2_b) @ w_fc + b_fc, approximate="tanh") @ w_out

    d = 16
    shapes = [(2, 8, d), (d,), (d,), (d, 3 * d), (d, d), (d,), (d,), (d, 4 * d), (4 * d,), (4 * d, d)]
    examples = [torch.randn(shape) for shape in shapes]
    return json.loads(from_fx(make_fx(block)(*examples), examples).model_dump_json())


def graph_svg(html: str) -> ET.Element:
    found = re.search(r'<svg xmlns="http://www.w3.org/2000/svg" class="graph".*?</svg>', html, re.S)
    assert found, "no graph picture on the page"
    return ET.fromstring(found.group(0))  # well-formed XML, or this raises


def kernel_fills(svg: ET.Element) -> dict[str, set[str]]:
    fills: dict[str, set[str]] = {}
    for rect in svg.iter(f"{SVG_NS}rect"):
        if rect.get("data-kernel"):
            fills.setdefault(rect.get("data-kernel"), set()).add(rect.get("fill"))
    return fills


@pytest.fixture
def browser_client(settings):
    """A client of its own: its cookies are not the session client's."""
    with TestClient(make_app(settings)) as client:
        yield client


@pytest.fixture(scope="module")
def ready_key(api, celery_worker) -> str:
    """A job compiled through the real stack once for this module's content tests."""
    if compiler_problem():
        pytest.skip(f"needs a working compiler: {compiler_problem()}")
    return compile_job(api, corpus("mlp_backward_fp32"), 9.101)


# -- auth -------------------------------------------------------------------------


def test_pages_without_a_token_send_browsers_to_the_login_page_and_others_get_401(api):
    page = api.get("/ui", headers=HTML, follow_redirects=False)
    assert page.status_code == 303 and page.headers["location"] == "/ui/login?next=/ui"
    again = api.get("/ui?refresh=15", headers=HTML, follow_redirects=False)
    assert again.headers["location"] == "/ui/login?next=/ui%3Frefresh%3D15"
    job = api.get(f"/ui/jobs/{'a' * 64}", headers=HTML, follow_redirects=False)
    assert job.headers["location"] == f"/ui/login?next=/ui/jobs/{'a' * 64}"
    script = api.get("/ui")
    assert script.status_code == 401 and script.json()["error"] == "unauthenticated"
    assert api.get("/ui", headers={"Authorization": "Bearer nope"}).status_code == 403
    stale = api.get("/ui", headers=HTML | {"Cookie": "fusewire_ui=nope"}, follow_redirects=False)
    assert stale.status_code == 303 and "expired=1" in stale.headers["location"]
    assert api.get("/ui", headers=AUTH).status_code == 200
    login = api.get("/ui/login", headers=HTML)
    assert login.status_code == 200 and 'name="token"' in login.text
    assert api.get("/ui/static/dashboard.css").headers["content-type"].startswith("text/css")


def test_the_login_form_sets_a_strict_http_only_cookie_for_the_dashboard_only(browser_client):
    wrong = browser_client.post("/ui/login", data={"token": "tok-nope", "next": "/ui"}, follow_redirects=False)
    assert wrong.status_code == 403 and "Unknown token" in wrong.text and "set-cookie" not in wrong.headers

    ok = browser_client.post("/ui/login", data={"token": "tok-beta", "next": "/ui?refresh=15"}, follow_redirects=False)
    assert ok.status_code == 303 and ok.headers["location"] == "/ui?refresh=15"
    cookie = ok.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui" in cookie, cookie
    page = browser_client.get("/ui", headers=HTML)
    assert page.status_code == 200 and "team <b>beta</b>" in page.text and "Log out" in page.text
    assert "Auth is off" not in page.text

    out = browser_client.post("/ui/logout", follow_redirects=False)
    assert out.status_code == 303 and 'fusewire_ui=""' in out.headers["set-cookie"]
    browser_client.cookies.clear()
    assert browser_client.get("/ui", headers=HTML, follow_redirects=False).status_code == 303


def test_login_refuses_other_sites_and_never_redirects_off_site(browser_client):
    forged = browser_client.post("/ui/login", data={"token": "tok-alpha"}, headers={"Origin": "https://evil.example"},
                                 follow_redirects=False)
    assert forged.status_code == 403 and "set-cookie" not in forged.headers
    for target in ("//evil.example/ui", "https://evil.example/ui", "/docs"):
        response = browser_client.post("/ui/login", data={"token": "tok-alpha", "next": target}, follow_redirects=False)
        assert response.status_code == 303 and response.headers["location"] == "/ui", target


def test_open_mode_serves_every_page_with_a_banner(settings):
    with TestClient(make_app(settings.model_copy(update={"tokens": ""}))) as client:
        page = client.get("/ui", headers=HTML)
        assert page.status_code == 200 and "Auth is off" in page.text and "team <b>dev</b>" in page.text
        assert client.get("/ui/login", follow_redirects=False).headers["location"] == "/ui"


def test_the_dashboard_is_not_in_the_openapi_schema(api):
    assert not [path for path in api.get("/openapi.json").json()["paths"] if path == "/" or path.startswith("/ui")]
    assert api.get("/", follow_redirects=False).headers["location"] == "/ui"


# -- content ----------------------------------------------------------------------


def test_a_compiled_job_shows_its_kernels_fusion_decisions_timings_and_picture(api, ready_key):
    manifest = Artifact.from_bytes(api.get(f"/artifacts/{ready_key}", headers=AUTH).content).manifest
    page = api.get(f"/ui/jobs/{ready_key}", headers=AUTH | HTML)
    assert page.status_code == 200, page.text
    html, text = page.text, unescape(page.text)
    for kernel in manifest["kernels"]:
        assert f'data-kernel="{kernel["name"]}"' in html and ", ".join(kernel["origins"]) in text
    for refused in manifest["fusion"]["refused"]:
        assert refused["reason"] in text
    assert "No benchmark-driven decision" in text and manifest["fusion"]["benchmark_note"] in text
    assert "no autotuning trials" in text and manifest["autotune"] in text
    assert "aten.mm.default" in text  # its ATen calls
    for stage in ("queued", "lowering", "scheduling", "codegen", "packaging"):
        assert f"<td>{stage}</td>" in html, stage

    svg = graph_svg(html)
    fills = kernel_fills(svg)
    assert set(fills) == {k["name"] for k in manifest["kernels"]}
    assert all(len(colours) == 1 for colours in fills.values()), fills  # one colour per kernel ...
    assert len({next(iter(c)) for c in fills.values()}) == len(fills)  # ... none shared
    drawn = {g.get("data-node"): g for g in svg.iter(f"{SVG_NS}g") if g.get("data-node")}
    graph = corpus("mlp_backward_fp32")
    assert set(drawn) == {n["name"] for n in graph["nodes"]} | {i["name"] for i in graph["inputs"]}
    for kernel in manifest["kernels"]:
        for origin in kernel["origins"]:
            assert kernel["name"] in drawn[origin].get("data-kernels").split()
    assert drawn["mm_1"].get("class") == "node kind-extern" and drawn["view"].get("class") == "node kind-none"

    alone = api.get(f"/ui/jobs/{ready_key}/graph.svg", headers=AUTH)
    assert alone.headers["content-type"].startswith("image/svg+xml") and ET.fromstring(alone.text) is not None
    download = api.get(f"/ui/jobs/{ready_key}/artifact", headers=AUTH)
    assert download.content == api.get(f"/artifacts/{ready_key}", headers=AUTH).content
    assert "attachment" in download.headers["content-disposition"]


def test_the_overview_shows_jobs_by_team_the_cache_and_compile_seconds(api, store, ready_key):
    assert api.head(f"/artifacts/{ready_key}", headers=AUTH).status_code == 200  # a probe hit
    html = api.get("/ui", headers=AUTH | HTML).text
    ready = html.split('id="ready"')[1].split("</section>")[0]
    assert f'href="/ui/jobs/{ready_key}"' in ready and "<td>alpha</td>" in ready
    teams = html.split('id="teams"')[1].split("</section>")[0]
    assert "<td>alpha</td>" in teams
    assert re.search(r'id="hit-rate">\d+\.\d%<', html)
    assert "compile.cpu" in html  # the queue, and its worker:
    assert "main@" in html.split('id="workers"')[1].split("</section>")[0]
    minute = store.traffic("minute", 1)[-1][1]
    assert minute.get("hit:probe", 0) >= 1 and minute.get("hit:fetch", 0) >= 1 and minute.get("bytes", 0) > 0
    assert any("alpha" in teams for _, teams in store.team_compile_seconds(2))
    assert html.count('<svg xmlns="http://www.w3.org/2000/svg" class="chart"') == 5


def test_a_failed_job_shows_its_error_on_its_page_and_the_overview(api, celery_worker):
    graph = make_graph(1000)
    graph["inputs"][1]["shape"] = [1001, 3]  # valid wire format; no compiler can broadcast it
    key = api.post("/compile", json={"graph": graph}, headers=AUTH).json()["key"]
    job = wait_job(api, key)
    assert job["state"] == "failed"
    page = api.get(f"/ui/jobs/{key}", headers=AUTH | HTML).text
    assert "Why it failed" in page and "broadcast" in page.split('id="error"')[1].split("</section>")[0].lower()
    failed = api.get("/ui", headers=AUTH | HTML).text.split('id="failed"')[1].split("</section>")[0]
    assert f'href="/ui/jobs/{key}"' in failed and "broadcast" in failed.lower()
    assert api.get(f"/ui/jobs/{'0' * 64}", headers=AUTH | HTML).status_code == 404


def test_gpu_sections_and_the_plan_picture_render_from_the_manifest(api, store, signed, needs_compiler):
    """A GPU manifest's autotuning trials and benchmark-driven decisions (shaped as compiler/autotune.py
    and benchmark_fusion.py write them), and the picture of an artifact stored without an outline."""
    import compiler
    from compiler.graph import parse_graph

    artifact = compiler.compile(parse_graph(corpus("layer_norm_backward_fp32")), "cpu", {"autotune_budget_s": 9.102})
    kernel = artifact.manifest["kernels"][0]
    kernel["autotune"] = {"candidates": [kernel["config"], {**kernel["config"], "num_warps": 8}],
                          "ms": [0.0125, 0.0093], "chosen": 1, "cached": False}
    artifact.manifest["fusion"]["benchmarked"] = [{
        "node1": "op0", "node2": "op4", "why_benchmarked": "horizontal fusion", "fused_ms": 0.021,
        "unfused_ms": [0.012, 0.0135], "fused": True,
        "reason": "benchmark: fused 0.0210 ms is faster than the parts' 0.0255 ms"}]
    blob = signed(artifact)
    store.put_artifact(artifact.key, blob, hashlib.sha256(blob).hexdigest())

    html = api.get(f"/ui/jobs/{artifact.key}", headers=AUTH | HTML).text
    assert "2 candidates timed, #1 chosen (0.0093 ms)" in html and 'class="chosen"' in html
    benchmarked = html.split('id="benchmarked"')[1].split("</table>")[0]
    assert "0.0210" in benchmarked and "0.0120 + 0.0135" in benchmarked and "fused:" in benchmarked
    assert "<dt>job record</dt><dd>expired" in html and "this is the launch plan" in html
    fills = kernel_fills(graph_svg(html))
    assert set(fills) == {k["name"] for k in artifact.manifest["kernels"]}


def test_a_big_graph_is_drawn_in_part_and_its_rows_flow_down():
    from compiler.graph import parse_graph
    from service.dashboard.layout import layered
    from service.dashboard.outline import graph_outline
    from service.dashboard.picture import MAX_DRAWN, from_outline
    from service.dashboard.svg import graph_svg as draw

    nodes = [{"name": f"r{i}", "target": "aten.relu.default", "args": [{"ref": f"r{i - 1}" if i else "x"}], "kwargs": {}}
             for i in range(MAX_DRAWN + 100)]
    outline = graph_outline(parse_graph({"version": 1, "inputs": [{"name": "x", "dtype": "float32", "shape": [4]}],
                                         "nodes": nodes, "outputs": [{"ref": nodes[-1]["name"]}]}))
    plan = {"steps": [], "inputs": [], "outputs": []}
    manifest = {"kernels": [{"name": "k0", "origins": [n["name"] for n in nodes]}], "plan": plan}
    picture = from_outline(outline, manifest)
    assert (picture.drawn, picture.total) == (MAX_DRAWN, MAX_DRAWN + 100)
    placed = layered([n.id for n in picture.nodes], picture.edges)
    assert all(placed[a][0] < placed[b][0] for a, b in picture.edges)
    svg = ET.fromstring(draw(picture))
    assert len([g for g in svg.iter(f"{SVG_NS}g") if g.get("data-node")]) == MAX_DRAWN + 1  # + the input


# -- a real browser ---------------------------------------------------------------


def _chromium() -> str:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        binary = None
    if binary is None:
        why = "needs Debian's chromium and playwright (scripts/bootstrap.sh installs both)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return binary


def test_a_browser_logs_in_follows_a_job_to_its_kernels_without_a_js_error(api_server, needs_compiler, tmp_path):
    from playwright.sync_api import sync_playwright

    binary = _chromium()
    with httpx.Client(base_url=api_server.url, timeout=30) as client:
        compile_job(client, corpus("layer_norm_fp32"), 9.104, headers={"Authorization": "Bearer tok-beta"})
        key = compile_job(client, transformer_block(), 9.103)
        kernels = Artifact.from_bytes(client.get(f"/artifacts/{key}", headers=AUTH).content).manifest["kernels"]
    shots = Path(os.environ.get(SCREENSHOTS_ENV) or tmp_path)
    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=binary)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
            page.on("pageerror", lambda error: problems.append(str(error)))
            page.goto(f"{api_server.url}/ui")
            assert page.url.startswith(f"{api_server.url}/ui/login")
            page.fill("#token", "tok-alpha")
            page.click("button[type=submit]")
            page.wait_for_selector("#summary")
            assert page.inner_text("h1") == "Overview" and "alpha" in page.inner_text("header")
            assert {"alpha", "beta"} <= set(page.inner_text("#teams").split())
            page.screenshot(path=str(shots / "dashboard-overview.png"), full_page=True)

            page.click(f"#ready a[href='/ui/jobs/{key}']")
            page.wait_for_selector("table.kernels")
            assert key in page.inner_text("h1")
            rows = page.locator("tr.kernel-row")
            assert rows.count() == len(kernels)
            shown = {rows.nth(i).get_attribute("data-kernel") for i in range(rows.count())}
            assert shown == {k["name"] for k in kernels}
            assert page.locator("svg.graph g.node").count() > len(kernels) and page.locator("svg.graph").is_visible()
            height = page.evaluate("document.documentElement.scrollHeight")
            page.screenshot(path=str(shots / "dashboard-job.png"), full_page=True,
                            clip={"x": 0, "y": 0, "width": 1400, "height": min(height, 2800)})  # down to the kernels
        finally:
            browser.close()
    assert problems == [], problems
