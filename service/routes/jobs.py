"""GET /jobs/{key}: where a compile is (queued, running + stage/progress, ready, failed + error)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Path, Request

from service.auth import require_team
from service.errors import ApiError, error_responses
from service.models import KEY_PATTERN, JobStatus

router = APIRouter(tags=["jobs"])


@router.get("/jobs/{key}", response_model=JobStatus, summary="State of a compile job",
            responses=error_responses([401, 403, 404, 422, 503], {
                404: "`not_found`: no job and no artifact for this key",
                422: "`invalid_request`: the key is not 64 lowercase hex digits"}))
def job_status(request: Request, key: str = Path(..., pattern=KEY_PATTERN), team: str = Depends(require_team)):
    store = request.app.state.ctx.store
    job = store.job(key)
    if job is None:
        if store.has_artifact(key):
            return JobStatus(key=key, state="ready", stage="done", progress=1.0)
        raise ApiError(404, "not_found", f"no job and no artifact for key {key}", "key")
    return to_status(key, job)


def to_status(key: str, job: dict[str, str]) -> JobStatus:
    number = lambda name: float(job[name]) if job.get(name) else None  # noqa: E731
    submitted, started = number("submitted_at"), number("started_at")
    return JobStatus(
        key=key,
        state=job.get("state", "queued"),
        stage=job.get("stage"),
        progress=float(job.get("progress") or 0),
        error=job.get("error") or None,
        target=job.get("target"),
        team=job.get("team"),
        attempts=int(job.get("attempts") or 0),
        deliveries=int(job.get("deliveries") or 0),
        worker=job.get("worker"),
        submitted_at=submitted,
        started_at=started,
        finished_at=number("finished_at"),
        queued_s=round(started - submitted, 3) if started and submitted else None,
        compile_s=number("compile_s"),
        size=int(job["size"]) if job.get("size") else None,
        digest=job.get("digest"),
    )
