"""POST /compile: validate, key, answer a hit at once, else join or create the one job."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from kombu.exceptions import OperationalError
from pydantic import ValidationError

from compiler.graph import GraphValidationError, Graph, graph_to_json, key as graph_key, parse_graph, validate_target
from compiler.options import CompileOptions
from service.auth import require_team
from service.errors import ApiError, location
from service.metrics import ENQUEUED, HITS, MISSES
from service.models import CompileRequest, ErrorBody, SubmitResponse
from worker.config import TASK_NAME, queue_for

log = logging.getLogger("fusewire.api")
router = APIRouter(tags=["compile"])

ERRORS = {
    400: {"model": ErrorBody, "description": "the body is not JSON"},
    401: {"model": ErrorBody, "description": "no bearer token"},
    403: {"model": ErrorBody, "description": "unknown token"},
    413: {"model": ErrorBody, "description": "the body is over the size limit"},
    422: {"model": ErrorBody, "description": "the graph, target or options are invalid; `where` says where"},
    429: {"model": ErrorBody, "description": "the team's submission rate limit; see Retry-After"},
    503: {"model": ErrorBody, "description": "Redis or the queue is unavailable"},
}


@router.post(
    "/compile",
    response_model=SubmitResponse,
    summary="Submit a graph to compile",
    responses={200: {"description": "already compiled: fetch GET /artifacts/{key}"},
               202: {"model": SubmitResponse, "description": "a job compiles it: poll GET /jobs/{key}"}, **ERRORS},
)
def submit(body: CompileRequest, request: Request, team: str = Depends(require_team)):
    """Idempotent: every submission of one key joins the same job; exactly one compile runs."""
    ctx = request.app.state.ctx
    settings = ctx.settings
    limit = settings.rate_limit_for(team)
    retry_after = ctx.store.hit_rate_limit(team, limit)
    if retry_after:
        raise ApiError(429, "rate_limited", f"team '{team}' is over its limit of {limit} submissions per minute",
                       headers={"Retry-After": str(int(retry_after))})
    graph, target, options = _validate(body, settings.targets)
    try:
        key = graph_key(graph, target, options)
    except (ValueError, TypeError, OverflowError) as exc:
        raise ApiError(422, "invalid_graph", f"graph: cannot be put in canonical form: {exc}", "graph") from None
    if ctx.store.has_artifact(key):
        HITS.labels("submit").inc()
        return SubmitResponse(key=key, state="ready")
    MISSES.labels("submit").inc()
    queue = queue_for(target)
    claim = ctx.store.claim(key, graph_to_json(graph), team=team, target=target, options_json=options.model_dump_json(),
                            queue=queue, stale_s=settings.job_stale_s, ttl_s=settings.job_ttl_s)
    if claim.state == "ready":
        return SubmitResponse(key=key, state="ready")
    if claim.state == "new":
        try:
            ctx.celery.send_task(TASK_NAME, args=[key, claim.attempt], queue=queue)
        except OperationalError as exc:
            ctx.store.finish(key, "failed", settings.job_ttl_s, error=f"could not enqueue the job: {exc}; submit again")
            raise ApiError(503, "queue_unavailable", f"could not enqueue the compile: {exc}",
                           headers={"Retry-After": "5"}) from None
        ENQUEUED.labels(queue).inc()
        log.info("team %s: queued %s for %s (attempt %d)", team, key[:12], target, claim.attempt)
    state = "queued" if claim.state == "new" else claim.state
    return JSONResponse({"key": key, "state": state}, status_code=202, headers={"Location": f"/jobs/{key}"})


def _validate(body: CompileRequest, allowed_targets: list[str] | None) -> tuple[Graph, str, CompileOptions]:
    try:
        target = validate_target(body.target)
    except GraphValidationError as exc:
        raise ApiError(422, "invalid_target", str(exc), "target") from None
    if allowed_targets is not None and target not in allowed_targets:
        raise ApiError(422, "invalid_target", f"target: this service compiles for {', '.join(allowed_targets)}, not '{target}'",
                       "target")
    try:
        options = CompileOptions.model_validate(body.options or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = location(("options", *first["loc"]))
        raise ApiError(422, "invalid_options", f"{where}: {first['msg']}", where) from None
    try:
        graph = parse_graph(body.graph)
    except GraphValidationError as exc:
        where = f"graph.{exc.where}" if exc.where and exc.where != "graph" else "graph"
        raise ApiError(422, "invalid_graph", f"{where}: {exc.problem}", where) from None
    except RecursionError:
        raise ApiError(422, "invalid_graph", "graph: arguments are nested too deeply", "graph") from None
    return graph, target, options
