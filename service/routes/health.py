"""Liveness, readiness (Redis reachable, workers alive) and Prometheus metrics."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry
from redis.exceptions import RedisError

from compiler.version import FUSEWIRE_VERSION
from service.metrics import exposition
from service.models import Health, Readiness

log = logging.getLogger("fusewire.api")
router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, summary="The API process is up")
async def healthz():
    return Health(version=FUSEWIRE_VERSION)


@router.get("/readyz", response_model=Readiness, summary="Redis reachable and at least one worker alive",
            responses={503: {"model": Readiness, "description": "not ready; `problems` says why"}})
def readyz(request: Request):
    ctx = request.app.state.ctx
    report = {"ready": False, "redis": False, "auth": "open" if ctx.auth.open else "tokens", "problems": []}
    try:
        ctx.store.ping()
        report["redis"] = True
        report["workers"] = ctx.store.live_workers(ctx.settings.heartbeat_ttl_s)
        report["queues"] = ctx.store.queue_depths()
        report["active_jobs"] = ctx.store.active_jobs()
    except RedisError as exc:
        report["problems"].append(f"Redis unreachable at {ctx.settings.redis_url}: {exc}")
    if report["redis"] and not report.get("workers"):
        report["problems"].append(f"no worker heartbeat in the last {ctx.settings.heartbeat_ttl_s:g} s")
    report["ready"] = not report["problems"]
    body = Readiness.model_validate(report)
    return JSONResponse(body.model_dump(), status_code=200 if body.ready else 503)


@router.get("/metrics", summary="Prometheus metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                             "description": "Prometheus text exposition format (without the metrics read from "
                                            "Redis while it is unreachable)"}})
def metrics(request: Request):
    try:
        text = exposition(request.app.state.ctx.metrics_registry)
    except RedisError as exc:  # the process's own counters (its 503s among them) matter most while Redis is away
        log.warning("/metrics without the metrics read from Redis: %s", exc)
        text = exposition(CollectorRegistry())
    return Response(text, media_type=CONTENT_TYPE_LATEST)
