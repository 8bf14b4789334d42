"""GET|HEAD /artifacts/{key}: the compiled bundle, immutable, ETag = key.

Bytes come from the process's cache of verified bundles, or from Redis with their
digest checked before they are served; a bundle that fails the check is never sent.
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, Depends, Path, Request, Response
from starlette.concurrency import run_in_threadpool

from service.auth import require_team
from service.errors import ApiError
from service.metrics import BYTES_SERVED, CORRUPT, HITS, MISSES
from service.models import KEY_PATTERN, ErrorBody
from service.store import CorruptArtifact

log = logging.getLogger("fusewire.api")
router = APIRouter(tags=["artifacts"])
MEDIA_TYPE = "application/zip"
IMMUTABLE = "public, max-age=31536000, immutable"


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
            responses={200: {"content": {MEDIA_TYPE: {}}, "description": "the bundle (a ZIP, see docs/ARTIFACT)"},
                       304: {"description": "If-None-Match matched"},
                       404: {"model": ErrorBody, "description": "not compiled (yet)"}})
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
            raise ApiError(404, "not_found", f"no artifact for key {key} (not compiled yet? see GET /jobs/{key})", "key")
        ctx.cache.put(key, *found)
    blob, digest = found
    HITS.labels("fetch").inc()
    BYTES_SERVED.inc(len(blob))
    return Response(content=blob, media_type=MEDIA_TYPE, headers=_headers(key, digest))


@router.head("/artifacts/{key}", summary="Does an artifact exist?", response_class=Response,
             responses={200: {"description": "it exists; Content-Length is its size"}, 404: {"description": "absent"}})
def head_artifact(request: Request, key: str = Path(..., pattern=KEY_PATTERN), team: str = Depends(require_team)):
    ctx = request.app.state.ctx
    cached = ctx.cache.get(key)
    size = len(cached[0]) if cached else ctx.store.artifact_size(key)
    if not size:
        return Response(status_code=404)
    return Response(status_code=200, media_type=MEDIA_TYPE, headers={**_headers(key), "Content-Length": str(size)})
