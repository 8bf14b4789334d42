"""A small client of the fusewire HTTP API, used by the CLI and the torch.compile backend.

    client = FusewireClient("http://127.0.0.1:8000", token="...")
    artifact = client.compile(graph, target="cpu")        # probe, submit, wait, fetch, verify
    # or step by step:
    sub = client.submit(graph, "cpu")                     # Submission(key, state)
    job = client.wait(sub.key, timeout=600, on_progress=print)
    blob = client.fetch_bytes(sub.key)                    # digest and key verified

Torch-free (httpx + the torch-free parts of `compiler`). Every call has a bounded timeout;
connection errors and 503s are retried a few times with backoff, other errors raise
`ServiceError` carrying the service's {error, detail, where}.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import httpx

DEFAULT_URL = "http://127.0.0.1:8000"
RETRIES = 3
# the service's error codes by status (docs/SERVICE.md), for answers without a body (HEAD)
_ERROR_CODES = {401: "unauthenticated", 403: "forbidden", 404: "not_found", 413: "too_large", 429: "rate_limited",
                503: "unavailable"}


class ServiceError(RuntimeError):
    """The service answered an error (or could not be reached)."""

    def __init__(self, status: int, error: str, detail: str, where: str | None = None) -> None:
        super().__init__(f"{status} {error}: {detail}")
        self.status, self.error, self.detail, self.where = status, error, detail, where


class CompileFailed(RuntimeError):
    """The job finished in state 'failed'; `job` holds the record, `job['error']` why."""

    def __init__(self, key: str, job: dict[str, Any]) -> None:
        super().__init__(f"compile {key[:12]} failed: {job.get('error')}")
        self.key, self.job = key, job


class ArtifactVerificationError(RuntimeError):
    """Downloaded bytes that do not match their digest or their key, or whose signature does not
    check against the keys this client trusts."""


@dataclass(frozen=True)
class Submission:
    key: str
    state: str  # ready | queued | running


def graph_payload(graph: Any) -> dict:
    """A wire graph as a JSON-able dict, from a Graph model, a dict, JSON text/bytes or a path."""
    if hasattr(graph, "model_dump"):
        return graph.model_dump(mode="json")
    if isinstance(graph, dict):
        return graph
    if isinstance(graph, (bytes, str)) and not (isinstance(graph, str) and os.path.exists(graph)):
        return json.loads(graph)
    with open(graph, "rb") as f:
        return json.load(f)


def local_key(graph: Any, target: str = "cpu", options: dict | None = None) -> str:
    """The key the service will compute for this graph (DESIGN.md: clients may probe first)."""
    from compiler.graph import key, parse_graph

    return key(parse_graph(graph_payload(graph)), target, options)


class FusewireClient:
    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 30.0,
                 http: httpx.Client | None = None, trusted=None) -> None:
        """`trusted`: compiler.signing.TrustedKeys that fetched artifacts must be signed by (default:
        FUSEWIRE_TRUSTED_KEYS / FUSEWIRE_TRUSTED_KEYS_FILE, read at the first fetch)."""
        self.url = (url or os.environ.get("FUSEWIRE_URL") or DEFAULT_URL).rstrip("/")
        self.trusted = trusted
        token = token if token is not None else os.environ.get("FUSEWIRE_TOKEN")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = http if http is not None else httpx.Client(base_url=self.url, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "FusewireClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- transport ---------------------------------------------------------------

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        delay = 0.2
        for attempt in range(RETRIES + 1):
            try:
                response = self.http.request(method, path, headers=self.headers, **kwargs)
            except httpx.TransportError as exc:
                if attempt == RETRIES:
                    raise ServiceError(0, "unreachable", f"{self.url}: {exc}") from None
            else:
                # 503 with Retry-After: Redis or the queue is briefly away; /readyz's 503 has none
                if response.status_code != 503 or "retry-after" not in response.headers or attempt == RETRIES:
                    return response
            time.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    @staticmethod
    def _raise_for(response: httpx.Response) -> None:
        if response.status_code < 400:
            return
        try:
            body = response.json()
        except ValueError:
            body = {}
        if not isinstance(body, dict):
            body = {}
        if not body:  # HEAD answers, proxies: no JSON body to say what went wrong
            request = response.request
            body = {"error": _ERROR_CODES.get(response.status_code, "http_error"),
                    "detail": f"{request.method} {request.url.path}: {response.reason_phrase} {response.text[:500]}".strip()}
        raise ServiceError(response.status_code, body.get("error", "http_error"),
                           body.get("detail", response.text[:500]), body.get("where"))

    # -- API ---------------------------------------------------------------------

    def submit(self, graph: Any, target: str = "cpu", options: dict | None = None) -> Submission:
        """POST /compile: 'ready' (already compiled), or 'queued'/'running' (a job has the key)."""
        body = {"graph": graph_payload(graph), "target": target, "options": options}
        response = self._request("POST", "/compile", json=body)
        self._raise_for(response)
        data = response.json()
        return Submission(data["key"], data["state"])

    def job(self, key: str) -> dict[str, Any]:
        response = self._request("GET", f"/jobs/{key}")
        self._raise_for(response)
        return response.json()

    def exists(self, key: str) -> bool:
        """HEAD /artifacts/{key}."""
        response = self._request("HEAD", f"/artifacts/{key}")
        if response.status_code == 404:
            return False
        self._raise_for(response)
        return True

    def fetch_bytes(self, key: str) -> bytes:
        """GET /artifacts/{key}, checked: sha256 matches the served digest, manifest key matches `key`,
        and the worker's signature checks against the keys this client trusts."""
        from compiler.artifact import Artifact, ArtifactError, digest_of
        from compiler.signing import SignatureError, TrustedKeys, verify_artifact

        response = self._request("GET", f"/artifacts/{key}")
        self._raise_for(response)
        blob = response.content
        served = response.headers.get("x-fusewire-digest")
        if served and digest_of(blob) != served:
            raise ArtifactVerificationError(f"artifact {key[:12]}: sha256 {digest_of(blob)} != served digest {served}")
        try:
            artifact = Artifact.from_bytes(blob)
        except ArtifactError as exc:
            raise ArtifactVerificationError(f"artifact {key[:12]}: {exc}") from None
        if artifact.manifest.get("key") != key:
            raise ArtifactVerificationError(f"artifact {key[:12]}: its manifest names key {artifact.manifest.get('key')}")
        if self.trusted is None:
            self.trusted = TrustedKeys.from_env()
        try:
            verify_artifact(artifact, self.trusted)
        except SignatureError as exc:
            raise ArtifactVerificationError(str(exc)) from None
        return blob

    def fetch(self, key: str):
        """The verified Artifact for `key`."""
        from compiler.artifact import Artifact

        return Artifact.from_bytes(self.fetch_bytes(key))

    def wait(self, key: str, timeout: float = 600.0, poll: float = 0.25,
             on_progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Polls GET /jobs/{key} until ready (returns the job) or failed (CompileFailed); TimeoutError past `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(key)
            if on_progress is not None:
                on_progress(job)
            if job["state"] == "ready":
                return job
            if job["state"] == "failed":
                raise CompileFailed(key, job)
            if time.monotonic() >= deadline:
                raise TimeoutError(f"compile {key[:12]} still {job['state']} ({job.get('stage')}) after {timeout:g} s")
            time.sleep(min(poll, max(0.0, deadline - time.monotonic())))
            poll = min(poll * 1.5, 2.0)

    def compile(self, graph: Any, target: str = "cpu", options: dict | None = None, timeout: float = 600.0,
                on_progress: Callable[[dict[str, Any]], None] | None = None):
        """Probe the cache by the locally computed key, else submit and wait; returns the verified Artifact."""
        payload = graph_payload(graph)
        try:
            key = local_key(payload, target, options)
            if self.exists(key):
                return self.fetch(key)
        except ValueError:
            pass  # invalid locally: let the service say what is wrong
        submission = self.submit(payload, target, options)
        if submission.state != "ready":
            self.wait(submission.key, timeout=timeout, on_progress=on_progress)
        return self.fetch(submission.key)

    def health(self) -> dict[str, Any]:
        response = self._request("GET", "/healthz")
        self._raise_for(response)
        return response.json()

    def readiness(self) -> dict[str, Any]:
        """GET /readyz; a 503 (not ready) is returned as data, not raised."""
        response = self._request("GET", "/readyz")
        if response.status_code not in (200, 503):
            self._raise_for(response)
        return response.json()
