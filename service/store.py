"""The Redis store: artifacts, jobs, graphs, counters, worker heartbeats.

Layout (every key under the configured prefix, default `fw:`):

    artifact:{key}          the artifact bundle, written once (MSETNX with its digest)
    artifact:{key}:digest   sha256 hex of the bundle, written in the same MSETNX
    job:{key}               hash: state, stage, progress, error, attempts, timings, ...
    graph:{key}             the submitted graph (canonical JSON) until it is compiled
    rate:{team}:{minute}    submissions of a team in one minute (fixed window)
    budget:{team}:{hour}    compile seconds the team's finished jobs took in one hour (fixed window)
    jobs:active             zset key -> submit time, of queued and running jobs
    queues                  set of the Celery queues jobs were sent to
    workers                 zset hostname -> last heartbeat; worker:{hostname} its info
    tune:{kernel key}       autotuning result of one kernel (chosen candidate, timings), written once
    stats:compiles          compiles started, all time
    stats:compile_seconds:{outcome}   hash: histogram buckets, count, sum
    -- read by the dashboard (service/dashboard, docs/DASHBOARD.md):
    jobs:recent             zset key -> finish time of the last RECENT_JOBS finished jobs
    stages:{key}            hash stage -> time the running job entered it (its attempt's timeline)
    outline:{key}           the submitted graph's outline (names, ops, edges); kept with the artifact
    stats:traffic:{minute|hour}:{n}   hash: cache hits/misses by route, bytes served, per window
    stats:team_compile_s:{hour}       hash team -> compile seconds of its jobs that finished in that hour

Every state change of a job is one Lua script, so concurrent API processes and
workers never see or make a half-changed job. Both the API (from its thread pool) and
the workers use this one synchronous class.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass
from typing import Any

import redis

JOB_STATES = ("queued", "running", "ready", "failed")
COMPILE_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 900, 1800)
RECENT_JOBS = 1000  # finished jobs jobs:recent remembers
HISTORY_TTL_S = 8 * 24 * 3600  # per-hour history (traffic, compile seconds by team)
TRAFFIC_WINDOWS = {"minute": (60, 2 * 3600), "hour": (3600, HISTORY_TTL_S)}  # bucket seconds, kept for


class CorruptArtifact(RuntimeError):
    """Stored bytes whose sha256 is not the digest stored with them."""


def sha256_hex(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


@dataclass(frozen=True)
class Claim:
    """What a submission found: 'ready', 'queued'/'running' (joined a job), or 'new' (must enqueue)."""

    state: str
    attempt: int = 0


@dataclass(frozen=True)
class Begin:
    """What a task delivery should do: 'run' (with the job's inputs) or skip for `reason`."""

    action: str
    graph: str = ""
    target: str = ""
    options: str = ""
    delivery: int = 0


# KEYS: artifact, job, graph, active, queues, artifact digest
# ARGV: now, stale_s, graph_json, team, target, options_json, queue, ttl, key
_CLAIM = """
if redis.call('EXISTS', KEYS[1]) == 1 then return {'ready', '0'} end
local state = redis.call('HGET', KEYS[2], 'state')
if state == 'queued' or state == 'running' then
  local updated = tonumber(redis.call('HGET', KEYS[2], 'updated_at') or '0')
  if tonumber(ARGV[1]) - updated < tonumber(ARGV[2]) then
    return {state, redis.call('HGET', KEYS[2], 'attempts') or '0'}
  end
end
local attempt = redis.call('HINCRBY', KEYS[2], 'attempts', 1)
redis.call('DEL', KEYS[6])  -- a digest without its artifact (evicted?) would block the new MSETNX
redis.call('HDEL', KEYS[2], 'error', 'started_at', 'finished_at', 'compile_s', 'worker', 'deliveries', 'digest', 'size')
redis.call('HSET', KEYS[2], 'state', 'queued', 'stage', 'queued', 'progress', '0', 'team', ARGV[4],
           'target', ARGV[5], 'options', ARGV[6], 'queue', ARGV[7], 'submitted_at', ARGV[1], 'updated_at', ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[8])
redis.call('SET', KEYS[3], ARGV[3], 'EX', ARGV[8])
redis.call('ZADD', KEYS[4], ARGV[1], ARGV[9])
redis.call('SADD', KEYS[5], ARGV[7])
return {'new', tostring(attempt)}
"""

# KEYS: artifact, job, graph, active, compiles
# ARGV: attempt, now, worker, max_deliveries, key
_BEGIN = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  if redis.call('HGET', KEYS[2], 'state') ~= 'ready' then
    redis.call('HSET', KEYS[2], 'state', 'ready', 'stage', 'done', 'progress', '1', 'updated_at', ARGV[2])
  end
  redis.call('ZREM', KEYS[4], ARGV[5])
  return {'already-ready'}
end
local attempts = tonumber(redis.call('HGET', KEYS[2], 'attempts') or '0')
if tonumber(ARGV[1]) < attempts then return {'superseded'} end
if redis.call('HGET', KEYS[2], 'state') == 'failed' then return {'already-failed'} end
local graph = redis.call('GET', KEYS[3])
if not graph then
  redis.call('HSET', KEYS[2], 'state', 'failed', 'stage', 'failed', 'updated_at', ARGV[2], 'finished_at', ARGV[2],
             'error', 'the submitted graph is no longer stored (expired?); submit it again')
  redis.call('ZREM', KEYS[4], ARGV[5])
  return {'graph-missing'}
end
local delivery = redis.call('HINCRBY', KEYS[2], 'deliveries', 1)
if delivery > tonumber(ARGV[4]) then
  redis.call('HSET', KEYS[2], 'state', 'failed', 'stage', 'failed', 'updated_at', ARGV[2], 'finished_at', ARGV[2],
             'error', 'a worker died ' .. (delivery - 1) .. ' times while compiling this graph ' ..
             '(killed, out of memory or crashed); not retried again until it is submitted again')
  redis.call('ZREM', KEYS[4], ARGV[5])
  return {'poisoned'}
end
redis.call('HINCRBY', KEYS[2], 'compiles', 1)
redis.call('INCR', KEYS[5])
redis.call('HSET', KEYS[2], 'state', 'running', 'stage', 'starting', 'progress', '0',
           'started_at', ARGV[2], 'updated_at', ARGV[2], 'worker', ARGV[3])
return {'run', graph, redis.call('HGET', KEYS[2], 'target') or 'cpu',
        redis.call('HGET', KEYS[2], 'options') or '{}', tostring(delivery)}
"""

# KEYS: job, graph, active; ARGV: state, now, key, ttl, then field/value pairs
_FINISH = """
local fields = {'state', ARGV[1], 'stage', ARGV[1] == 'ready' and 'done' or 'failed',
                'updated_at', ARGV[2], 'finished_at', ARGV[2]}
for i = 5, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(fields))
if ARGV[1] == 'ready' then redis.call('DEL', KEYS[2]) end
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('ZREM', KEYS[3], ARGV[3])
return 1
"""

# KEYS: job, stages; ARGV: stage, progress, now. Only a running job moves; entering a stage is timed.
_PROGRESS = """
if redis.call('HGET', KEYS[1], 'state') ~= 'running' then return 0 end
if redis.call('HGET', KEYS[1], 'stage') ~= ARGV[1] then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
  local ttl = redis.call('PTTL', KEYS[1])
  redis.call('PEXPIRE', KEYS[2], ttl > 0 and ttl or 604800000)
end
redis.call('HSET', KEYS[1], 'stage', ARGV[1], 'progress', ARGV[2], 'updated_at', ARGV[3])
return 1
"""


class Store:
    """Typed operations on fusewire's Redis keys; `prefix` namespaces all of them."""

    def __init__(self, client: redis.Redis, prefix: str = "fw:") -> None:
        self.redis = client
        self.prefix = prefix
        self._claim = client.register_script(_CLAIM)
        self._begin = client.register_script(_BEGIN)
        self._finish = client.register_script(_FINISH)
        self._progress = client.register_script(_PROGRESS)

    @classmethod
    def from_url(cls, url: str, prefix: str = "fw:", **kwargs: Any) -> "Store":
        options = {"socket_timeout": 10, "socket_connect_timeout": 5, "health_check_interval": 30} | kwargs
        return cls(redis.Redis.from_url(url, **options), prefix)

    @classmethod
    def from_settings(cls, settings) -> "Store":
        return cls.from_url(settings.redis_url, settings.key_prefix)

    def k(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    # -- health ------------------------------------------------------------------

    def ping(self) -> bool:
        return bool(self.redis.ping())

    # -- artifacts ---------------------------------------------------------------

    def put_artifact(self, key: str, blob: bytes, digest: str) -> bool:
        """Stores a bundle once; checks its digest first. False if one was already stored."""
        if sha256_hex(blob) != digest:
            raise CorruptArtifact(f"artifact for {key} does not match its digest {digest}; not stored")
        return bool(self.redis.msetnx({self.k("artifact", key): blob, self.k("artifact", key, "digest"): digest}))

    def get_artifact(self, key: str) -> tuple[bytes, str] | None:
        """(bundle, digest) after checking the digest, or None when absent."""
        blob, digest = self.redis.mget(self.k("artifact", key), self.k("artifact", key, "digest"))
        if blob is None:
            return None
        digest = (digest or b"").decode()
        if sha256_hex(blob) != digest:
            raise CorruptArtifact(f"stored artifact {key} fails its digest check (stored digest {digest or 'missing'})")
        return blob, digest

    def get_tuning(self, key: str) -> dict | None:
        raw = self.redis.get(self.k("tune", key))
        return json.loads(raw) if raw else None

    def put_tuning(self, key: str, value: dict) -> None:
        """The first worker to time a kernel decides for everyone (SET NX)."""
        self.redis.set(self.k("tune", key), json.dumps(value), nx=True)

    def artifact_size(self, key: str) -> int:
        """Bytes of a stored bundle; 0 when absent."""
        return int(self.redis.strlen(self.k("artifact", key)))

    def artifact_digest(self, key: str) -> str | None:
        """The digest stored with a bundle (not checked against it: get_artifact does that); None when absent."""
        digest = self.redis.get(self.k("artifact", key, "digest"))
        return digest.decode() if digest is not None else None

    def has_artifact(self, key: str) -> bool:
        return bool(self.redis.exists(self.k("artifact", key)))

    # -- submission --------------------------------------------------------------

    def claim(self, key: str, graph_json: str, *, team: str, target: str, options_json: str,
              queue: str, stale_s: float, ttl_s: int) -> Claim:
        """One atomic step: hit, join the running job, or create a new one (then enqueue it)."""
        state, attempt = self._claim(
            keys=[self.k("artifact", key), self.k("job", key), self.k("graph", key), self.k("jobs", "active"),
                  self.k("queues"), self.k("artifact", key, "digest")],
            args=[time.time(), stale_s, graph_json, team, target, options_json, queue, int(ttl_s), key],
        )
        return Claim(state.decode(), int(attempt))

    def hit_rate_limit(self, team: str, limit: int, window_s: int = 60) -> float:
        """Counts one submission; returns 0 if within `limit`, else seconds until the window resets."""
        if limit <= 0:
            return 0.0
        now = time.time()
        window = int(now // window_s)
        counter = self.k("rate", team, str(window))
        pipe = self.redis.pipeline(transaction=False)
        pipe.incr(counter)
        pipe.expire(counter, window_s * 2)
        count, _ = pipe.execute()
        if count <= limit:
            return 0.0
        return max(1.0, math.ceil((window + 1) * window_s - now))

    def charge_compile_seconds(self, key: str, seconds: float, window_s: int = 3600) -> str | None:
        """Adds a finished compile's seconds to the budget window of the team that started it; returns the team."""
        team = self.redis.hget(self.k("job", key), "team")
        if not team or seconds <= 0:
            return None
        counter = self.k("budget", team.decode(), str(int(time.time() // window_s)))
        pipe = self.redis.pipeline(transaction=False)
        pipe.incrbyfloat(counter, seconds)
        pipe.expire(counter, window_s * 2)
        history = self.k("stats", "team_compile_s", str(int(time.time() // 3600)))  # the dashboard's history
        pipe.hincrbyfloat(history, team.decode(), seconds)
        pipe.expire(history, HISTORY_TTL_S)
        pipe.execute()
        return team.decode()

    def over_compile_budget(self, team: str, budget_s: float, window_s: int = 3600) -> float:
        """0 while `team` has used less than `budget_s` compile seconds in this window, else the
        seconds until the window resets. A budget <= 0 means none."""
        if budget_s <= 0:
            return 0.0
        now = time.time()
        window = int(now // window_s)
        used = float(self.redis.get(self.k("budget", team, str(window))) or 0)
        if used < budget_s:
            return 0.0
        return max(1.0, math.ceil((window + 1) * window_s - now))

    # -- jobs --------------------------------------------------------------------

    def job(self, key: str) -> dict[str, str] | None:
        raw = self.redis.hgetall(self.k("job", key))
        if not raw:
            return None
        return {k.decode(): v.decode() for k, v in raw.items()}

    def begin(self, key: str, attempt: int, worker: str, max_deliveries: int) -> Begin:
        result = self._begin(
            keys=[self.k("artifact", key), self.k("job", key), self.k("graph", key), self.k("jobs", "active"),
                  self.k("stats", "compiles")],
            args=[attempt, time.time(), worker, max_deliveries, key],
        )
        action = result[0].decode()
        if action in ("graph-missing", "poisoned"):  # the script recorded it failed
            self.remember_finished(key, "failed")
        if action != "run":
            return Begin(action)
        graph, target, options, delivery = (item.decode() for item in result[1:])
        return Begin(action, graph, target, options, int(delivery))

    def progress(self, key: str, stage: str, fraction: float) -> None:
        self._progress(keys=[self.k("job", key), self.k("stages", key)], args=[stage, f"{fraction:.3f}", time.time()])

    def finish(self, key: str, state: str, ttl_s: int, compile_s: float | None = None, **fields: Any) -> None:
        """Marks a job ready or failed (with `error=`), drops its graph when ready, records its duration."""
        assert state in ("ready", "failed")
        pairs: list[Any] = []
        if compile_s is not None:
            pairs += ["compile_s", f"{compile_s:.3f}"]
        for name, value in fields.items():
            pairs += [name, str(value)]
        self._finish(keys=[self.k("job", key), self.k("graph", key), self.k("jobs", "active")],
                     args=[state, time.time(), key, int(ttl_s), *pairs])
        self.remember_finished(key, state, ttl_s)
        if compile_s is not None:
            self.observe_compile(compile_s, state)

    def observe_compile(self, seconds: float, outcome: str) -> None:
        hist = self.k("stats", "compile_seconds", outcome)
        pipe = self.redis.pipeline(transaction=False)
        for bound in COMPILE_BUCKETS:
            if seconds <= bound:
                pipe.hincrby(hist, f"le:{bound}", 1)
        pipe.hincrby(hist, "count", 1)
        pipe.hincrbyfloat(hist, "sum", seconds)
        pipe.execute()

    def compile_histogram(self, outcome: str) -> tuple[list[tuple[str, int]], int, float]:
        """Cumulative buckets [(le, count)], count, sum of compile durations with `outcome`."""
        raw = {k.decode(): v.decode() for k, v in self.redis.hgetall(self.k("stats", "compile_seconds", outcome)).items()}
        count = int(raw.get("count", 0))
        buckets = [(str(float(b)), int(raw.get(f"le:{b}", 0))) for b in COMPILE_BUCKETS] + [("+Inf", count)]
        return buckets, count, float(raw.get("sum", 0.0))

    def compiles_started(self) -> int:
        return int(self.redis.get(self.k("stats", "compiles")) or 0)

    def active_jobs(self) -> int:
        return int(self.redis.zcard(self.k("jobs", "active")))

    def queue_depths(self) -> dict[str, int]:
        """Messages waiting in each Celery queue jobs were sent to (kombu lists share our prefix)."""
        queues = sorted(q.decode() for q in self.redis.smembers(self.k("queues")))
        if not queues:
            return {}
        pipe = self.redis.pipeline(transaction=False)
        for queue in queues:
            pipe.llen(self.prefix + queue)
        return dict(zip(queues, pipe.execute()))

    # -- workers -----------------------------------------------------------------

    def heartbeat(self, hostname: str, info: dict[str, Any], ttl_s: float) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.zadd(self.k("workers"), {hostname: time.time()})
        pipe.set(self.k("worker", hostname), json.dumps(info), ex=max(1, math.ceil(ttl_s)))
        pipe.execute()

    def forget_worker(self, hostname: str) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.zrem(self.k("workers"), hostname)
        pipe.delete(self.k("worker", hostname))
        pipe.execute()

    def live_workers(self, ttl_s: float) -> list[dict[str, Any]]:
        """Workers whose heartbeat is younger than `ttl_s`, with what they reported."""
        now = time.time()
        self.redis.zremrangebyscore(self.k("workers"), "-inf", now - 10 * ttl_s)
        seen = self.redis.zrangebyscore(self.k("workers"), now - ttl_s, "+inf", withscores=True)
        if not seen:
            return []
        infos = self.redis.mget([self.k("worker", name.decode()) for name, _ in seen])
        workers = []
        for (name, at), info in zip(seen, infos):
            entry = json.loads(info) if info else {}
            entry.update(hostname=name.decode(), seen_s_ago=round(now - at, 1))
            workers.append(entry)
        return workers

    # -- dashboard history (service/dashboard reads it; docs/DASHBOARD.md) ------------

    def remember_finished(self, key: str, state: str, ttl_s: int | None = None) -> None:
        """Adds a finished job to jobs:recent (capped); its stage timeline lives as long as its record,
        and a ready job's graph outline as long as its artifact."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.zadd(self.k("jobs", "recent"), {key: time.time()})
        pipe.zremrangebyrank(self.k("jobs", "recent"), 0, -RECENT_JOBS - 1)
        if ttl_s is not None:
            pipe.expire(self.k("stages", key), int(ttl_s))
        if state == "ready":
            pipe.persist(self.k("outline", key))
        pipe.execute()

    def put_outline(self, key: str, outline_json: str, ttl_s: int) -> None:
        """The submitted graph's outline, for the dashboard's picture; kept for good once the job is ready."""
        self.redis.set(self.k("outline", key), outline_json, ex=int(ttl_s))

    def outline(self, key: str) -> str | None:
        raw = self.redis.get(self.k("outline", key))
        return raw.decode() if raw is not None else None

    def stage_times(self, key: str) -> dict[str, float]:
        """stage -> when the job's latest run entered it (older attempts' stages may remain: compare started_at)."""
        return {k.decode(): float(v) for k, v in self.redis.hgetall(self.k("stages", key)).items()}

    def recent_job_keys(self, limit: int) -> list[tuple[str, float]]:
        """The last `limit` finished jobs, newest first, with their finish times."""
        rows = self.redis.zrevrange(self.k("jobs", "recent"), 0, limit - 1, withscores=True)
        return [(key.decode(), at) for key, at in rows]

    def active_job_keys(self, limit: int) -> list[tuple[str, float]]:
        """Queued and running jobs, oldest submission first, with their submit times."""
        rows = self.redis.zrange(self.k("jobs", "active"), 0, limit - 1, withscores=True)
        return [(key.decode(), at) for key, at in rows]

    def jobs(self, keys: list[str]) -> list[dict[str, str] | None]:
        """Many job records in one round trip; None where a record expired."""
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:
            pipe.hgetall(self.k("job", key))
        return [{k.decode(): v.decode() for k, v in raw.items()} or None for raw in pipe.execute()]

    def count_traffic(self, via: str, hit: bool, nbytes: int = 0) -> None:
        """Counts one cache lookup (`via` submit, probe or fetch) and the bytes served, per minute and hour."""
        now = time.time()
        pipe = self.redis.pipeline(transaction=False)
        for window, (span, keep) in TRAFFIC_WINDOWS.items():
            bucket = self.k("stats", "traffic", window, str(int(now // span)))
            pipe.hincrby(bucket, f"{'hit' if hit else 'miss'}:{via}", 1)
            if nbytes:
                pipe.hincrby(bucket, "bytes", nbytes)
            pipe.expire(bucket, keep)
        pipe.execute()

    def traffic(self, window: str, buckets: int) -> list[tuple[float, dict[str, int]]]:
        """The last `buckets` windows ('minute' or 'hour'), oldest first: (window start, counters)."""
        span, _ = TRAFFIC_WINDOWS[window]
        last = int(time.time() // span)
        starts = range(last - buckets + 1, last + 1)
        pipe = self.redis.pipeline(transaction=False)
        for n in starts:
            pipe.hgetall(self.k("stats", "traffic", window, str(n)))
        return [(n * span, {k.decode(): int(v) for k, v in raw.items()}) for n, raw in zip(starts, pipe.execute())]

    def team_compile_seconds(self, hours: int) -> list[tuple[float, dict[str, float]]]:
        """Compile seconds per team in each of the last `hours` hours, oldest first."""
        last = int(time.time() // 3600)
        starts = range(last - hours + 1, last + 1)
        pipe = self.redis.pipeline(transaction=False)
        for n in starts:
            pipe.hgetall(self.k("stats", "team_compile_s", str(n)))
        return [(n * 3600.0, {k.decode(): float(v) for k, v in raw.items()}) for n, raw in zip(starts, pipe.execute())]
