#!/usr/bin/env bash
# Sets up a development environment from nothing: a virtualenv in .venv with torch
# (the CPU build), triton, fusewire and its test tools, plus a redis-server binary.
# Safe to run again: each step is skipped when it is already done.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.fusewire-installed

if [ ! -x "$VENV/bin/python" ]; then
    echo "[bootstrap] creating $VENV"
    "$PY" -m venv "$VENV"
fi

want=$(sha256sum pyproject.toml scripts/bootstrap.sh | sha256sum | cut -c1-16)
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ]; then
    echo "[bootstrap] installing torch 2.13.0 (CPU), triton 3.6.0 and fusewire[dev]"
    # torch first, pinned: the project's range would otherwise pull a multi-GB CUDA build.
    "$VENV/bin/pip" install -q --disable-pip-version-check torch==2.13.0 triton==3.6.0
    # timm (the model zoo) needs torchvision: the release built for torch 2.13, without its
    # dependencies, which would replace the CPU torch (tests/models/zoo.py says more).
    "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps torchvision==0.28.0
    "$VENV/bin/pip" install -q --disable-pip-version-check -e ".[dev]"
    echo "$want" > "$STAMP"
fi

if ! command -v redis-server >/dev/null 2>&1; then
    echo "[bootstrap] installing redis-server (Debian package)"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
    # The package starts a system service on 6379; fusewire runs its own servers.
    $SUDO service redis-server stop >/dev/null 2>&1 || true
fi

if ! command -v chromium >/dev/null 2>&1; then
    # The dashboard's browser test drives it through playwright (PyPI's browser download is not needed).
    echo "[bootstrap] installing chromium (Debian package)"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi
echo "[bootstrap] ready: $("$VENV/bin/python" -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)')"
