"""Helpers for the client tests (imported by name: tests/client is on sys.path, as tests/service is)."""

from __future__ import annotations

import subprocess
import sys

import httpx

from svc_helpers import ROOT, free_port, settings_env, stop_process, wait_for

TOKEN = "tok-alpha"  # tests/service/svc_helpers.py TOKENS: team alpha


class ApiServer:
    """`python -m uvicorn service.app:app` with the session's settings (FUSEWIRE_* env)."""

    def __init__(self, settings, log_path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.settings, self.log_path = settings, log_path
        self.start()

    def start(self) -> None:
        """Starts (again) on the same port; returns once /healthz answers."""
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "service.app:app", "--host", "127.0.0.1", "--port", str(self.port),
                 "--log-level", "warning"],
                cwd=ROOT, env=settings_env(self.settings), stdout=log, stderr=subprocess.STDOUT)
        wait_for(self._up, 60, f"API on {self.url}")

    def kill(self) -> None:
        """SIGKILL: the process dies mid-whatever, its connections reset."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)

    def _up(self) -> bool:
        assert self.process.poll() is None, f"API exited:\n{self.log_path.read_text()[-3000:]}"
        try:
            return httpx.get(self.url + "/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    def stop(self) -> None:
        stop_process(self.process)
