"""Prometheus metrics. Request/hit/miss/byte counters live in the API process (in
multiprocess mode when PROMETHEUS_MULTIPROC_DIR is set, as `fusewire serve --workers N`
does); queue depth, active jobs, live workers and compile durations are read from Redis
at scrape time, since the workers record them there."""

from __future__ import annotations

import logging
import os
import time

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, CounterMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from redis.exceptions import RedisError

log = logging.getLogger("fusewire.api")

REQUESTS = Counter("fusewire_http_requests_total", "HTTP requests", ["method", "route", "status"])
LATENCY = Histogram("fusewire_http_request_seconds", "HTTP request latency", ["route"],
                    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10))
HITS = Counter("fusewire_cache_hits_total", "artifact found: a submission answered 'ready', or an artifact served", ["via"])
MISSES = Counter("fusewire_cache_misses_total", "artifact absent: a submission that queued/joined a job, or a 404 fetch", ["via"])
ENQUEUED = Counter("fusewire_jobs_enqueued_total", "compile jobs sent to a worker queue", ["queue"])
BYTES_SERVED = Counter("fusewire_artifact_bytes_served_total", "artifact bytes sent in GET /artifacts responses")
CORRUPT = Counter("fusewire_artifact_corrupt_total", "stored artifacts that failed their digest check when read")


def count_lookup(store, via: str, hit: bool, nbytes: int = 0) -> None:
    """The dashboard's history of cache lookups and bytes served (Store.count_traffic), kept in Redis so
    every API process adds to one series. Best effort: a request never fails for it."""
    try:
        store.count_traffic(via, hit, nbytes)
    except RedisError as exc:
        log.warning("could not count a %s lookup for the dashboard: %s", via, exc)


class RedisCollector:
    """Gauges and the compile histogram, read from the store on each scrape."""

    def __init__(self, store, settings) -> None:
        self.store, self.settings = store, settings

    def collect(self):
        depth = GaugeMetricFamily("fusewire_queue_depth", "compile messages waiting per queue", labels=["queue"])
        for queue, n in self.store.queue_depths().items():
            depth.add_metric([queue], n)
        yield depth
        yield GaugeMetricFamily("fusewire_jobs_active", "jobs queued or running", value=self.store.active_jobs())
        yield GaugeMetricFamily("fusewire_workers_alive", "workers with a fresh heartbeat",
                                value=len(self.store.live_workers(self.settings.heartbeat_ttl_s)))
        yield CounterMetricFamily("fusewire_compiles", "compiles started by workers", value=self.store.compiles_started())
        hist = HistogramMetricFamily("fusewire_compile_seconds", "compile durations by outcome", labels=["outcome"])
        for outcome in ("ready", "failed"):
            buckets, _, total = self.store.compile_histogram(outcome)
            hist.add_metric([outcome], buckets, total)
        yield hist


def exposition(redis_registry: CollectorRegistry) -> bytes:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        local = CollectorRegistry()
        MultiProcessCollector(local)
        text = generate_latest(local)
    else:
        from prometheus_client import REGISTRY
        text = generate_latest(REGISTRY)
    return text + generate_latest(redis_registry)


class MetricsMiddleware:
    """Pure ASGI middleware: counts and times every HTTP request by route template."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = {"code": 500}

        async def send_wrapper(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            REQUESTS.labels(scope["method"], route, str(status["code"])).inc()
            LATENCY.labels(route).observe(time.perf_counter() - start)
