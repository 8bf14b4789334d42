"""The dashboard's pages, server-rendered (Jinja2) under /ui, left out of the OpenAPI schema.

    GET  /ui                          overview: workers, queues, jobs by team, hit rate, traffic, compile seconds
    GET  /ui/jobs/{key}               a job or artifact: timings, kernels, fusion decisions, the graph picture
    GET  /ui/jobs/{key}/graph.svg     the picture alone
    GET  /ui/jobs/{key}/artifact      the bundle, as a download
    GET  /ui/login, POST /ui/login, POST /ui/logout
    GET  /ui/static/{name}            the stylesheet (no token needed)
    GET  /                            redirects to /ui
"""

from __future__ import annotations

import time
from pathlib import Path as FilePath
from typing import Any, Callable
from urllib.parse import parse_qs, quote

import jinja2
from fastapi import APIRouter, Depends, Path, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.routing import APIRoute
from fastapi.templating import Jinja2Templates
from starlette.concurrency import run_in_threadpool

from compiler.artifact import ArtifactError
from compiler.version import FUSEWIRE_VERSION
from service.dashboard import access, overview, story
from service.metrics import count_lookup
from service.models import KEY_PATTERN
from service.store import CorruptArtifact

HERE = FilePath(__file__).parent
STATIC = {"dashboard.css": ("text/css", (HERE / "static" / "dashboard.css").read_bytes())}
MAX_LOGIN_BYTES = 4096


class PageRoute(APIRoute):
    """A page route: a browser without a valid token is redirected to the login page."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def page(request: Request) -> Response:
            try:
                return await handler(request)
            except access.LoginRequired as exc:
                why = "&expired=1" if exc.expired else ""
                return RedirectResponse(f"/ui/login?next={quote(exc.next_path)}{why}", status_code=303)
        return page


def _ago(at: float | None) -> str:
    if not at:
        return "-"
    return f"{overview.seconds(max(0.0, time.time() - at))} ago"


def _when(at: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) if at else "-"


def _pct(rate: float | None) -> str:
    return "-" if rate is None else f"{100 * rate:.1f}%"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(bytes=overview.human_bytes, secs=overview.seconds, ago=_ago, when=_when, pct=_pct,
                       short=lambda key: key[:12])
    return env


templates = Jinja2Templates(env=_environment())
router = APIRouter(route_class=PageRoute, include_in_schema=False)


def render(request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
    ctx = request.app.state.ctx
    base = {"auth_open": ctx.auth.open, "version": FUSEWIRE_VERSION, "now": time.time(),
            "logged_in": bool(request.cookies.get(access.COOKIE)), "team": None}
    return templates.TemplateResponse(request, name, base | context, status_code=status)


@router.get("/")
def root() -> RedirectResponse:
    return RedirectResponse("/ui", status_code=307)


@router.get("/ui")
def overview_page(request: Request, refresh: int = 0, team: str = Depends(access.viewer)):
    ctx = request.app.state.ctx
    data = overview.gather(ctx.store, ctx.settings)
    return render(request, "overview.html", team=team, o=data, refresh=max(0, min(refresh, 3600)))


@router.get("/ui/jobs/{key}")
def job_page(request: Request, key: str = Path(..., pattern=KEY_PATTERN), team: str = Depends(access.viewer)):
    ctx = request.app.state.ctx
    try:
        page = story.job_page(ctx.store, ctx.cache, key)
    except (CorruptArtifact, ArtifactError) as exc:
        return render(request, "problem.html", 500, team=team, title="Artifact unreadable", detail=str(exc))
    if page is None:
        return render(request, "problem.html", 404, team=team, title="No such job",
                      detail=f"No job and no artifact for key {key}.")
    return render(request, "job.html", team=team, p=page)


@router.get("/ui/jobs/{key}/graph.svg")
def graph_svg(request: Request, key: str = Path(..., pattern=KEY_PATTERN), team: str = Depends(access.viewer)):
    ctx = request.app.state.ctx
    page = story.job_page(ctx.store, ctx.cache, key)
    if page is None or not page.svg:
        return Response("no artifact for this key", status_code=404, media_type="text/plain")
    return Response(page.svg, media_type="image/svg+xml")


@router.get("/ui/jobs/{key}/artifact")
def download(request: Request, key: str = Path(..., pattern=KEY_PATTERN), team: str = Depends(access.viewer)):
    ctx = request.app.state.ctx
    try:
        found = ctx.cache.get(key) or ctx.store.get_artifact(key)
    except CorruptArtifact as exc:
        return Response(f"{exc}; not served", status_code=500, media_type="text/plain")
    count_lookup(ctx.store, "fetch", found is not None, len(found[0]) if found else 0)
    if found is None:
        return Response("no artifact for this key", status_code=404, media_type="text/plain")
    return Response(found[0], media_type="application/zip", headers={
        "Content-Disposition": f'attachment; filename="{key[:16]}.fwa"', "X-Fusewire-Digest": found[1]})


@router.get("/ui/login")
def login_form(request: Request, next: str = "/ui", expired: int = 0):
    if request.app.state.ctx.auth.open:
        return RedirectResponse(access.safe_next(next), status_code=303)
    message = "Your token is no longer accepted; log in again." if expired else ""
    return render(request, "login.html", next=access.safe_next(next), message=message)


@router.post("/ui/login")
async def login(request: Request):
    ctx = request.app.state.ctx
    form = parse_qs((await request.body())[:MAX_LOGIN_BYTES].decode(errors="replace"))
    token, target = (form.get("token") or [""])[0].strip(), access.safe_next((form.get("next") or ["/ui"])[0])
    if not access.same_origin(request):
        return render(request, "login.html", 403, next=target, message="The form was not sent from this site.")
    if ctx.auth.open:
        return RedirectResponse(target, status_code=303)
    team = await run_in_threadpool(access.team_of, ctx.auth, token) if token else None
    if team is None:
        return render(request, "login.html", 403, next=target, message="Unknown token.")
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(access.COOKIE, token, max_age=access.COOKIE_MAX_AGE_S, path=access.COOKIE_PATH,
                        httponly=True, samesite="strict", secure=request.url.scheme == "https")
    return response


@router.post("/ui/logout")
def logout() -> RedirectResponse:
    response = RedirectResponse("/ui/login", status_code=303)
    response.delete_cookie(access.COOKIE, path=access.COOKIE_PATH)
    return response


@router.get("/ui/static/{name}")
def static(name: str) -> Response:
    if name not in STATIC:
        return Response("not found", status_code=404, media_type="text/plain")
    media_type, body = STATIC[name]
    return Response(body, media_type=media_type, headers={"Cache-Control": "public, max-age=3600"})
