"""Inductor's accuracy rule for a training step: a compiled result's error against a float64 run
of the same model is at most twice eager's own error (at its precision), plus a tiny floor.
Errors are root-mean-square over each tensor; integer results (BatchNorm's step counter) must
match exactly.

    reference = step_results(model64, name, batch)              # float64 copy, eager
    eager = eager_steps(model32, name, batch)                    # eager on torch's threads, and on one
    compiled = step_results(model32b, name, batch, torch.compile(model32b, backend=...))
    assert not accuracy_failures(reference, eager, compiled)

Every run reseeds torch's generator first, so dropout draws the same masks in all three.

Eager's error is the larger of two eager runs' where two are given: on torch's threads and on one
thread, whose reductions group their terms otherwise. One eager run is one sample of how rounding adds
up, and where a value sums a whole tensor whose terms cancel, samples spread widely: HGNetV2's scalar
affine parameters (y = a * x + b after each activation: b's gradient sums the next convolution's
input gradient, which BatchNorm makes cancel) and MobileNetV4's loss erred 3-5x more on one thread
than on two, where eager on one thread against eager on two broke the single-run rule on 3 and 2 values
(tiny steps, CPU, 2026-11-29).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch
import torch.nn as nn

from tests.compare import rmse
from zoo import step_loss

MULTIPLIER = 2.0
FLOOR = 1e-6  # RMSE floor; float32 results of the zoo's steps err by about 1e-9..1e-7 in eager
# ...plus this many float32 spacings of the value's own size (its reference's RMS). A loss is one
# number: its error is one sample of how the logits' errors add up, and eager's can be lucky. MixNet's
# tiny step: fusewire's logits erred less than eager's (RMSE 7.5e-6 against 1.2e-5), yet its loss of
# 4.8 erred by 4.6e-6 (about 10 spacings) against eager's 1.1e-6; Funnel's loss of 22.3 by 2.5e-6
# (1.3 spacings) against 6.1e-7. For gradients (RMS 1e-4..1) the term is 1e-11..1e-6: the rule is
# unchanged there. Inductor's own check (torch._dynamo.utils.same) is looser still for small
# tensors: 3x eager's error under 1000 elements, plus tol / 10.
FLOOR_SPACINGS = 8


@dataclass
class StepResults:
    """What one training step produced: the loss, each parameter's gradient, each buffer after the step."""

    values: dict[str, torch.Tensor]


def step_results(model: nn.Module, name: str, batch: dict, runner: nn.Module | None = None, seed: int = 1) -> StepResults:
    """One forward/loss/backward of `runner` (default: `model`); gradients and buffers read from `model`."""
    torch.manual_seed(seed)
    loss = step_loss(model if runner is None else runner, name, batch)
    loss.backward()
    values = {"loss": loss.detach()}
    values.update({f"grad {n}": p.grad for n, p in model.named_parameters() if p.grad is not None})
    values.update({f"buffer {n}": b.detach().clone() for n, b in model.named_buffers()})
    return StepResults(values)


def eager_steps(model: nn.Module, name: str, batch: dict) -> list[StepResults]:
    """Eager's step on torch's threads and on one thread (each on its own copy of `model`)."""
    threads = torch.get_num_threads()
    runs = [step_results(copy.deepcopy(model), name, batch)]
    torch.set_num_threads(1)
    try:
        runs.append(step_results(copy.deepcopy(model), name, batch))
    finally:
        torch.set_num_threads(threads)
    return runs


def accuracy_failures(reference: StepResults, eager: StepResults | Sequence[StepResults],
                      compiled: StepResults, floors: Mapping[str, float] | None = None) -> list[str]:
    """Each value of the step that breaks the rule, with its errors; empty when all pass. `eager`:
    one eager run, or several (eager_steps), the largest of their errors counting. `floors`: a larger
    floor for the values whose names contain a key (a model's chaotic sums, tests/models/test_model_zoo.py)."""
    eagers = [eager] if isinstance(eager, StepResults) else list(eager)
    failures = []
    for key, want in reference.values.items():
        got = compiled.values.get(key)
        if got is None:
            failures.append(f"{key}: missing from the compiled step")
        elif got.shape != want.shape:
            failures.append(f"{key}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
        elif not want.is_floating_point():
            if not torch.equal(got.cpu(), want.cpu()):
                failures.append(f"{key}: integer values differ from eager's")
        else:
            error, eager_error = rmse(got, want), max(rmse(run.values[key], want) for run in eagers)
            allowed = max([floor(want)] + [f for part, f in (floors or {}).items() if part in key])
            if error > MULTIPLIER * eager_error + allowed:
                failures.append(f"{key}: error {error:.3g}, eager's {eager_error:.3g}")
    return failures


def floor(reference: torch.Tensor) -> float:
    """The error any value may have beyond twice eager's: FLOOR plus FLOOR_SPACINGS float32 spacings
    of the reference's root-mean-square size."""
    size = reference.detach().double().pow(2).mean().sqrt().item() if reference.numel() else 0.0
    return FLOOR + FLOOR_SPACINGS * torch.finfo(torch.float32).eps * size
