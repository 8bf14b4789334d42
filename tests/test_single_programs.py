"""Single-program kernels in one launch (compiler/single_programs.py): a chain of kernels with one
output element each runs as the phases of one kernel, in order, and gives eager's results."""

from __future__ import annotations

import pytest
import torch

from compiler import single_programs
from tests.test_scheduler import compile_and_check

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on masked-off lanes


def clip_factor(a, b, c):  # clip_grad_norm_'s factor over three parameters' gradients
    norms = torch.stack([torch.linalg.vector_norm(a), torch.linalg.vector_norm(b), torch.linalg.vector_norm(c)])
    return torch.clamp(1.0 / (torch.linalg.vector_norm(norms) + 1e-6), max=1.0)


def loss_then_use(x, y):  # a full sum, a kernel over many elements that reads it, then a sum of that
    total = x.sum()
    scaled = y * total
    return scaled.sum() + total, scaled


def _phases(artifact) -> list[int]:
    return [len(k["config"].get("phases", [])) for k in artifact.manifest["kernels"]]


def test_the_final_passes_of_a_global_norm_run_in_one_launch():
    grads = torch.randn(300, 1024), torch.randn(64, 1000), torch.randn(77)
    artifact = compile_and_check(clip_factor, *grads)
    # the two split first passes side by side (compiler.parallel_passes), then one kernel: both
    # final passes, the small norm, the norm of the stack
    assert _phases(artifact) == [0, 4]
    source = artifact.kernel_source(artifact.manifest["kernels"][-1])
    assert source.count("tl.debug_barrier()") == 3


def test_without_chains_each_runs_alone(monkeypatch):
    monkeypatch.setattr(single_programs, "CHAIN_SINGLE_PROGRAMS", False)
    artifact = compile_and_check(clip_factor, torch.randn(300, 1024), torch.randn(64, 1000), torch.randn(77))
    assert _phases(artifact) == [0] * 6


def test_a_phase_reads_what_an_earlier_phase_stored():
    # the sum's final pass and the kernel that scales y by it and sums the product: one launch
    artifact = compile_and_check(loss_then_use, torch.randn(333, 97), torch.randn(50, 30))
    assert _phases(artifact)[-1] == 2


def test_a_chain_does_not_move_past_a_reader_of_its_results():
    # the big multiply reads the first sum: that sum's kernel must run before it, so the two
    # single-program kernels on either side of it stay apart
    def fn(x, y):
        total = x.sum()
        scaled = y * total
        return scaled, scaled.sum() * 2
    artifact = compile_and_check(fn, torch.randn(333, 97), torch.randn(700, 900))
    names = [k["name"] for k in artifact.manifest["kernels"]]
    steps = [s["kernel"] for s in artifact.manifest["plan"]["steps"] if s["op"] == "kernel"]
    assert steps == names and all(n == 0 for n in _phases(artifact)[:-1]), names


def test_a_chain_of_losses_and_scalar_bookkeeping():
    def fn(x, y, z, step):  # two losses and AdamW-style bias corrections: the scalar work joins their kernels
        loss = (x - y).pow(2).mean() + z.abs().sum()
        correction = 1 - 0.9 ** step
        return loss / correction, torch.sqrt(1 - 0.999 ** step)
    artifact = compile_and_check(fn, torch.randn(333, 97), torch.randn(333, 97), torch.randn(1000),
                                 torch.tensor(3.0))
    assert _phases(artifact)[-1] == 2
