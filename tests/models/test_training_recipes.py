"""Real models under the training recipes users wrap around a step, through the real stack with
on_error="raise": activation checkpointing (transformers' `gradient_checkpointing_enable`, timm's
`set_grad_checkpointing`) over layers with dropout, mixed precision (float32 weights, the step under
`torch.autocast` to bfloat16), and evaluation (`eval()` under `no_grad` and `inference_mode`: BatchNorm
reads its running statistics, no backward graph).

Asserted for each: no graph falls back, and the loss, every gradient and every buffer pass
Inductor's accuracy rule (tests/models/accuracy.py) against a float64 run of the plain model, with
eager under the same recipe as the baseline. Dropout draws eager's masks (`eager_random`), so the
steps are comparable value for value."""

from __future__ import annotations

import contextlib
import copy
import warnings
from typing import Callable

import pytest
import torch
import torch.nn as nn

from accuracy import StepResults, accuracy_failures, step_results
from client.backend import FusewireWarning
from zoo import build, float64_reference, make_batch, step_loss, with_checkpointing
from zoo_step import zoo_backend


def autocast() -> contextlib.AbstractContextManager:
    return torch.autocast("cpu", dtype=torch.bfloat16)


# recipe -> (how the model is prepared, the context the step runs in)
TRAINING: dict[str, tuple[Callable[[nn.Module], nn.Module], Callable[[], contextlib.AbstractContextManager]]] = {
    "checkpointing": (with_checkpointing, contextlib.nullcontext),
    "autocast_bf16": (lambda model: model, autocast),
}
CASES = [("gpt2", "checkpointing"), ("vit", "checkpointing"), ("llama", "autocast_bf16"),
         ("resnet", "autocast_bf16")]


@pytest.mark.parametrize("name,recipe", CASES)
def test_a_training_recipe_compiles_without_fallback_and_passes_the_accuracy_rule(api_server, tmp_path, name, recipe):
    prepare, context = TRAINING[recipe]
    model, batch = build(name, "tiny"), make_batch(name, "tiny")
    reference = step_results(float64_reference(model), name, batch)
    with context():
        eager = step_results(prepare(copy.deepcopy(model)), name, batch)
    compiled_model = prepare(copy.deepcopy(model))
    be = zoo_backend(api_server.url, tmp_path)
    with warnings.catch_warnings(), context():
        warnings.simplefilter("error", FusewireWarning)
        compiled = step_results(compiled_model, name, batch, torch.compile(compiled_model, backend=be))
    torch._dynamo.reset()
    stats = dict(be.stats)
    assert stats.get("fallbacks", 0) == 0 and stats["graphs"] >= 2, stats
    failures = accuracy_failures(reference, eager, compiled)
    assert not failures, "\n".join(failures)


def evaluation_loss(model: nn.Module, name: str, batch: dict, inference_mode: bool) -> torch.Tensor:
    with torch.inference_mode() if inference_mode else torch.no_grad():
        return step_loss(model, name, batch)


@pytest.mark.parametrize("name", ["resnet", "bert"])
def test_evaluation_compiles_one_graph_and_matches_eager(api_server, tmp_path, name):
    model, batch = build(name, "tiny"), make_batch(name, "tiny")
    with torch.no_grad():  # running statistics that differ from the batch's, so eval mode shows
        for buffer_name, buffer in model.named_buffers():
            if buffer_name.endswith("running_mean"):
                buffer.copy_(torch.randn_like(buffer))
    model.eval()
    reference = StepResults({"loss": evaluation_loss(float64_reference(model), name, batch, False)})
    eager = StepResults({"loss": evaluation_loss(model, name, batch, False)})
    be = zoo_backend(api_server.url, tmp_path)
    compiled_model = torch.compile(model, backend=be)
    for inference_mode in (False, True):
        with warnings.catch_warnings():
            warnings.simplefilter("error", FusewireWarning)
            compiled = StepResults({"loss": evaluation_loss(compiled_model, name, batch, inference_mode)})
        failures = accuracy_failures(reference, eager, compiled)
        assert not failures, (inference_mode, failures)
    torch._dynamo.reset()
    stats = dict(be.stats)
    assert stats.get("fallbacks", 0) == 0 and stats["graphs"] >= 1, stats
