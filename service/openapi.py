"""The OpenAPI document (/openapi.json, /docs): FastAPI's, completed so that it describes the API.

- Every error response is an ErrorBody (`{error, detail, where}`); FastAPI's default 422
  `HTTPValidationError` never appears (routes declare their own 422; any left is replaced).
- `graph` is the wire format's JSON Schema (components Wire*, from compiler.wire_schema, with the
  default Limits the API validates with), `options` is compiler.options.CompileOptions, and
  `target` the service's targets when FUSEWIRE_TARGETS lists them.
- Routes that need a token carry a `bearer` security requirement (optional in open mode).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from compiler.options import CompileOptions, Limits
from compiler.wire_schema import target_schema, wire_definitions
from service.models import SCHEMAS
from service.settings import Settings

FASTAPI_VALIDATION_SCHEMAS = ("HTTPValidationError", "ValidationError")
BEARER = {"type": "http", "scheme": "bearer",
          "description": "a team's token (FUSEWIRE_TOKENS); 401 without one, 403 for an unknown one"}


def install(app: FastAPI, settings: Settings, open_auth: bool) -> None:
    """Makes app.openapi return FastAPI's document completed by `complete` (built once, on the
    first request for it)."""
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            complete(FastAPI.openapi(app), settings, open_auth)  # FastAPI's own caches it in app.openapi_schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def complete(document: dict[str, Any], settings: Settings, open_auth: bool) -> dict[str, Any]:
    """Adds what FastAPI cannot know to its document, in place."""
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(wire_definitions(SCHEMAS, Limits()))
    schemas["WireGraph"]["description"] += (
        f"\n\nThis service: at most {settings.work_limits().max_tensor_elements} elements per tensor "
        "(FUSEWIRE_MAX_TENSOR_ELEMENTS), inputs, constants and literal sizes included.")
    schemas["CompileOptions"] = CompileOptions.model_json_schema(ref_template=SCHEMAS + "{model}")
    _describe_target(schemas["CompileRequest"], settings.targets)
    _replace_validation_errors(document)
    _add_security(document, open_auth)
    return document


def _describe_target(request: dict[str, Any], allowed: list[str] | None) -> None:
    target = request["properties"]["target"]
    target.pop("default", None)
    target.pop("pattern", None)
    target.update(target_schema(allowed))
    if allowed:
        target["examples"] = [name for name in target.get("examples", []) if name in allowed] or list(allowed[:1])
    if "default" not in target:  # "cpu" is not served here: the request must name a target
        request.setdefault("required", []).append("target")


def _replace_validation_errors(document: dict[str, Any]) -> None:
    """FastAPI's HTTPValidationError describes a body this API never sends: point every use of it
    at ErrorBody and drop it."""
    old = {SCHEMAS + name for name in FASTAPI_VALIDATION_SCHEMAS}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("$ref") in old:
                node["$ref"] = SCHEMAS + "ErrorBody"
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(document["paths"])
    for name in FASTAPI_VALIDATION_SCHEMAS:
        document["components"]["schemas"].pop(name, None)


def _add_security(document: dict[str, Any], open_auth: bool) -> None:
    """`bearer` on every operation that declares a 401 (the routes that depend on
    service.auth.require_team); in open mode a token is optional (the empty requirement), as
    the service then accepts any request."""
    document["components"]["securitySchemes"] = {"bearer": BEARER}
    requirement = [{}, {"bearer": []}] if open_auth else [{"bearer": []}]
    for operations in document["paths"].values():
        for operation in operations.values():
            if "401" in operation.get("responses", {}):
                operation["security"] = requirement
