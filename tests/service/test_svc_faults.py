"""Fault tests against the real stack: a redis-server with AOF on (its own, on a free port), real
Celery worker processes and the real API as uvicorn processes, all in this test's tmp folder.
Nothing is mocked. docs/RELIABILITY.md ("Fault tests") lists what each one does and measured.

- Redis SIGKILLed and restarted from its AOF (same port) while the API and a worker run on.
- Redis down: every route answers as documented (503 + Retry-After, /healthz 200, /readyz 503),
  the HTTP client gives up after its bounded retries, the torch.compile backend falls back to
  eager (or raises); Redis back, everything recovers without a restart.
- The API SIGKILLed mid-upload of a large POST /compile, and mid-request while it waits on Redis.
- A SIGSTOPped worker holding a job: another worker finishes it; the stopped one's late result
  changes nothing.
- A late delivery that finds the key already stored records the stored artifact, not its own.

(A worker SIGKILLed mid-compile: tests/service/test_svc_reliability.py.)

Every test ends by reading Redis directly (`store_problems`): no bundle without its matching
digest, no digest without its bundle, every job ready (with its artifact) or failed with a reason.
"""

from __future__ import annotations

import base64
import hashlib
import threading
import time
import warnings
from array import array

import httpx
import pytest
import redis

from client.http import FusewireClient, ServiceError
from client_helpers import TOKEN, ApiServer
from service.store import Store
from svc_helpers import AUTH, RedisServer, Worker, make_graph, store_problems, wait_for, wait_job
from worker.tasks import TEST_DELAY_ENV

PREFIX = "fwfault:"
# Short, so that an unacknowledged message is redelivered within a test (a compile held longer than the
# visibility timeout is redelivered as well; Store.begin makes that duplicate a no-op). job_stale_s stays
# hard + visibility + 60 = 123 s: no test relies on a job going stale.
FAST = {"visibility_timeout_s": 3.0, "unacked_restore_interval_s": 0.5, "heartbeat_interval_s": 0.5,
        "heartbeat_ttl_s": 3.0, "soft_time_limit_s": 50.0, "hard_time_limit_s": 60.0, "infra_retries": 3}


class Stack:
    """One test's Redis (AOF, fsync always), workers and API processes, stopped by the fixture."""

    def __init__(self, tmp, settings, **overrides) -> None:
        self.tmp = tmp
        self.redis = RedisServer(tmp / "redis", aof=True)
        # copied from the session settings: tokens, signing key and whatever else it carries reach our processes
        self.settings = settings.model_copy(update={**FAST, **overrides, "redis_url": self.redis.url,
                                                    "key_prefix": PREFIX})
        self.store = Store.from_url(self.settings.redis_url, PREFIX, socket_timeout=5)
        self.workers: list[Worker] = []
        self.apis: list[ApiServer] = []

    def worker(self, name: str, delay_s: float = 0) -> Worker:
        extra = {TEST_DELAY_ENV: str(delay_s)} if delay_s else {}
        worker = Worker(self.settings, self.tmp / f"{name}.log", name, extra)
        self.workers.append(worker)
        return worker.wait_ready(self.store)

    def api(self) -> ApiServer:
        api = ApiServer(self.settings, self.tmp / f"api{len(self.apis)}.log")
        self.apis.append(api)
        return api

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
        for api in self.apis:
            api.stop()
        self.redis.stop()


@pytest.fixture
def make_stack(settings, tmp_path):
    stacks = []

    def make(**overrides) -> Stack:
        stacks.append(Stack(tmp_path, settings, **overrides))
        return stacks[-1]

    yield make
    for stack in stacks:
        stack.close()


def http(api: ApiServer) -> httpx.Client:
    return httpx.Client(base_url=api.url, headers=AUTH, timeout=15)


def submit(client: httpx.Client, graph: dict) -> str:
    response = client.post("/compile", json={"graph": graph})
    assert response.status_code in (200, 202), response.text
    return response.json()["key"]


def wait_state(client: httpx.Client, key: str, state: str, timeout: float = 60) -> dict:
    """Waits until the job is `state` (or finished) and asserts it is `state`."""
    job = wait_job(client, key, timeout, states=(state, "ready", "failed"))
    assert job["state"] == state, job
    return job


def assert_artifact(store: Store, key: str) -> bytes:
    """The artifact is stored whole: bundle and digest, sha256 checks, its manifest names `key`."""
    from compiler.artifact import Artifact

    found = store.get_artifact(key)  # raises CorruptArtifact on a digest mismatch
    assert found is not None, f"no artifact for {key[:12]}"
    blob, digest = found
    assert Artifact.from_bytes(blob).manifest["key"] == key
    job = store.job(key)
    assert job["state"] == "ready", job
    assert job.get("digest", digest) == digest and int(job.get("size", len(blob))) == len(blob), job
    return blob


def graph_with_constant(rows: int, cols: int = 8) -> dict:
    """x + c -> relu -> sum(dim=1) with c a rows x cols float32 constant: rows * cols * 4 bytes of
    base64 in the body (WIRE.md, Constants)."""
    graph = make_graph(rows, cols)
    graph["inputs"] = graph["inputs"][:1]
    data = array("f", (float(i % 251) - 125.0 for i in range(rows * cols))).tobytes()
    graph["constants"] = [{"name": "c", "dtype": "float32", "shape": [rows, cols],
                           "data": base64.b64encode(data).decode()}]
    graph["nodes"][0]["args"] = [{"ref": "x"}, {"ref": "c"}]
    return graph


# -- 2. Redis restarted ------------------------------------------------------------------


@pytest.mark.timeout(150)
def test_redis_killed_and_restarted_from_aof_loses_nothing_and_everyone_reconnects(make_stack):
    stack = make_stack()
    worker = stack.worker("w", delay_s=3)  # holds each compile 3 s: one is running across the restart
    api = stack.api()
    client = http(api)
    done = submit(client, make_graph(301))
    wait_state(client, done, "ready")
    blob = assert_artifact(stack.store, done)
    running = submit(client, make_graph(302))
    wait_state(client, running, "running")
    queued = submit(client, make_graph(303))  # the worker (one at a time) is busy: it waits in the queue
    before = {key: stack.store.job(key) for key in (done, running, queued)}
    assert before[queued]["state"] == "queued", before[queued]
    worker_pid = worker.process.pid

    stack.redis.kill()
    down = client.get(f"/jobs/{done}")
    assert down.status_code == 503 and down.headers.get("retry-after"), down.text
    time.sleep(1.0)  # the worker notices: its consumer reconnects in a loop, the running compile is cancelled
    stack.redis.start()  # same port, same folder: the AOF is replayed
    restarted = time.monotonic()

    # everything acknowledged before the kill is back, read straight from Redis
    assert stack.store.get_artifact(done)[0] == blob
    assert stack.store.job(done) == before[done]
    assert stack.store.redis.exists(stack.store.k("graph", running), stack.store.k("graph", queued)) == 2
    assert stack.store.job(queued)["submitted_at"] == before[queued]["submitted_at"]
    # the API answers again without a restart (its pooled connections reconnect)
    assert client.get(f"/jobs/{done}").json()["state"] == "ready"
    assert client.get(f"/artifacts/{done}").content == blob
    assert api.process.poll() is None
    # both jobs caught by the restart end by themselves: the running one redelivered, the queued one taken
    for key in (running, queued):
        job = wait_job(client, key, 60)
        assert job["state"] == "ready", job
        assert_artifact(stack.store, key)
    assert int(stack.store.job(running)["deliveries"]) >= 2  # its first delivery was cut off by the restart
    settled_s = time.monotonic() - restarted
    # the same worker process takes new jobs: it reconnected by itself
    fresh = submit(client, make_graph(304))
    job = wait_job(client, fresh, 60)
    assert job["state"] == "ready" and job["worker"].startswith(worker.name), job
    assert worker.alive() and worker.process.pid == worker_pid
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["ready"], ready.text
    assert store_problems(stack.store) == []
    print(f"FAULT redis-restart: both interrupted jobs ready {settled_s:.1f} s after the restart (a 3 s compile "
          f"each); the same worker (pid {worker_pid}) compiled a new job")


# -- 3. Redis down -----------------------------------------------------------------------


def _assert_503(response: httpx.Response, body: bool = True) -> None:
    assert response.status_code == 503, (response.request.method, response.request.url.path, response.text)
    assert int(response.headers["retry-after"]) > 0
    if body:
        data = response.json()
        assert set(data) == {"error", "detail", "where"} and data["error"] == "store_unavailable", data
        assert "Redis" in data["detail"], data


@pytest.mark.timeout(180)
def test_redis_down_answers_503_clients_fall_back_and_all_recover(make_stack, tmp_path):
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from client.backend import FusewireError, FusewireWarning, backend

    stack = make_stack()
    worker = stack.worker("w")
    api = stack.api()
    client = http(api)
    served = submit(client, make_graph(311))  # compiled and fetched once: in the API's memory cache
    unserved = submit(client, make_graph(312))  # compiled, never fetched: only in Redis
    for key in (served, unserved):
        wait_state(client, key, "ready")
    blob = client.get(f"/artifacts/{served}").content
    fw = FusewireClient(api.url, TOKEN)
    gm = make_fx(lambda x, y: [torch.relu(x * y).sum(1)])(torch.randn(5, 6), torch.randn(5, 6))
    inputs = [torch.randn(5, 6), torch.randn(5, 6)]

    stack.redis.kill()
    # every route that needs Redis: 503 store_unavailable, Retry-After, the usual body
    _assert_503(client.post("/compile", json={"graph": make_graph(313)}))
    _assert_503(client.get(f"/jobs/{served}"))
    _assert_503(client.get(f"/artifacts/{unserved}"))
    _assert_503(client.get(f"/artifacts/{'0' * 64}"))  # unknown while Redis is away: not a 404
    _assert_503(client.head(f"/artifacts/{unserved}"), body=False)
    # what does not need Redis still works: the process is alive, verified artifacts in memory are served
    assert client.get("/healthz").status_code == 200
    hit = client.get(f"/artifacts/{served}")
    assert hit.status_code == 200 and hit.content == blob
    # not ready, and says why (no Retry-After: readiness is reported, not retried)
    ready = client.get("/readyz")
    assert ready.status_code == 503 and not ready.json()["redis"] and "Redis unreachable" in ready.json()["problems"][0]
    assert "retry-after" not in ready.headers
    metrics = client.get("/metrics")  # the process's own counters, without the gauges read from Redis
    assert metrics.status_code == 200 and 'status="503"' in metrics.text, metrics.text[:300]
    assert "fusewire_jobs_active" not in metrics.text
    # auth does not need Redis: a missing token is still a 401
    assert httpx.post(api.url + "/compile", json={"graph": make_graph(313)}).status_code == 401

    # the HTTP client retries 503s with Retry-After three times (0.2 + 0.4 + 0.8 s), then raises
    started = time.monotonic()
    with pytest.raises(ServiceError) as info:
        fw.submit(make_graph(313))
    assert info.value.status == 503 and info.value.error == "store_unavailable"
    gave_up_s = time.monotonic() - started
    assert gave_up_s >= 1.4
    with pytest.raises(ServiceError) as info:
        fw.job(served)
    assert info.value.status == 503

    # the torch.compile backend: one warning naming the reason and eager results, or FusewireError
    eager = backend(url=api.url, token=TOKEN, cache_dir=tmp_path / "eager", on_error="eager")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        function = eager.compile_graph(gm, inputs)
        out = function(list(inputs))
    torch.testing.assert_close(out[0], gm(*inputs)[0])
    ours = [str(w.message) for w in caught if issubclass(w.category, FusewireWarning)]
    assert len(ours) == 1 and "runs eagerly" in ours[0] and "503" in ours[0], ours
    assert eager.stats["fallbacks"] == 1
    strict = backend(url=api.url, token=TOKEN, cache_dir=tmp_path / "strict", on_error="raise")
    with pytest.raises(FusewireError, match="503"):
        strict.compile_graph(gm, inputs)

    # Redis back (from its AOF): the same API, worker and clients carry on, nothing restarted
    stack.redis.start()
    back = time.monotonic()
    assert client.get(f"/jobs/{unserved}").json()["state"] == "ready"
    assert client.get(f"/artifacts/{unserved}").status_code == 200
    assert client.head(f"/artifacts/{unserved}").status_code == 200
    assert fw.fetch_bytes(served) == blob
    wait_for(lambda: client.get("/readyz").status_code == 200, 20, "/readyz ready again")
    ready_s = time.monotonic() - back
    assert "fusewire_jobs_active" in client.get("/metrics").text
    artifact = fw.compile(make_graph(313))  # probe, submit, wait, fetch, verify: the same worker compiles it
    assert artifact.manifest["key"] == fw.submit(make_graph(313)).key
    with warnings.catch_warnings():
        warnings.simplefilter("error", FusewireWarning)
        function = strict.compile_graph(gm, inputs)
        torch.testing.assert_close(function(list(inputs))[0], gm(*inputs)[0])
        other = make_fx(lambda x: [torch.relu(x).sum(0)])(torch.randn(7, 3))
        x = torch.randn(7, 3)
        torch.testing.assert_close(eager.compile_graph(other, [x])([x])[0], other(x)[0])  # the same backend recovers
    assert strict.stats["fallbacks"] == 1 and eager.stats["fallbacks"] == 1
    assert worker.alive()
    assert store_problems(stack.store) == []
    print(f"FAULT redis-down: client gave up after {gave_up_s:.1f} s; /readyz ready {ready_s:.1f} s after Redis "
          f"came back; backend: {ours[0]}")


# -- 4. the API killed mid-request -----------------------------------------------------------


class KillMidUpload(httpx.HTTPTransport):
    """Sends the first POST's body in chunks and SIGKILLs the API after the first one, so the API
    dies holding half a request; later requests pass through untouched."""

    def __init__(self, api: ApiServer, chunk: int = 64 * 1024) -> None:
        super().__init__()
        self.api, self.chunk, self.armed, self.body_bytes, self.error = api, chunk, True, 0, None

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if not (self.armed and request.method == "POST"):
            return super().handle_request(request)
        self.armed = False
        body = request.read()
        self.body_bytes = len(body)

        def chunks():
            yield body[:self.chunk]
            time.sleep(0.3)  # the API has the headers and the first chunk: it is reading the body
            self.api.kill()
            for start in range(self.chunk, len(body), self.chunk):
                yield body[start:start + self.chunk]

        try:
            return super().handle_request(httpx.Request(request.method, request.url, headers=request.headers,
                                                        content=chunks()))
        except httpx.TransportError as exc:  # what the request in flight saw (the client then retries)
            self.error = exc
            raise


def _blocked_evalsha(admin: redis.Redis) -> bool:
    return any(c.get("cmd") == "evalsha" and "b" in c.get("flags", "") for c in admin.client_list())


@pytest.mark.timeout(150)
def test_api_killed_mid_request_leaves_nothing_half_written_and_a_restarted_api_serves(make_stack):
    stack = make_stack(rate_limit_per_minute=0)  # no rate counter: the first write of POST /compile is the claim
    worker = stack.worker("w")
    api = stack.api()
    client = http(api)
    store = stack.store
    wait_state(client, submit(client, make_graph(321)), "ready")

    # a. killed while a 1.4 MB POST /compile is being uploaded
    from client.http import local_key

    big = graph_with_constant(32 * 1024)  # 1 MiB of float32 constant, 1.4 MB of base64
    big_key = local_key(big)
    transport = KillMidUpload(api)
    fw = FusewireClient(api.url, TOKEN, http=httpx.Client(base_url=api.url, transport=transport, timeout=15))
    with pytest.raises(ServiceError) as info:
        fw.submit(big)
    assert transport.body_bytes > 1024 * 1024 and api.process.poll() is not None
    assert isinstance(transport.error, (httpx.WriteError, httpx.ReadError, httpx.RemoteProtocolError)), transport.error
    assert info.value.status == 0 and info.value.error == "unreachable", info.value  # after its retries
    assert store.job(big_key) is None and not store.redis.exists(store.k("graph", big_key))
    api.start()  # same port: the same client object carries on
    submission = fw.submit(big)
    assert submission.key == big_key and submission.state == "queued"
    assert fw.wait(big_key, 60)["state"] == "ready"
    assert fw.fetch(big_key).manifest["key"] == big_key  # digest, key and signature check

    # b. killed while it waits on Redis inside POST /compile (writes paused: the claim is in flight)
    admin = redis.Redis.from_url(stack.redis.url)
    graph = make_graph(322)
    key = local_key(graph)
    outcome: dict = {}

    def post():
        try:
            outcome["response"] = client.post("/compile", json={"graph": graph})
        except httpx.TransportError as exc:
            outcome["error"] = exc

    admin.execute_command("CLIENT", "PAUSE", 20_000, "WRITE")
    try:
        thread = threading.Thread(target=post)
        thread.start()
        wait_for(lambda: _blocked_evalsha(admin), 10, "the API's claim to block on paused writes")
        api.kill()
        thread.join(10)
        wait_for(lambda: not _blocked_evalsha(admin), 10, "Redis to drop the dead API's connection")
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
    assert isinstance(outcome.get("error"), httpx.RemoteProtocolError), outcome  # "disconnected without a response"
    assert store.job(key) is None and not store.redis.exists(store.k("graph", key))  # the dead client's claim never ran
    api.start()
    # the paused writes also held back the worker's heartbeat: ready again once its next one lands
    wait_for(lambda: client.get("/readyz").status_code == 200, 15, "the restarted API to report ready")
    job = wait_job(client, submit(client, graph), 60)
    assert job["state"] == "ready" and job["attempts"] == 1, job
    assert_artifact(store, key)
    assert worker.alive()
    assert store_problems(store) == []
    print(f"FAULT api-killed: mid-upload ({transport.body_bytes} bytes): {type(transport.error).__name__}, then "
          f"ServiceError {info.value}; mid-claim: {type(outcome['error']).__name__}; nothing written either time")


# -- 5. a stopped worker -------------------------------------------------------------------


@pytest.mark.timeout(150)
def test_stopped_worker_loses_its_job_to_another_and_its_late_result_changes_nothing(make_stack):
    stack = make_stack()
    stopped = stack.worker("stopped", delay_s=3)
    api = stack.api()
    client = http(api)
    key = submit(client, make_graph(331))
    job = wait_state(client, key, "running")
    assert job["worker"].startswith(stopped.name)

    stopped.pause()  # SIGSTOP, main process and pool child: it holds the message, unacknowledged, and says nothing
    paused_at = time.monotonic()
    rescuer = stack.worker("rescuer")
    job = wait_job(client, key, 60)  # visibility timeout (3 s) -> the rescuer's sweep requeues it -> it compiles
    taken_s = time.monotonic() - paused_at
    assert job["state"] == "ready" and job["worker"].startswith(rescuer.name) and job["deliveries"] == 2, job
    blob = assert_artifact(stack.store, key)
    record = stack.store.job(key)

    stopped.resume()  # SIGCONT: its delay is long over; it compiles, finds the key stored, acks
    wait_for(lambda: "already stored" in stopped.log.read_text(errors="replace"), 30, "the late delivery to finish")
    assert stack.store.get_artifact(key)[0] == blob  # written once: not overwritten, not corrupted
    after = stack.store.job(key)
    assert after["state"] == "ready" and after["digest"] == record["digest"] and after["size"] == record["size"]
    assert after["worker"] == record["worker"] and after["deliveries"] == "2"
    assert FusewireClient(api.url, TOKEN).fetch_bytes(key) == blob  # digest, key and signature check
    assert stopped.alive() and rescuer.alive()
    assert store_problems(stack.store) == []
    print(f"FAULT sigstop-worker: job ready on the rescuer {taken_s:.1f} s after SIGSTOP (rescuer start included)")


@pytest.mark.timeout(120)
def test_late_delivery_records_the_stored_artifact_not_its_own(make_stack):
    """Two deliveries of one job can produce different bytes (on a GPU, benchmark timings are in the
    manifest). The first MSETNX wins; the late one must leave the job describing the stored bundle."""
    import compiler
    from compiler.artifact import Artifact
    from compiler.graph import parse_graph

    graph = make_graph(341)
    artifact = compiler.compile(parse_graph(graph), "cpu")  # what the worker will build, plus one manifest field
    artifact.manifest["note"] = "built by another delivery"
    other = artifact.to_bytes()
    digest = hashlib.sha256(other).hexdigest()

    stack = make_stack()
    worker = stack.worker("w", delay_s=2)
    api = stack.api()
    client = http(api)
    key = submit(client, graph)
    assert key == artifact.manifest["key"]
    wait_state(client, key, "running")
    assert stack.store.put_artifact(key, other, digest)  # meanwhile another delivery stores its bundle first
    wait_for(lambda: "already stored" in worker.log.read_text(errors="replace"), 30, "the late delivery to finish")
    job = wait_job(client, key, 10)
    assert job["state"] == "ready" and job["digest"] == digest and job["size"] == len(other), job
    assert stack.store.get_artifact(key) == (other, digest)
    assert Artifact.from_bytes(other).manifest["key"] == key
    assert store_problems(stack.store) == []


def test_a_full_redis_is_503_store_full_not_a_500(api, store, fresh_graph):
    """maxmemory reached with noeviction (as compose runs Redis): writes fail; the API says so."""
    store.redis.config_set("maxmemory-policy", "noeviction")
    used = int(store.redis.info("memory")["used_memory"])
    store.redis.config_set("maxmemory", max(1, used // 2))
    try:
        response = api.post("/compile", json={"graph": fresh_graph(), "target": "cpu"}, headers=AUTH)
    finally:
        store.redis.config_set("maxmemory", 0)
    assert response.status_code == 503, response.text
    assert response.json()["error"] == "store_full" and response.headers["retry-after"] == "60"
    assert api.post("/compile", json={"graph": fresh_graph(), "target": "cuda:sm_80"}, headers=AUTH).status_code == 202
