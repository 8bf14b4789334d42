"""Shared helpers for the lowering tests (tests/test_lowering_*.py).

    from tests.lowering_cases import check, rand, transposed, strided, expanded
    result = check(lambda x, y: x + y, rand((3, 7)), expanded((3, 7), dim=0))
    result.externs       # the targets of the plan's extern steps (empty unless allowed)

`check` traces `fn` with make_fx, compiles the wire graph for "cpu", runs it under
Triton's interpreter and compares every output (and every input afterwards, so that
in-place ops must leave exactly the mutations eager leaves) with eager PyTorch, with
dtype-appropriate tolerances (elementwise |got - want| <= atol + rtol * |want|: float32
1e-5/1e-5, bf16 2e-2/2e-2, integers and bools exact). Inputs are random data, never
zeros, seeded per test (FUSEWIRE_TEST_SEED=n for fresh data); the helpers below make
non-contiguous ones (transposed, sliced with a step, expanded with stride 0).
"""

from __future__ import annotations

import os
import zlib

os.environ.setdefault("TRITON_INTERPRET", "1")  # Triton reads it once, when imported

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import compiler
from client.runtime import load
from compiler.artifact import Artifact
from compiler.fx_import import from_fx
from tests.compare import assert_within_eager_error

FLOAT32, BF16, INT64, BOOL = torch.float32, torch.bfloat16, torch.int64, torch.bool
FLOAT_DTYPES = [FLOAT32, BF16]

# Shapes every pointwise op runs over: sizes 1, 7 and 1000, and rank 1 to 3.
SHAPES = [(1,), (7,), (1000,), (3, 7), (7, 1, 5)]
SMALL_SHAPES = [(1,), (7,), (3, 7), (7, 1, 5)]

_TOLERANCES = {  # (atol, rtol): |got - want| <= atol + rtol * |want| elementwise
    torch.float32: (1e-5, 1e-5),
    torch.float64: (1e-10, 1e-10),
    torch.bfloat16: (2e-2, 2e-2),
    torch.float16: (2e-3, 2e-3),
}

_generator: dict[str, Any] = {"test": None, "generator": None}


def _seed(seed: int | None) -> torch.Generator:
    """A generator for `seed`; without one, a stream seeded by the running test's id, so that
    every test sees the same data whether it runs alone or in the suite. FUSEWIRE_TEST_SEED=n
    shifts every seed (to look for data-dependent bugs with fresh data)."""
    salt = int(os.environ.get("FUSEWIRE_TEST_SEED", "0"))
    if seed is not None:
        return torch.Generator().manual_seed(seed + salt)
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0] + (f"#{salt}" if salt else "")
    if _generator["test"] != test:
        _generator.update(test=test, generator=torch.Generator().manual_seed(zlib.crc32(test.encode())))
    return _generator["generator"]


# ---------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------


def rand(shape: Sequence[int], dtype: torch.dtype = FLOAT32, *, low: float | None = None, high: float | None = None,
         nonzero: bool = False, seed: int | None = None) -> torch.Tensor:
    """Random contiguous data: floats standard normal (or uniform in [low, high)), integers
    uniform in [low, high) (default [-8, 8)), bools half true. `nonzero` keeps zeros out
    (for divisors); float data is never exactly zero anyway."""
    generator = _seed(seed)
    shape = tuple(shape)
    if dtype == torch.bool:
        return torch.rand(shape, generator=generator) < 0.5
    if dtype.is_floating_point:
        if low is not None:
            data = torch.empty(shape).uniform_(low, high if high is not None else low + 1, generator=generator)
        else:
            data = torch.randn(shape, generator=generator)
        if nonzero:
            data = torch.where(data.abs() < 0.25, data.sign() * 0.25 + (data == 0) * 0.25, data)
        return data.to(dtype)
    lo, hi = int(low if low is not None else -8), int(high if high is not None else 8)
    data = torch.randint(lo, hi, shape, generator=generator)
    if nonzero:
        data = torch.where(data == 0, torch.ones_like(data), data)
    return data.to(dtype)


def transposed(shape: Sequence[int], dtype: torch.dtype = FLOAT32, **kwargs: Any) -> torch.Tensor:
    """A tensor of `shape` whose memory order is reversed (strides increase left to right)."""
    return rand(tuple(reversed(shape)), dtype, **kwargs).permute(*reversed(range(len(shape))))


def strided(shape: Sequence[int], dtype: torch.dtype = FLOAT32, step: int = 2, **kwargs: Any) -> torch.Tensor:
    """A tensor of `shape` sliced out of a bigger one with `step` on its last dim (and an offset)."""
    shape = tuple(shape)
    base = rand(shape[:-1] + (shape[-1] * step + 1,), dtype, **kwargs)
    return base[..., 1::step]


def expanded(shape: Sequence[int], dtype: torch.dtype = FLOAT32, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    """A tensor of `shape` broadcast along `dim` (stride 0 there)."""
    shape = tuple(shape)
    small = list(shape)
    small[dim] = 1
    return rand(small, dtype, **kwargs).expand(shape)


def layouts(shape: Sequence[int], dtype: torch.dtype = FLOAT32, **kwargs: Any) -> dict[str, torch.Tensor]:
    """One tensor of `shape` per memory layout: contiguous, transposed, strided, expanded."""
    return {"contiguous": rand(shape, dtype, **kwargs), "transposed": transposed(shape, dtype, **kwargs),
            "strided": strided(shape, dtype, **kwargs), "expanded": expanded(shape, dtype, **kwargs)}


def copy_strided(tensor: torch.Tensor) -> torch.Tensor:
    """A copy with the same sizes, strides and storage offset (stride 0 included)."""
    if tensor.numel() == 0:
        return tensor.clone()
    extent = tensor.storage_offset() + 1 + sum((s - 1) * st for s, st in zip(tensor.shape, tensor.stride()))
    storage = tensor.as_strided((extent,), (1,), 0).clone()
    return storage.as_strided(tensor.shape, tensor.stride(), tensor.storage_offset())


# ---------------------------------------------------------------------------------
# check
# ---------------------------------------------------------------------------------


@dataclass
class Result:
    artifact: Artifact
    outputs: list[torch.Tensor]
    expected: list[torch.Tensor]
    externs: list[str] = field(default_factory=list)

    @property
    def kernels(self) -> list[dict]:
        return self.artifact.manifest["kernels"]

    @property
    def kernel_sources(self) -> str:
        return kernel_sources(self.artifact)


def kernel_sources(artifact: Artifact) -> str:
    """Every kernel's source of an artifact, one after another (for assertions on generated code)."""
    return "\n".join(artifact.kernel_source(k) for k in artifact.manifest["kernels"])


def check(fn: Callable, *inputs: torch.Tensor, atol: float | None = None, rtol: float | None = None,
          expect_no_extern: bool = True, options: dict | None = None, reference64: bool = False) -> Result:
    """Compiles `fn` for "cpu", runs it under the interpreter and compares it with eager.

    Every output must match eager's shape, dtype and values (floats within tolerance, NaNs
    where eager has them; integers and bools exactly); every input must afterwards hold
    what eager left in it (in-place ops). With `expect_no_extern`, no op may have fallen
    back to an ATen call. `options` are CompileOptions fields: {"fusion": False} tells a
    lowering bug from a fusion bug. With `reference64`, float outputs follow Inductor's rule instead:
    their error against `fn` run in float64 is at most twice eager's own (plus a tiny floor), for
    long low-precision chains whose intermediates fusewire, as Inductor, keeps in float32."""
    graph = from_fx(make_fx(fn)(*[copy_strided(t) for t in inputs]), inputs)
    artifact = compiler.compile(graph, "cpu", options)
    externs = [step["target"] for step in artifact.plan["steps"] if step["op"] == "extern"]
    if expect_no_extern:
        assert not externs, f"ops fell back to ATen (extern): {externs}"

    eager_inputs = [copy_strided(t) for t in inputs]
    expected = _flatten(fn(*eager_inputs))
    run_inputs = [copy_strided(t) for t in inputs]
    outputs = load(artifact)(*run_inputs)

    assert len(outputs) == len(expected), f"{len(outputs)} outputs, eager gives {len(expected)}"
    references = _flatten(fn(*[_as_float64(copy_strided(t)) for t in inputs])) if reference64 else None
    for i, (got, want) in enumerate(zip(outputs, expected)):
        if references is not None and want.dtype.is_floating_point:
            assert_within_eager_error(got, want, references[i], f"output {i}")
        else:
            assert_matches(got, want, atol, rtol, f"output {i}")
    for i, (got, want) in enumerate(zip(run_inputs, eager_inputs)):
        assert_matches(got, want, atol, rtol, f"input {i} after the run")
    return Result(artifact, outputs, expected, externs)


def _as_float64(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.double() if tensor.dtype.is_floating_point else tensor


def _flatten(value: Any) -> list[torch.Tensor]:
    if isinstance(value, (list, tuple)):
        return [item for v in value for item in _flatten(v)]
    return [value]


def assert_matches(got: torch.Tensor, want: torch.Tensor, atol: float | None, rtol: float | None, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}, eager {tuple(want.shape)}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, eager {want.dtype}"
    if not want.dtype.is_floating_point:
        mismatch = got != want
        assert not mismatch.any(), (f"{what}: {int(mismatch.sum())} of {want.numel()} elements differ; "
                                    f"first at {mismatch.nonzero()[0].tolist()}: {got[mismatch][0]} vs {want[mismatch][0]}")
        return
    default_atol, default_rtol = _TOLERANCES[want.dtype]
    torch.testing.assert_close(got, want, atol=default_atol if atol is None else atol,
                               rtol=default_rtol if rtol is None else rtol, equal_nan=True, msg=lambda m: f"{what}: {m}")
