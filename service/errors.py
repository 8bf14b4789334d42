"""One error body for every 4xx/5xx: {error, detail, where}. Bad input is never a 500."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError as RedisOutOfMemoryError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.models import ErrorBody

log = logging.getLogger("fusewire.api")

_RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before trying again", "required": True,
                                "schema": {"type": "string", "pattern": "^[0-9]+$"}}}
_CHALLENGE = {"WWW-Authenticate": {"description": "the Bearer challenge", "required": True, "schema": {"type": "string"}}}
# What each status means on any route that can answer it; a route may say more (`descriptions`).
ERROR_STATUSES: dict[int, tuple[str, dict | None]] = {
    400: ("`bad_json`: the body is not JSON, or nests too deeply to parse", None),
    401: ("`unauthenticated`: no `Authorization: Bearer <token>` header", _CHALLENGE),
    403: ("`forbidden`: unknown token", _CHALLENGE),
    404: ("`not_found`", None),
    413: ("`too_large`: the body is over FUSEWIRE_MAX_REQUEST_BYTES", None),
    422: ("`invalid_request`: a parameter or field breaks the schema; `where` names it", None),
    429: ("`rate_limited`: the team is over its submissions per minute", _RETRY_AFTER),
    500: ("`artifact_corrupt`: the stored artifact failed its digest check and was not served", None),
    503: ("`store_unavailable`: Redis is unreachable", _RETRY_AFTER),
}


def error_responses(statuses: list[int], descriptions: dict[int, str] | None = None,
                    body: bool = True) -> dict[int | str, dict]:
    """`responses=` for a route: each status with the ErrorBody it really has (none for HEAD,
    `body=False`) and its headers. Every route declares its own 422, so FastAPI adds no
    `HTTPValidationError` (service.openapi replaces any that slips through)."""
    responses: dict[int | str, dict] = {}
    for status in statuses:
        default, headers = ERROR_STATUSES[status]
        entry: dict = {"description": (descriptions or {}).get(status, default)}
        if body:
            entry["model"] = ErrorBody
        if headers:
            entry["headers"] = headers
        responses[status] = entry
    return responses


class ApiError(Exception):
    def __init__(self, status: int, error: str, detail: str, where: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.error, self.detail, self.where, self.headers = status, error, detail, where, headers


def error_response(status: int, error: str, detail: str, where: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail, "where": where}, status_code=status, headers=headers)


def location(loc: tuple | list) -> str:
    """('body', 'graph', 'nodes', 0) -> 'graph.nodes[0]'."""
    parts: list[str] = []
    for item in loc:
        if item == "body" and not parts:
            continue
        if isinstance(item, int) and parts:
            parts[-1] += f"[{item}]"
        else:
            parts.append(str(item))
    return ".".join(parts) or "body"


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError):
        return error_response(exc.status, exc.error, exc.detail, exc.where, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError):
        errors = exc.errors()
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        if first.get("type") == "json_invalid":
            context = first.get("ctx", {}).get("error", "")
            return error_response(400, "bad_json", f"request body is not valid JSON: {context or first['msg']}", "body")
        where = location(first.get("loc", ()))
        return error_response(422, "invalid_request", f"{where}: {first['msg']}", where)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException):
        code = {400: "bad_request", 404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 400 and detail == "There was an error parsing the body":
            detail = "request body could not be parsed (not JSON, or nested too deeply)"
            code = "bad_json"
        return error_response(exc.status_code, code, detail, headers=getattr(exc, "headers", None))

    @app.exception_handler(RedisConnectionError)
    @app.exception_handler(RedisTimeoutError)
    async def redis_down(_: Request, exc: Exception):
        log.error("Redis unavailable: %s", exc)
        return error_response(503, "store_unavailable", f"the artifact store (Redis) is unavailable: {exc}",
                              headers={"Retry-After": "5"})

    @app.exception_handler(RedisOutOfMemoryError)
    async def redis_full(_: Request, exc: Exception):
        log.error("Redis is full (maxmemory reached, noeviction): %s", exc)
        return error_response(503, "store_full", "the artifact store (Redis) is full; operators: raise its maxmemory "
                              "or delete artifacts no longer wanted", headers={"Retry-After": "60"})
