"""Comparing compiled outputs with eager ones, with dtype-appropriate tolerances."""

from __future__ import annotations

from typing import Sequence

import torch

TOLERANCES = {  # (atol, rtol)
    torch.float32: (1e-4, 1e-4),
    torch.float64: (1e-8, 1e-7),
    torch.bfloat16: (2e-2, 1.6e-2),
    torch.float16: (2e-3, 2e-3),
}


def assert_close_outputs(actual: Sequence[torch.Tensor], expected: Sequence[torch.Tensor], where: str = "") -> None:
    assert len(actual) == len(expected), f"{where}: {len(actual)} outputs, expected {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected)):
        label = f"{where} output {i}"
        assert a.shape == e.shape, f"{label}: shape {tuple(a.shape)}, expected {tuple(e.shape)}"
        assert a.dtype == e.dtype, f"{label}: dtype {a.dtype}, expected {e.dtype}"
        if e.dtype in TOLERANCES:
            atol, rtol = TOLERANCES[e.dtype]
            torch.testing.assert_close(a, e, atol=atol, rtol=rtol, equal_nan=True, msg=lambda m: f"{label}: {m}")
        else:
            assert torch.equal(a, e), f"{label}: values differ"


def reduction_passes(source: str) -> list[str]:
    """The passes over the reduction of a looped kernel's source, each as the text of its first
    loop (a pass over misaligned rows is three loops, compiler.codegen.group._loop_headers)."""
    return [text.split("for roffset")[0] for text in source.split("for roffset in range(0, ")[1:]]


def rmse(value: torch.Tensor, reference: torch.Tensor) -> float:
    """Root-mean-square error of `value` against `reference`, in float64 (0 for empty tensors)."""
    return (value.double() - reference.double()).pow(2).mean().sqrt().item() if value.numel() else 0.0


def assert_within_eager_error(got: torch.Tensor, eager: torch.Tensor, reference: torch.Tensor, what: str,
                              multiplier: float = 2.0, floor: float = 1e-6) -> None:
    """Inductor's accuracy rule: root-mean-square error against the float64 run at most
    `multiplier` times eager's own, plus `floor`."""
    assert got.shape == eager.shape and got.dtype == eager.dtype, f"{what}: {got.shape} {got.dtype}, eager {eager.shape} {eager.dtype}"
    error, eager_error = rmse(got, reference), rmse(eager, reference)
    assert error <= multiplier * eager_error + floor, f"{what}: error {error:.3g}, eager's {eager_error:.3g}"
