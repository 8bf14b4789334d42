"""What the overview shows, read from the store in a handful of pipelines.

Workers and queues (heartbeats, queue depths), jobs by team and state (queued and running
from `jobs:active`, finished ones from the capped `jobs:recent`), the cache hit rate and
artifacts and bytes served (`stats:traffic:*`, per minute for the last hour and per hour for
the last day), and compile seconds by team per hour (`stats:team_compile_s:*`).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from service.dashboard.svg import bar_chart

ACTIVE_SHOWN = 200
RECENT_READ = 500  # finished jobs the per-team counts cover
LISTED = 25  # failed and ready jobs listed
TEAM_COLOURS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")


@dataclass
class JobRow:
    key: str
    state: str
    team: str
    target: str
    stage: str
    progress: float
    error: str
    attempts: int
    worker: str
    submitted_at: float | None
    started_at: float | None
    finished_at: float | None
    compile_s: float | None
    size: int | None


@dataclass
class Overview:
    workers: list[dict[str, Any]]
    queues: dict[str, int]
    active: list[JobRow]
    failed: list[JobRow]
    ready: list[JobRow]
    teams: dict[str, dict[str, int]]
    finished_read: int
    traffic: dict[str, Any]
    compile: dict[str, Any]
    charts: dict[str, str] = field(default_factory=dict)
    team_colours: dict[str, str] = field(default_factory=dict)


def gather(store, settings) -> Overview:
    active = _rows(store, [k for k, _ in store.active_job_keys(ACTIVE_SHOWN)])
    recent_keys = [k for k, _ in store.recent_job_keys(RECENT_READ)]
    finished = [row for row in _rows(store, recent_keys) if row.state in ("ready", "failed")]
    minutes, hours, per_team = store.traffic("minute", 60), store.traffic("hour", 24), store.team_compile_seconds(24)
    teams = sorted({team for _, counts in per_team for team in counts})
    colours = {team: TEAM_COLOURS[i % len(TEAM_COLOURS)] for i, team in enumerate(teams)}
    return Overview(
        workers=store.live_workers(settings.heartbeat_ttl_s), queues=store.queue_depths(), active=active,
        failed=[r for r in finished if r.state == "failed"][:LISTED],
        ready=[r for r in finished if r.state == "ready"][:LISTED],
        teams=_by_team(active + finished), finished_read=len(recent_keys),
        traffic=traffic_summary(hours), compile=compile_summary(store, per_team),
        charts=charts(minutes, hours, per_team, colours), team_colours=colours)


def _rows(store, keys: list[str]) -> list[JobRow]:
    return [job_row(key, job) for key, job in zip(keys, store.jobs(keys)) if job is not None]


def job_row(key: str, job: dict[str, str]) -> JobRow:
    number = lambda name: float(job[name]) if job.get(name) else None  # noqa: E731
    return JobRow(key=key, state=job.get("state", "queued"), team=job.get("team", "?"), target=job.get("target", ""),
                  stage=job.get("stage", ""), progress=float(job.get("progress") or 0), error=job.get("error", ""),
                  attempts=int(job.get("attempts") or 0), worker=job.get("worker", ""),
                  submitted_at=number("submitted_at"), started_at=number("started_at"),
                  finished_at=number("finished_at"), compile_s=number("compile_s"),
                  size=int(job["size"]) if job.get("size") else None)


def _by_team(rows: list[JobRow]) -> dict[str, dict[str, int]]:
    teams: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(("queued", "running", "ready", "failed"), 0))
    for row in rows:
        if row.state in teams[row.team]:
            teams[row.team][row.state] += 1
    return dict(sorted(teams.items()))


def traffic_summary(buckets: list[tuple[float, dict[str, int]]]) -> dict[str, Any]:
    """Totals over `buckets`, and the hit rate: hits (a probe or a submission that found the artifact)
    over hits plus submissions that had to compile. A fusewire client probes (HEAD) before it
    submits, so a probe miss is counted once, by the submission that follows it."""
    total: dict[str, int] = defaultdict(int)
    for _, counts in buckets:
        for name, n in counts.items():
            total[name] += n
    hits = total["hit:probe"] + total["hit:submit"]
    lookups = hits + total["miss:submit"]
    by_via = {via: {"hits": total[f"hit:{via}"], "misses": total[f"miss:{via}"],
                    "rate": _rate(total[f"hit:{via}"], total[f"miss:{via}"])} for via in ("probe", "submit", "fetch")}
    return {"hit_rate": hits / lookups if lookups else None, "hits": hits, "compiles_needed": total["miss:submit"],
            "artifacts": total["hit:fetch"], "bytes": total["bytes"], "by_via": by_via}


def _rate(hits: int, misses: int) -> float | None:
    return hits / (hits + misses) if hits + misses else None


def compile_summary(store, per_team: list[tuple[float, dict[str, float]]]) -> dict[str, Any]:
    outcomes = {}
    for outcome in ("ready", "failed"):
        _, count, seconds = store.compile_histogram(outcome)
        outcomes[outcome] = {"count": count, "seconds": seconds, "mean": seconds / count if count else None}
    by_team: dict[str, float] = defaultdict(float)
    for _, teams in per_team:
        for team, seconds in teams.items():
            by_team[team] += seconds
    return {"started": store.compiles_started(), "outcomes": outcomes, "by_team_24h": dict(sorted(by_team.items()))}


def charts(minutes: list, hours: list, per_team: list, colours: dict[str, str]) -> dict[str, str]:
    """The bar charts: artifacts and bytes per minute (1 h) and per hour (24 h), compile seconds by team per hour."""
    return {
        "artifacts_minute": _counter_chart(minutes, "hit:fetch", "artifacts served", "%H:%M", str),
        "bytes_minute": _counter_chart(minutes, "bytes", "bytes served", "%H:%M", human_bytes),
        "artifacts_hour": _counter_chart(hours, "hit:fetch", "artifacts served", "%H:00", str),
        "bytes_hour": _counter_chart(hours, "bytes", "bytes served", "%H:00", human_bytes),
        "compile_by_team": bar_chart([_clock(at, "%H:00") for at, _ in per_team],
                                     {team: [counts.get(team, 0.0) for _, counts in per_team] for team in colours},
                                     colours, seconds, "compile seconds by team, per hour"),
    }


def _counter_chart(buckets: list[tuple[float, dict[str, int]]], field_name: str, title: str, clock: str, fmt) -> str:
    labels = [_clock(at, clock) for at, _ in buckets]
    return bar_chart(labels, {title: [float(counts.get(field_name, 0)) for _, counts in buckets]},
                     {title: "#4e79a7"}, lambda v: fmt(int(v)), title)


def _clock(at: float, pattern: str) -> str:
    return time.strftime(pattern, time.localtime(at))


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    return f"{value / 60:.1f} min"
