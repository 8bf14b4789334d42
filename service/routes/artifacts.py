"""GET|HEAD /artifacts/{key}: the compiled bundle, immutable, ETag = key.

Bytes come from the process's cache of verified bundles, or from Redis with their
digest checked before they are served; a bundle that fails the check is never sent.
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, Depends, Path, Request, Response
from starlette.concurrency import run_in_threadpool

from service.auth import require_team
from service.errors import ApiError, error_responses
from service.metrics import BYTES_SERVED, CORRUPT, HITS, MISSES, count_lookup
from service.models import KEY_PATTERN
from service.store import CorruptArtifact

log = logging.getLogger("fusewire.api")
router = APIRouter(tags=["artifacts"])
MEDIA_TYPE = "application/zip"
IMMUTABLE = "public, max-age=31536000, immutable"
_STRING = {"type": "string"}
CACHING = {"ETag": {"description": 'the key in quotes: "<key>"', "required": True, "schema": _STRING},
           "Cache-Control": {"description": IMMUTABLE, "required": True, "schema": _STRING}}
DIGEST = {"X-Fusewire-Digest": {"description": "sha256 of the bundle, hex", "required": True,
                                "schema": {"type": "string", "pattern": "^[0-9a-f]{64}$"}}}
SIZE = {"Content-Length": {"description": "the bundle's size in bytes", "required": True, "schema": _STRING}}
IF_NONE_MATCH = {"name": "If-None-Match", "in": "header", "required": False, "schema": _STRING,
                 "description": "ETags you hold (\"<key>\", or *): 304 when one matches"}


def _headers(key: str, digest: str | None = None) -> dict[str, str]:
    headers = {"ETag": f'"{key}"', "Cache-Control": IMMUTABLE}
    if digest:
        headers["X-Fusewire-Digest"] = digest
    return headers


def _not_modified(request: Request, key: str) -> bool:
    tags = request.headers.get("if-none-match")
    return bool(tags) and (tags.strip() == "*" or f'"{key}"' in tags or key in tags.replace('"', "").split(","))


@router.get("/artifacts/{key}", summary="Download a compiled artifact",
            response_class=Response,
            responses={200: {"content": {MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}},
                             "headers": {**CACHING, **DIGEST}, "description": "the bundle (a ZIP, see docs/ARTIFACT)"},
                       304: {"headers": CACHING, "description": "If-None-Match matched: use your copy"},
                       **error_responses([401, 403, 404, 422, 500, 503], {
                           404: "`not_found`: not compiled (yet)",
                           422: "`invalid_request`: the key is not 64 lowercase hex digits"})},
            openapi_extra={"parameters": [IF_NONE_MATCH]})
async def get_artifact(request: Request, key: str = Path(..., pattern=KEY_PATTERN), team: str = Depends(require_team)):
    ctx = request.app.state.ctx
    if _not_modified(request, key):
        return Response(status_code=304, headers=_headers(key))
    found = ctx.cache.get(key)
    if found is None:
        try:
            found = await run_in_threadpool(ctx.store.get_artifact, key)
        except CorruptArtifact as exc:
            CORRUPT.inc()
            log.error("%s", exc)
            raise ApiError(500, "artifact_corrupt", f"the stored artifact for {key} failed its digest check; "
                           "it was not served (operators: delete it and resubmit the graph)", "key") from None
        if found is None:
            MISSES.labels("fetch").inc()
            await run_in_threadpool(count_lookup, ctx.store, "fetch", False)
            raise ApiError(404, "not_found", f"no artifact for key {key} (not compiled yet? see GET /jobs/{key})", "key")
        ctx.cache.put(key, *found)
    blob, digest = found
    HITS.labels("fetch").inc()
    BYTES_SERVED.inc(len(blob))
    await run_in_threadpool(count_lookup, ctx.store, "fetch", True, len(blob))
    return Response(content=blob, media_type=MEDIA_TYPE, headers=_headers(key, digest))


@router.head("/artifacts/{key}", summary="Does an artifact exist?", response_class=Response,
             responses={200: {"headers": {**CACHING, **SIZE}, "description": "it exists; Content-Length is its size"},
                        **error_responses([401, 403, 404, 422, 503], {404: "absent"}, body=False)})
def head_artifact(request: Request, key: str = Path(..., pattern=KEY_PATTERN), team: str = Depends(require_team)):
    ctx = request.app.state.ctx
    cached = ctx.cache.get(key)
    size = len(cached[0]) if cached else ctx.store.artifact_size(key)
    count_lookup(ctx.store, "probe", bool(size))
    if not size:
        return Response(status_code=404)
    return Response(status_code=200, media_type=MEDIA_TYPE, headers={**_headers(key), "Content-Length": str(size)})
