"""One error body for every 4xx/5xx: {error, detail, where}. Bad input is never a 500."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("fusewire.api")


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
