"""One training step of zoo models through the fusewire backend, as a user's process runs it:

    python tests/models/zoo_step.py URL CACHE_DIR gpt2 llama ...

Prints one JSON line: per model, the backend's stats and the loss. Any fallback raises
(on_error="raise"). The zoo tests run it as the "second process" that must be served from
the service's cache."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch

from accuracy import step_results
from zoo import build, make_batch

TOKEN = "tok-alpha"  # tests/service/svc_helpers.py TOKENS: team alpha


def zoo_backend(url: str, cache_dir: Path, timeout_s: float = 240.0, eager_random: bool = True,
                channels_last: str | None = None):
    """The backend the zoo's tests compile through: the service at `url`, any fallback raised."""
    from client.backend import backend

    return backend(url=url, token=TOKEN, cache_dir=cache_dir, on_error="raise", timeout_s=timeout_s,
                   options={"eager_random": eager_random}, channels_last=channels_last)


def compiled_step(name: str, url: str, cache_dir: Path, timeout_s: float = 240.0,
                  eager_random: bool = True, channels_last: str | None = None) -> tuple[dict, dict]:
    """(the step's results, the backend's stats) for one model compiled through the service.
    `eager_random` (here the default): dropout draws eager's masks, so the step can be held to the
    accuracy rule against eager; off, dropout is drawn in fusewire's kernels (the backend's default).
    `channels_last`: the backend's setting (client/channels_last.py), None for its default."""
    model = copy.deepcopy(build(name, "tiny"))
    be = zoo_backend(url, cache_dir, timeout_s, eager_random, channels_last)
    results = step_results(model, name, make_batch(name, "tiny"), torch.compile(model, backend=be))
    torch._dynamo.reset()
    return results.values, dict(be.stats)


if __name__ == "__main__":
    url, cache = sys.argv[1], Path(sys.argv[2])
    report = {}
    for model_name in sys.argv[3:]:
        values, stats = compiled_step(model_name, url, cache / model_name)
        report[model_name] = {"stats": stats, "loss": values["loss"].item()}
    print(json.dumps(report))
