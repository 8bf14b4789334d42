"""The accuracy rule itself (tests/models/accuracy.py): twice eager's error (the larger of two eager
runs' where two are given), plus a floor of 1e-6 and eight float32 spacings of the value's size."""

from __future__ import annotations

import torch

from accuracy import StepResults, accuracy_failures

EPS = torch.finfo(torch.float32).eps


def _failures(reference: torch.Tensor, eager: torch.Tensor, compiled: torch.Tensor) -> list[str]:
    return accuracy_failures(StepResults({"v": reference}), StepResults({"v": eager}), StepResults({"v": compiled}))


def test_a_loss_within_a_few_spacings_of_its_size_passes_where_eager_was_lucky():
    loss = torch.tensor(22.3, dtype=torch.float64)
    assert not _failures(loss, loss + 0.1 * EPS * 22.3, loss + 6 * EPS * 22.3)


def test_a_loss_off_by_many_spacings_fails():
    loss = torch.tensor(4.8, dtype=torch.float64)
    assert _failures(loss, loss + EPS * 4.8, loss + 100 * EPS * 4.8)


def test_a_gradient_four_times_eagers_error_fails_the_floor_barely_moves_for_small_values():
    generator = torch.Generator().manual_seed(0)
    grad = torch.randn(1000, dtype=torch.float64, generator=generator) * 1e-2
    noise = torch.randn(1000, dtype=torch.float64, generator=generator)
    eager, compiled = grad + 1e-6 * noise, grad + 4e-6 * noise
    assert _failures(grad, eager, compiled)
    assert not _failures(grad, eager, grad + 2e-6 * noise)


def test_with_two_eager_runs_the_larger_error_counts():
    """A sum over a whole tensor whose terms cancel (HGNetV2's scalar affine bias gradient): one eager
    run erred 8e-7, another on one thread 3e-6; 5e-6 is within twice the latter, not the former."""
    grad = torch.tensor([-0.0188], dtype=torch.float64)
    lucky, other, compiled = grad + 8e-7, grad - 3e-6, grad - 5e-6
    assert _failures(grad, lucky, compiled)
    runs = [StepResults({"v": lucky}), StepResults({"v": other})]
    assert not accuracy_failures(StepResults({"v": grad}), runs, StepResults({"v": compiled}))
    assert accuracy_failures(StepResults({"v": grad}), runs, StepResults({"v": grad - 8e-6}))


def test_a_larger_floor_applies_only_to_the_values_it_names():
    grad = torch.tensor([-0.0188], dtype=torch.float64)
    eager, compiled = grad + 1e-7, grad + 9e-6
    named = [StepResults({"grad stem.lab.bias": v}) for v in (grad, eager, compiled)]
    assert accuracy_failures(*named) and not accuracy_failures(*named, floors={".lab.": 1e-5})
    other = [StepResults({"grad stem.conv.bias": v}) for v in (grad, eager, compiled)]
    assert accuracy_failures(*other, floors={".lab.": 1e-5})
