"""Independent first passes of split reductions to one value share one launch
(compiler/parallel_passes.py): a gradient clip's global norm against eager, and the passes that
keep their own kernels (one reads another's result, column sums, the switch off)."""

from __future__ import annotations

import pytest
import torch

from compiler import parallel_passes
from tests.lowering_cases import check, rand

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on masked-off lanes


def parts_kernels(result) -> list[dict]:
    return [k for k in result.artifact.manifest["kernels"] if k["config"].get("parts")]


def clip_factor(a, b, c):
    """clip_grad_norm_'s factor over three gradients of different shapes."""
    norms = torch.stack([torch.linalg.vector_norm(t) for t in (a, b, c)])
    return torch.clamp(1.0 / (torch.linalg.vector_norm(norms) + 1e-6), max=1.0)


def clip_inputs():
    return rand((96, 1024), seed=1), rand((33, 2000), seed=2), rand((300,), seed=3)


def test_a_global_norms_first_passes_run_side_by_side():
    result = check(clip_factor, *clip_inputs())
    (kernel,) = parts_kernels(result)
    counts = [part["programs"] for part in kernel["config"]["parts"]]
    assert len(counts) == 2 and all(n > 1 for n in counts)
    assert len(result.artifact.manifest["kernels"]) == 2  # the parts, then the final passes chained


def test_a_sum_of_a_products_with_a_sum_keeps_its_own_kernels():
    """The second pass reads what the first reduction made: it cannot run beside it."""
    def fn(x, y):
        return (y * x.sum()).sum()

    result = check(fn, rand((64, 1024), seed=4), rand((64, 1024), seed=5))
    assert not parts_kernels(result)


def test_column_sums_keep_their_own_kernels():
    def fn(x, y):
        return x.sum(0), y.sum(0)

    result = check(fn, rand((8192, 24), seed=6), rand((4096, 40), seed=7))
    assert not parts_kernels(result)


def test_the_switch_keeps_a_kernel_per_pass(monkeypatch):
    monkeypatch.setattr(parallel_passes, "COMBINE_SPLIT_PASSES", False)
    result = check(clip_factor, *clip_inputs())
    assert not parts_kernels(result) and len(result.artifact.manifest["kernels"]) == 3
