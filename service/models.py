"""Request and response bodies of the HTTP API; declared on the routes so /docs documents them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

KEY_PATTERN = r"^[0-9a-f]{64}$"

EXAMPLE_GRAPH = {
    "version": 1,
    "inputs": [{"name": "x", "dtype": "float32", "shape": [64, 32]}, {"name": "y", "dtype": "float32", "shape": [64, 32]}],
    "nodes": [
        {"name": "s", "target": "aten.add.Tensor", "args": [{"ref": "x"}, {"ref": "y"}], "kwargs": {}},
        {"name": "r", "target": "aten.relu.default", "args": [{"ref": "s"}], "kwargs": {}},
        {"name": "t", "target": "aten.sum.dim_IntList", "args": [{"ref": "r"}, [1]], "kwargs": {}},
    ],
    "outputs": [{"ref": "t"}],
}


class CompileRequest(BaseModel):
    graph: dict[str, Any] = Field(..., description="a wire-format v1 graph (see DESIGN.md)", examples=[EXAMPLE_GRAPH])
    target: str = Field("cpu", description="'cpu' (Triton interpreter) or 'cuda:sm_XY'", examples=["cpu", "cuda:sm_90"])
    options: dict[str, Any] | None = Field(None, description="compiler.options.CompileOptions fields; all part of the key")


class SubmitResponse(BaseModel):
    key: str = Field(..., description="sha256 content address of graph + target + options + compiler ABI")
    state: Literal["ready", "queued", "running"]


class JobStatus(BaseModel):
    key: str
    state: Literal["queued", "running", "ready", "failed"]
    stage: str | None = Field(None, description="the compiler stage last reported (lowering, scheduling, codegen, ...)")
    progress: float = Field(0.0, ge=0, le=1)
    error: str | None = Field(None, description="why the compile failed (state 'failed')")
    target: str | None = None
    team: str | None = Field(None, description="the team whose submission started the current attempt")
    attempts: int = Field(0, description="compile attempts (a failed job is retried by submitting it again)")
    deliveries: int = Field(0, description="deliveries of the current attempt to a worker (more than 1: a worker died)")
    worker: str | None = None
    submitted_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    queued_s: float | None = Field(None, description="seconds from submission to a worker starting it")
    compile_s: float | None = Field(None, description="seconds the compile took")
    size: int | None = Field(None, description="artifact bytes (state 'ready')")
    digest: str | None = Field(None, description="artifact sha256 (state 'ready')")


class ErrorBody(BaseModel):
    error: str = Field(..., description="machine-readable code, e.g. invalid_graph, bad_json, rate_limited")
    detail: str = Field(..., description="what is wrong and where, for a person")
    where: str | None = Field(None, description="location in the request, e.g. \"graph.nodes[3] 'ln'.args[1]\"")


class Health(BaseModel):
    status: Literal["ok"] = "ok"
    version: str


class WorkerInfo(BaseModel):
    hostname: str
    queues: list[str] = []
    seen_s_ago: float


class Readiness(BaseModel):
    ready: bool
    redis: bool
    workers: list[WorkerInfo] = []
    queues: dict[str, int] = Field({}, description="messages waiting per Celery queue")
    active_jobs: int = 0
    auth: Literal["tokens", "open"]
    problems: list[str] = []
