"""docker-compose.yml and the Dockerfiles name entry points that exist."""

import re

import yaml

from svc_helpers import ROOT


def test_compose_services_reference_real_entry_points():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"redis", "api", "worker"} <= set(services)
    assert services["redis"]["image"].startswith("redis:")
    for name in ("api", "worker"):
        build = services[name]["build"]
        dockerfile = ROOT / build.get("context", ".") / build["dockerfile"]
        assert dockerfile.exists(), dockerfile
        env = services[name]["environment"]
        assert env["FUSEWIRE_REDIS_URL"].startswith("redis://redis:")
        assert "redis" in services[name]["depends_on"]
    signing = services["worker"]["environment"]["FUSEWIRE_SIGNING_KEY_FILE"]
    assert signing == f"/run/secrets/{services['worker']['secrets'][0]}" and services["worker"]["secrets"][0] in compose["secrets"]
    gpu = services["worker"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["driver"] == "nvidia" and "gpu" in gpu["capabilities"]


def test_dockerfiles_run_the_app_entry_points():
    api = (ROOT / "docker" / "Dockerfile.api").read_text()
    worker = (ROOT / "docker" / "Dockerfile.worker").read_text()
    assert "service.app:app" in api or "fusewire serve" in " ".join(_cmd(api).split('", "'))
    assert not re.search(r"pip install[^&]*\b(torch|triton)\b", _joined(api)), "the API image must not install torch"
    assert re.search(r"^FROM\s+nvidia/cuda:", worker, re.M), "the worker image starts from a CUDA base"
    assert "fusewire" in _cmd(worker) and "worker" in _cmd(worker)
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    assert compose["api"]["command"][:2] == ["fusewire", "serve"]
    assert compose["worker"]["command"][:2] == ["fusewire", "worker"]
    # each command names a subcommand the CLI has
    from client.cli import app as cli

    names = {c.name or c.callback.__name__ for c in cli.registered_commands}
    assert {"serve", "worker"} <= names
    # the modules and console script the images run exist in this checkout
    import importlib

    assert importlib.import_module("service.app").app is not None
    assert importlib.import_module("worker.app").app.main == "fusewire"
    assert importlib.import_module("client.cli").main


def _cmd(text: str) -> str:
    lines = [line for line in text.splitlines() if line.startswith(("CMD", "ENTRYPOINT"))]
    return " ".join(lines)


def _joined(text: str) -> str:
    """The Dockerfile with continuation lines joined."""
    return text.replace("\\\n", " ")
