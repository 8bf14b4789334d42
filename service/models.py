"""Request and response bodies of the HTTP API; declared on the routes so /docs documents them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from compiler.graph import TARGET_PATTERN

KEY_PATTERN = r"^[0-9a-f]{64}$"
# Components that service.openapi adds to the document: the wire format's schema, generated from
# compiler.graph's models (compiler.wire_schema), and compiler.options.CompileOptions. The API
# validates both with the compiler's own code (better messages, the configured limits).
SCHEMAS = "#/components/schemas/"
# (allOf: pydantic would try to resolve a bare $ref among its own definitions)
WIRE_GRAPH_SCHEMA = {"allOf": [{"$ref": SCHEMAS + "WireGraph"}]}
OPTIONS_SCHEMA = {"anyOf": [{"$ref": SCHEMAS + "CompileOptions"}, {"type": "null"}], "default": None}

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
    """POST /compile. Parsed loosely here; routes.submit validates each field with the compiler's
    rules, so that a 422 names the place (`graph.nodes[3] 'ln'.args[1]`)."""

    graph: Annotated[dict[str, Any], WithJsonSchema(WIRE_GRAPH_SCHEMA)] = Field(
        ..., description="a wire-format v1.1 graph (docs/WIRE.md)", examples=[EXAMPLE_GRAPH])
    target: str = Field("cpu", description="'cpu' (Triton interpreter) or 'cuda:sm_XY'", examples=["cpu", "cuda:sm_90"],
                        json_schema_extra={"pattern": TARGET_PATTERN.pattern})
    options: Annotated[dict[str, Any] | None, WithJsonSchema(OPTIONS_SCHEMA)] = Field(
        None, description="compiler.options.CompileOptions fields; all part of the key")


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
    """Every 4xx/5xx body (service.errors): exactly these three fields."""

    model_config = ConfigDict(extra="forbid")

    error: str = Field(..., description="machine-readable code, e.g. invalid_graph, bad_json, rate_limited",
                       examples=["invalid_graph"])
    detail: str = Field(..., description="what is wrong and where, for a person",
                        examples=["graph.nodes[1] 'r'.target: unknown ATen op 'aten.frobnicate.default'"])
    where: str | None = Field(..., description="location in the request, e.g. \"graph.nodes[3] 'ln'.args[1]\"; "
                              "null when the problem has no place", examples=["graph.nodes[1] 'r'.target"])


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
