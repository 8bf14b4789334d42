"""Memory: compiler/memory_order.py runs a step whose result nobody reads until after the peak
after it, and the last reader of a released input before it, when that lowers the planned peak
(dependencies, mutations included, always hold);
codegen/plan.py lets a pointwise kernel write over an input it reads for the last time, element
for element, and never over one it reads elsewhere."""

from __future__ import annotations

import pytest
import torch

from torch.fx.experimental.proxy_tensor import make_fx

import compiler
import compiler.scheduler as scheduler
from compiler.bounds import planned_peak_bytes
from compiler.fx_import import from_fx
from compiler.graph import GraphValidationError
from tests.compare import reduction_passes
from tests.test_scheduler import compile_and_check

M, V, D = 256, 1024, 512  # float32: the weight-sized buffers are 2 MiB, the gradient 1 MiB


def tied_weight_backward(g, h, w):
    """GPT-2's tied LM head in the backward: the weight gradient is computed first in program
    order but only read at the end, while the copy of the weight for the other GEMM is live."""
    scaled = g * 2  # the padded logits gradient, read by both GEMMs
    weight_grad = scaled.t() @ h
    weight_copy = w * 3  # the padded weight
    input_grad = scaled @ weight_copy
    return torch.relu(input_grad), weight_grad


def inputs():
    return torch.randn(M, V), torch.randn(M, D), torch.randn(V, D)


def matmul_order(artifact) -> list[str]:
    """The extern matmuls' outputs in plan order."""
    return [s["outputs"][0] for s in artifact.plan["steps"] if s["op"] == "extern" and "mm" in s["target"]]


def test_a_result_read_only_after_the_peak_is_computed_after_it(monkeypatch):
    reordered = compile_and_check(tied_weight_backward, *inputs())
    monkeypatch.setattr(scheduler, "reorder_for_peak_memory", lambda steps, *_: steps)
    in_program_order = compile_and_check(tied_weight_backward, *inputs())
    weight_copy_bytes = V * D * 4
    assert planned_peak_bytes(reordered.plan) <= planned_peak_bytes(in_program_order.plan) - weight_copy_bytes // 2
    assert matmul_order(reordered) == matmul_order(in_program_order)[::-1]


def test_a_step_is_never_moved_past_a_later_write_of_what_it_reads():
    def fn(g, h, w):
        scaled = g * 2
        weight_grad = scaled.t() @ h  # must read `scaled` before the in-place write below
        scaled.mul_(0.5)
        input_grad = scaled @ (w * 3)
        return torch.relu(input_grad), weight_grad

    compile_and_check(fn, *inputs())


def test_an_order_without_an_idle_buffer_at_its_peak_is_kept(monkeypatch):
    def fn(a, w):
        h = torch.relu(a @ w)
        return torch.sigmoid(h @ w.t()), h.sum()

    args = torch.randn(M, D), torch.randn(D, V)
    reordered = compiler.compile(from_fx(make_fx(fn)(*args), args), "cpu")
    monkeypatch.setattr(scheduler, "reorder_for_peak_memory", lambda steps, *_: steps)
    kept = compiler.compile(from_fx(make_fx(fn)(*args), args), "cpu")
    assert reordered.plan["steps"] == kept.plan["steps"]


def inplace_allocs(artifact) -> list[tuple[str, str]]:
    return [(s["buffer"], s["reuse"]) for s in artifact.plan["steps"] if s["op"] == "alloc" and s.get("inplace")]


def test_a_pointwise_epilogue_writes_over_the_matmul_result_it_reads_last():
    def fn(x, w):
        h = x @ w
        return torch.nn.functional.gelu(h) * 2 + x[:, :1]

    artifact = compile_and_check(fn, torch.randn(37, 21), torch.randn(21, 21))
    (extern,) = [s for s in artifact.plan["steps"] if s["op"] == "extern"]
    assert [reuse for _, reuse in inplace_allocs(artifact)] == extern["outputs"]


def test_a_kernel_that_reads_other_elements_of_its_input_does_not_write_over_it():
    def fn(x, w):
        h = x @ w
        return h * h.t() + 1  # element (i, j) reads h at (i, j) and (j, i)

    artifact = compile_and_check(fn, torch.randn(131, 131), torch.randn(131, 131))  # several programs
    (extern,) = [s for s in artifact.plan["steps"] if s["op"] == "extern"]
    assert not [reuse for _, reuse in inplace_allocs(artifact) if reuse in extern["outputs"]]


def test_unfused_kernels_each_write_over_the_last_result():
    def fn(a):
        for i in range(4):
            a = torch.sin(a) + i
        return a

    artifact = compile_and_check(fn, torch.randn(13, 17), options={"fusion": False})
    assert len(inplace_allocs(artifact)) >= 3
    assert artifact.plan["peak_bytes"] <= 13 * 17 * 4


def _mm_result_reused_by(artifact) -> list[str]:
    """Names of the kernels that write over the matmul's result."""
    (extern,) = [s for s in artifact.plan["steps"] if s["op"] == "extern"]
    steps = artifact.plan["steps"]
    kernels = []
    for i, step in enumerate(steps):
        if step["op"] == "alloc" and step.get("inplace") and step["reuse"] in extern["outputs"]:
            kernels.append(next(s["kernel"] for s in steps[i:] if s["op"] == "kernel"))
    return kernels


def test_a_layer_norm_writes_over_the_matmul_result_it_normalizes():
    """A reduction kernel that reads each element of its input only where it writes its output
    takes the input's storage, persistent (short rows) and looped (rows past the CPU's 1024)."""
    for width in (40, 1500):
        def fn(x, w, g):
            return torch.nn.functional.layer_norm(x @ w, (width,), g, None)

        artifact = compile_and_check(fn, torch.randn(9, 33), torch.randn(33, width), torch.randn(width))
        assert any("layer_norm" in name for name in _mm_result_reused_by(artifact)), width


def test_a_reduction_that_reads_other_elements_of_its_input_does_not_write_over_it():
    def fn(x, w):
        h = x @ w
        return torch.softmax(h, -1) + h.flip(-1)  # element (i, j) reads h at (i, j) and (i, 39 - j)

    artifact = compile_and_check(fn, torch.randn(9, 33), torch.randn(33, 40))
    assert not _mm_result_reused_by(artifact)


def test_a_looped_reduction_that_reads_its_input_again_after_storing_does_not_write_over_it():
    """Stored in the first loop (beside the sum), read again in the second: in place, the second
    loop would read the output instead of the input."""
    def fn(x, w):
        h = x @ w
        doubled = h * 2
        return doubled, (h - h.sum(-1, keepdim=True)).half()  # half: only `doubled` could take h

    artifact = compile_and_check(fn, torch.randn(5, 33), torch.randn(33, 1500))
    (kernel,) = artifact.manifest["kernels"]
    assert len(reduction_passes(artifact.kernel_source(kernel))) == 2
    assert not _mm_result_reused_by(artifact)


def test_a_kernel_writes_over_a_matmul_result_seen_through_another_view():
    """The MLP backward's shape: the matmul's [B*T, N] result, read as [B, T, N] by a GELU backward
    whose bias gradient (a column sum) shares its kernel. The layouts differ, the storage is the same
    size and every element is read only where it is written: the output takes the storage."""
    def fn(x, w, pre):
        g = (x @ w).view(3, 7, 45)
        out = g * torch.sigmoid(pre) * (1 + pre * (1 - torch.sigmoid(pre)))
        return out, out.sum((0, 1))

    artifact = compile_and_check(fn, torch.randn(21, 19), torch.randn(19, 45), torch.randn(3, 7, 45))
    assert _mm_result_reused_by(artifact)


HIDDEN = 512  # float32 [1024, HIDDEN]: 2 MiB


def mlp_backward(grad, saved_activation, w2):
    """A backward's MLP block in program order: the hidden gradient (big) is computed before the
    weight gradient that reads the saved activation (as big) for the last time."""
    hidden_grad = grad @ w2
    weight_grad = grad.t() @ saved_activation
    return torch.relu(hidden_grad).sum(0), weight_grad


def mlp_inputs():
    return torch.randn(1024, 64), torch.randn(1024, HIDDEN), torch.randn(64, HIDDEN)


def test_the_last_reader_of_a_released_input_runs_before_the_peak_it_would_lower():
    """With the saved activation released (dropped after its last read), the weight gradient runs
    first: the activation's 2 MiB are gone before the hidden gradient's 2 MiB are allocated. Not
    released, the activation stays alive anyway and program order is kept."""
    released = compile_and_check(mlp_backward, *mlp_inputs(), options={"released_inputs": [1]})
    kept = compile_and_check(mlp_backward, *mlp_inputs())
    assert len(matmul_order(kept)) == 2
    assert matmul_order(released) == matmul_order(kept)[::-1]


def test_an_input_with_another_reader_after_the_peak_is_not_counted_as_freed():
    def fn(grad, saved_activation, w2):
        hidden_grad, weight_grad = mlp_backward(grad, saved_activation, w2)
        return hidden_grad + saved_activation.sum(), weight_grad  # read again at the end: alive throughout

    released = compile_and_check(fn, *mlp_inputs(), options={"released_inputs": [1]})
    kept = compile_and_check(fn, *mlp_inputs())
    assert matmul_order(released) == matmul_order(kept)


def test_released_inputs_must_name_inputs_of_the_graph():
    args = mlp_inputs()
    graph = from_fx(make_fx(mlp_backward)(*args), args)
    with pytest.raises(GraphValidationError, match="options.released_inputs: input 3 does not exist"):
        compiler.compile(graph, "cpu", {"released_inputs": [1, 3]})
