"""A job's page: its record, where its time went, and the fusion story its manifest tells.

Everything here is read from the store (job hash, `stages:{key}`, `outline:{key}`, the
artifact) and the artifact's manifest (compiler/artifact.py); nothing imports the compiler's
heavy stages. Sections the manifest leaves empty (no autotuning on a CPU target, no
benchmark-driven decision) are returned empty with the manifest's own note, for the page to say so.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

from compiler.artifact import Artifact
from service.dashboard import picture
from service.dashboard.svg import graph_svg, kernel_colours

STAGE_MEANING = {
    "starting": "worker setup: read and check the graph, load the signing key",
    "test-delay": "test hook sleeping (FUSEWIRE_TEST_COMPILE_DELAY_S)",
    "lowering": "ATen ops to loop-level IR",
    "scheduling": "dependencies, fusion decisions (benchmarks on a GPU)",
    "codegen": "Triton kernels and the launch plan",
    "autotuning": "launch configs (timed on a GPU), cubins",
    "packaging": "the artifact bundle",
    "done": "sign, verify and store the artifact",
}


@dataclass
class Stage:
    name: str
    meaning: str
    start: float
    seconds: float | None  # None while it runs


@dataclass
class JobPage:
    key: str
    job: dict[str, str] | None
    stages: list[Stage]
    manifest: dict[str, Any] | None
    size: int = 0
    kernels: list[dict[str, Any]] = field(default_factory=list)
    externs: list[dict[str, Any]] = field(default_factory=list)
    svg: str = ""
    picture: picture.Picture | None = None
    signature: dict[str, Any] | None = None

    @property
    def refusal_reasons(self) -> list[tuple[str, int]]:
        """Each reason a fusion was refused for, most frequent first."""
        refused = (self.manifest or {}).get("fusion", {}).get("refused", [])
        return Counter(r["reason"] for r in refused).most_common()

    @property
    def longest_stage(self) -> float:
        return max([s.seconds for s in self.stages if s.seconds] or [1.0])


def job_page(store, cache, key: str) -> JobPage | None:
    """The page's data; None when neither a job nor an artifact exists for `key`."""
    job = store.job(key)
    blob = _artifact_bytes(store, cache, key)
    if job is None and blob is None:
        return None
    page = JobPage(key, job, stage_timeline(job, store.stage_times(key)) if job else [], None)
    if blob is not None:
        artifact = parsed(key, blob)
        page.manifest, page.size, page.signature = artifact.manifest, len(blob), artifact.signature
        page.kernels = kernel_rows(artifact)
        page.externs = extern_rows(artifact.manifest)
        page.picture = graph_picture(store.outline(key), artifact.manifest)
        page.svg = graph_svg(page.picture)
    return page


def _artifact_bytes(store, cache, key: str) -> bytes | None:
    found = cache.get(key)
    if found is None:
        found = store.get_artifact(key)  # digest checked; CorruptArtifact is the route's to answer
        if found is not None:
            cache.put(key, *found)
    return found[0] if found else None


_PARSED: OrderedDict[str, Artifact] = OrderedDict()
_PARSED_LOCK = threading.Lock()  # pages render in the server's thread pool
PARSED_KEPT = 8


def parsed(key: str, blob: bytes) -> Artifact:
    """Artifacts are immutable and keyed by content: one parsed once serves every later view of it."""
    with _PARSED_LOCK:
        artifact = _PARSED.get(key)
        if artifact is not None:
            _PARSED.move_to_end(key)
            return artifact
    artifact = Artifact.from_bytes(blob)
    with _PARSED_LOCK:
        _PARSED[key] = artifact
        while len(_PARSED) > PARSED_KEPT:
            _PARSED.popitem(last=False)
    return artifact


def graph_picture(outline_json: str | None, manifest: dict[str, Any]) -> picture.Picture:
    if outline_json:
        return picture.from_outline(json.loads(outline_json), manifest)
    return picture.from_plan(manifest)


def stage_timeline(job: dict[str, str], entered: dict[str, float], now: float | None = None) -> list[Stage]:
    """Queued, then each stage the latest run entered, until it finished (or now, while it runs)."""
    number = lambda name: float(job[name]) if job.get(name) else None  # noqa: E731
    submitted, started, finished = number("submitted_at"), number("started_at"), number("finished_at")
    stages: list[Stage] = []
    if submitted and started:
        stages.append(Stage("queued", "waiting for a worker", submitted, started - submitted))
    if not started:
        return stages
    marks = sorted([("starting", started)] + [(n, t) for n, t in entered.items() if t >= started and n != "starting"],
                   key=lambda mark: mark[1])
    end = finished if finished and finished >= started else None
    for (name, at), nxt in zip(marks, [m[1] for m in marks[1:]] + [end]):
        ongoing = nxt is None and job.get("state") == "running"
        seconds = (now or time.time()) - at if ongoing else (nxt - at if nxt is not None else None)
        stages.append(Stage(name, STAGE_MEANING.get(name, ""), at, seconds))
    return stages


def kernel_kind(kernel: dict[str, Any]) -> str:
    config = kernel["config"]
    if config.get("tiled"):
        return "2D-tiled pointwise"
    if kernel["rnumel"] > 1:
        return "persistent reduction" if config.get("persistent") else "looped reduction"
    return "pointwise"


def kernel_rows(artifact: Artifact) -> list[dict[str, Any]]:
    """One row per kernel: what it holds, how it launches, how that was decided, its source."""
    colours = kernel_colours([k["name"] for k in artifact.manifest["kernels"]])
    launches = {s["kernel"]: s for s in artifact.manifest["plan"]["steps"] if s["op"] == "kernel"}
    rows = []
    for kernel in artifact.manifest["kernels"]:
        tuning = kernel.get("autotune")
        rows.append({
            "name": kernel["name"], "colour": colours[kernel["name"]], "kind": kernel_kind(kernel),
            "shape": f"{kernel['numel']}" + (f" x {kernel['rnumel']}" if kernel["rnumel"] > 1 else ""),
            "config": kernel["config"], "grid": launches.get(kernel["name"], {}).get("grid"),
            "nodes": kernel["nodes"], "origins": kernel["origins"], "cubin": kernel.get("cubin"),
            "trials": _trials(tuning) if tuning else [], "chosen": tuning["chosen"] if tuning else None,
            "cached": bool(tuning and tuning.get("cached")),
            "source": _source(artifact, kernel),
        })
    return rows


def _trials(tuning: dict[str, Any]) -> list[dict[str, Any]]:
    candidates = tuning.get("candidates") or [{} for _ in tuning["ms"]]
    return [{"config": config, "ms": ms, "chosen": i == tuning["chosen"]}
            for i, (config, ms) in enumerate(zip(candidates, tuning["ms"]))]


def _source(artifact: Artifact, kernel: dict[str, Any]) -> str:
    try:
        return artifact.kernel_source(kernel)
    except (KeyError, UnicodeDecodeError):
        return ""


def extern_rows(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"step": i, "target": s["target"], "outputs": s["outputs"],
             "shapes": [layout.get("size") for layout in s.get("layouts", [])]}
            for i, s in enumerate(manifest["plan"]["steps"]) if s["op"] == "extern"]
