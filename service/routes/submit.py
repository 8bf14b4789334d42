"""POST /compile: validate, key, answer a hit at once, else join or create the one job."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from kombu.exceptions import OperationalError
from pydantic import ValidationError

from compiler.graph import (GraphValidationError, Graph, graph_to_json, key as graph_key, parse_graph,
                            validate_released_inputs, validate_target)
from compiler.options import CompileOptions
from service.auth import require_team
from service.dashboard.outline import keep_outline
from service.errors import ApiError, error_responses, location
from service.metrics import ENQUEUED, HITS, MISSES, count_lookup
from service.models import CompileRequest, SubmitResponse
from worker.config import TASK_NAME, queue_for

log = logging.getLogger("fusewire.api")
router = APIRouter(tags=["compile"])

ERRORS = error_responses([400, 401, 403, 413, 422, 429, 503], {
    422: "the graph, target, options or request fields are invalid: `invalid_graph` (a rule of the wire "
         "format, schema WireGraph, including the rules its description lists), `over_limit` (a tensor the "
         "graph sizes is over this service's limit), `invalid_target`, `invalid_options` or "
         "`invalid_request`; `where` says where",
    429: "`rate_limited` (the team's submissions per minute) or `compile_budget_exhausted` (the team's "
         "compile seconds this hour; hits are still served)",
    503: "`store_unavailable` (Redis) or `queue_unavailable` (the compile could not be enqueued)",
})
LOCATION = {"Location": {"description": "/jobs/{key}: poll it", "required": True, "schema": {"type": "string"}}}


@router.post(
    "/compile",
    response_model=SubmitResponse,
    summary="Submit a graph to compile",
    responses={200: {"description": "already compiled (`ready`): fetch GET /artifacts/{key}"},
               202: {"model": SubmitResponse, "headers": LOCATION,
                     "description": "a job compiles it (`queued` or `running`): poll GET /jobs/{key}"}, **ERRORS},
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
    _check_literal_sizes(graph, settings)
    try:
        key = graph_key(graph, target, options)
    except (ValueError, TypeError, OverflowError) as exc:
        raise ApiError(422, "invalid_graph", f"graph: cannot be put in canonical form: {exc}", "graph") from None
    if ctx.store.has_artifact(key):
        HITS.labels("submit").inc()
        count_lookup(ctx.store, "submit", hit=True)
        return SubmitResponse(key=key, state="ready")
    MISSES.labels("submit").inc()
    _check_compile_budget(ctx, team, key)
    queue = queue_for(target)
    claim = ctx.store.claim(key, graph_to_json(graph), team=team, target=target, options_json=options.model_dump_json(),
                            queue=queue, stale_s=settings.job_stale_s, ttl_s=settings.job_ttl_s)
    # counted after the claim: the claim is the first write of a miss, so a Redis that stalls writes
    # holds a submission on the claim itself, not first on the dashboard's counter (10 s socket timeout)
    count_lookup(ctx.store, "submit", hit=False)
    if claim.state == "ready":
        return SubmitResponse(key=key, state="ready")
    if claim.state == "new":
        keep_outline(ctx.store, key, graph, settings.job_ttl_s)  # the dashboard's picture of it
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


def _check_literal_sizes(graph: Graph, settings) -> None:
    """422 for a tensor the graph itself says is over the limit (inputs, constants, literal sizes);
    sizes known only after shape inference are checked by the worker (compiler/bounds.py)."""
    from compiler.bounds import LimitExceeded, check_literal_sizes

    try:
        check_literal_sizes(graph, settings.work_limits())
    except LimitExceeded as exc:
        where = f"graph.{exc.where}" if exc.where else "graph"
        raise ApiError(422, "over_limit", f"{where}: {exc.problem}", where) from None


def _check_compile_budget(ctx, team: str, key: str) -> None:
    """429 once the team's finished compiles took its budget of seconds this hour; joining a job
    that is already queued or running costs nothing and is always allowed."""
    budget = ctx.settings.compile_budget_for(team)
    retry_after = ctx.store.over_compile_budget(team, budget)
    if retry_after and (ctx.store.job(key) or {}).get("state") not in ("queued", "running"):
        raise ApiError(429, "compile_budget_exhausted",
                       f"team '{team}' has used its {budget:g} compile seconds for this hour; "
                       "graphs already compiled are still served", headers={"Retry-After": str(int(retry_after))})


def _validate(body: CompileRequest, allowed_targets: list[str] | None) -> tuple[Graph, str, CompileOptions]:
    try:
        target = validate_target(body.target)
    except GraphValidationError as exc:
        raise ApiError(422, "invalid_target", str(exc), "target") from None
    if allowed_targets is not None and target not in allowed_targets:
        raise ApiError(422, "invalid_target", f"target: this service compiles for {', '.join(allowed_targets)}, not '{target}'",
                       "target")
    try:
        options = CompileOptions.model_validate(_json_integers(body.options or {}), strict=True)  # no "1" for 1
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
    try:
        validate_released_inputs(graph, options)
    except GraphValidationError as exc:
        raise ApiError(422, "invalid_options", str(exc), exc.where) from None
    return graph, target, options


def _json_integers(options: dict) -> dict:
    """Options as their JSON Schema reads them: 64.0 is the integer 64, an array is a tuple; strings
    and booleans are no numbers."""
    def read(value: Any) -> Any:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return tuple(read(item) for item in value) if isinstance(value, list) else value

    return {name: read(value) for name, value in options.items()}
