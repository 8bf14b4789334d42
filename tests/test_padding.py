"""Padded row strides (compiler.lowering.padding): kernels write matmul operands whose rows are
not 16-byte aligned with padded strides, never graph outputs, and results stay exact."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from client.runtime import load
from compiler import compile
from compiler.fx_import import from_fx
from compiler.ir import Layout
from compiler.lowering import lower
from compiler.lowering.padding import matmul_operands, padded_layout, viewed_by_outputs


def lowered(fn, *inputs):
    graph = from_fx(make_fx(fn)(*inputs), inputs)
    return graph, lower(graph)


def matmul_operand_layouts(program) -> list[tuple]:
    """(size, stride) of each buffer a matmul extern reads, seen through its base buffer."""
    found = []
    for node in program.nodes:
        if getattr(node, "target", "").split(".")[1:2] in (["mm"], ["addmm"], ["bmm"]):
            found += [(a.buffer.layout.size, a.buffer.layout.stride) for a in node.tensor_args()]
    return found


@pytest.mark.parametrize("dtype, row, padded_row", [
    (torch.bfloat16, 37, 40),      # 74-byte rows -> 80 bytes (16-byte alignment)
    (torch.float32, 37, 40),       # 148 -> 160
    (torch.bfloat16, 1031, 1088),  # wide rows: 128-byte alignment, as Inductor
    (torch.float32, 1031, 1056),
])
def test_kernel_results_that_feed_mm_get_padded_rows(dtype, row, padded_row):
    a, b = torch.randn(19, row, dtype=dtype), torch.randn(row, 9, dtype=dtype)

    def fn(a, b):
        return torch.mm(a * 2, b)

    graph, program = lowered(fn, a, b)
    assert ((19, row), (padded_row, 1)) in matmul_operand_layouts(program)
    run = load(compile(graph, "cpu"))
    torch.testing.assert_close(run(a, b)[0], fn(a, b))


def test_through_views_and_in_both_positions_of_a_transposed_product():
    # the cross-entropy gradient of a language model head: (batch, tokens, vocab) -> 2-D, then
    # grad @ W and grad.T @ x
    grad, w, x = torch.randn(2, 5, 33), torch.randn(33, 8), torch.randn(10, 8)

    def fn(grad, w, x):
        g = torch.softmax(grad, -1).view(10, 33)
        return torch.mm(g, w), torch.mm(g.t(), x)

    graph, program = lowered(fn, grad, w, x)
    rows = [stride[-2:] for size, stride in matmul_operand_layouts(program) if size[-1] == 33]
    assert rows and all(row == (36, 1) for row in rows), rows
    run = load(compile(graph, "cpu"))
    for got, want in zip(run(grad, w, x), fn(grad, w, x)):
        torch.testing.assert_close(got, want)


def test_graph_outputs_and_their_bases_are_never_padded():
    a, b = torch.randn(6, 37), torch.randn(37, 4)

    def fn(a, b):
        h = a + 1
        return torch.mm(h, b), h.view(2, 3, 37)

    graph, program = lowered(fn, a, b)
    assert matmul_operands(graph, viewed_by_outputs(graph)) == {}
    outputs = load(compile(graph, "cpu"))(a, b)
    assert outputs[1].stride() == (111, 37, 1)
    torch.testing.assert_close(outputs[1], (a + 1).view(2, 3, 37))


def test_a_reshape_that_merges_rows_keeps_the_dense_layout():
    # (6, 37) -> (2, 111) cannot view padded rows: the result is not padded, and still correct
    a, b, c = torch.randn(6, 37), torch.randn(37, 4), torch.randn(111, 3)

    def fn(a, b, c):
        h = a * 3
        return torch.mm(h, b), torch.mm(h.view(2, 111), c)

    graph, program = lowered(fn, a, b, c)
    assert all(stride == (37, 1) for size, stride in matmul_operand_layouts(program) if size == (6, 37))
    for got, want in zip(load(compile(graph, "cpu"))(a, b, c), fn(a, b, c)):
        torch.testing.assert_close(got, want)


def test_bmm_operands_of_three_dims():
    a, b = torch.randn(3, 7, 13), torch.randn(3, 13, 5)

    def fn(a, b):
        return torch.bmm(a.exp(), b)

    graph, program = lowered(fn, a, b)
    assert ((3, 7, 13), (112, 16, 1)) in matmul_operand_layouts(program)
    torch.testing.assert_close(load(compile(graph, "cpu"))(a, b)[0], fn(a, b))


def test_padded_layout_leaves_aligned_and_strided_layouts_alone():
    assert padded_layout(Layout.contiguous((4, 64), "bfloat16")).stride == (64, 1)
    assert padded_layout(Layout((4, 37), (1, 4), 0, "float32")).stride == (1, 4)  # column-major: not ours to pad
    assert padded_layout(Layout.contiguous((1, 37), "float32")).stride == (37, 1)  # a single row
    assert padded_layout(Layout.contiguous((2, 3, 37), "float32")).stride == (120, 40, 1)


def test_inputs_that_feed_matmuls_get_one_padded_copy_for_both_orientations(monkeypatch):
    # a backward graph's incoming gradient (a graph input: nothing computes it here) read as
    # grad @ W and grad.T @ x: one copy with padded rows serves both GEMMs
    import compiler.lowering.padding as padding

    monkeypatch.setattr(padding, "COPY_MIN_NUMEL", 64)
    monkeypatch.setattr(padding, "COPY_MIN_DIM", 4)
    grad, w, x = torch.randn(2, 5, 33), torch.randn(33, 8), torch.randn(10, 8)

    def fn(grad, w, x):
        g = grad.view(10, 33)
        return torch.mm(g, w), torch.mm(g.t(), x)

    graph, program = lowered(fn, grad, w, x)
    copies = [n for n in program.nodes if not hasattr(n, "target")]
    assert len(copies) == 1 and copies[0].stores[0].layout.stride == (36, 1)
    layouts = matmul_operand_layouts(program)
    assert ((10, 33), (36, 1)) in layouts
    run = load(compile(graph, "cpu"))
    for got, want in zip(run(grad, w, x), fn(grad, w, x)):
        torch.testing.assert_close(got, want)


def test_misaligned_products_are_zero_padded_and_sliced_back(monkeypatch):
    # M, K and N all odd: K is padded (both operands, zeros), M and N too since the product is no
    # graph output; the result is read as the corner of the padded product
    import compiler.lowering.padding as padding

    monkeypatch.setattr(padding, "PAD_MIN_WORK", 1000)
    monkeypatch.setattr(padding, "COPY_MIN_DIM", 4)
    a, b = torch.randn(19, 33), torch.randn(33, 13)

    def fn(a, b):
        return (torch.mm(a, b).relu() + 1,)

    graph, program = lowered(fn, a, b)
    mm = next(n for n in program.nodes if hasattr(n, "target"))
    assert [arg.layout.size for arg in mm.tensor_args()] == [(20, 36), (36, 16)]
    torch.testing.assert_close(load(compile(graph, "cpu"))(a, b)[0], fn(a, b)[0])


def test_a_product_that_is_an_output_keeps_its_shape(monkeypatch):
    import compiler.lowering.padding as padding

    monkeypatch.setattr(padding, "PAD_MIN_WORK", 1000)
    monkeypatch.setattr(padding, "COPY_MIN_DIM", 4)
    def fn(a, b):
        return (torch.bmm(a * 2, b),)

    # N misaligned: the product is padded and copied into the dense output; N aligned: K only,
    # the output is ATen's own result (a copy would buy nothing)
    for n, padded in ((13, [(3, 20, 36), (3, 36, 16)]), (16, [(3, 19, 36), (3, 36, 16)])):
        a, b = torch.randn(3, 19, 33), torch.randn(3, 33, n)
        graph, program = lowered(fn, a, b)
        bmm = next(n for n in program.nodes if hasattr(n, "target"))
        assert [arg.layout.size for arg in bmm.tensor_args()] == padded
        out = load(compile(graph, "cpu"))(a, b)[0]
        assert out.shape == (3, 19, n) and out.is_contiguous()
        torch.testing.assert_close(out, fn(a, b)[0])


@pytest.mark.parametrize("bias_shape", [(13,), (1, 13), (19, 13), (19, 1)])
def test_addmm_is_padded_with_its_bias_and_stays_one_call(monkeypatch, bias_shape):
    import compiler.lowering.padding as padding

    monkeypatch.setattr(padding, "PAD_MIN_WORK", 1000)
    monkeypatch.setattr(padding, "COPY_MIN_DIM", 4)
    bias, a, w = torch.randn(bias_shape), torch.randn(19, 33), torch.randn(13, 33)

    def fn(bias, a, w):
        return (torch.addmm(bias, a * 2, w.t(), beta=0.5, alpha=1.5).relu(),)

    graph, program = lowered(fn, bias, a, w)
    (addmm,) = [n for n in program.nodes if getattr(n, "target", "") == "aten.addmm.default"]
    sizes = [arg.layout.size for arg in addmm.tensor_args()]
    assert sizes[1:] == [(20, 36), (36, 16)]
    assert sizes[0] == tuple(16 if d == 13 else 20 if d == 19 else d for d in bias_shape)
    torch.testing.assert_close(load(compile(graph, "cpu"))(bias, a, w)[0], fn(bias, a, w)[0])


def test_a_padded_product_that_is_an_output_is_copied_with_eager_strides(monkeypatch):
    # BERT's logits: addmm(bias[30522], x, W.t()) returned to the caller; N is misaligned, so the
    # product is computed padded and copied into the dense output the caller expects
    import compiler.lowering.padding as padding

    monkeypatch.setattr(padding, "PAD_MIN_WORK", 1000)
    monkeypatch.setattr(padding, "COPY_MIN_DIM", 4)
    bias, x, w = torch.randn(37), torch.randn(2, 24, 64), torch.randn(37, 64)

    def fn(bias, x, w):
        logits = torch.addmm(bias, x.view(-1, 64), w.t()).view(2, 24, 37)
        return (logits, torch.log_softmax(logits.float(), -1))

    graph, program = lowered(fn, bias, x, w)
    (addmm,) = [n for n in program.nodes if getattr(n, "target", "") == "aten.addmm.default"]
    assert [arg.layout.size for arg in addmm.tensor_args()][2] == (64, 40)
    got = load(compile(graph, "cpu"))(bias, x, w)
    assert got[0].shape == (2, 24, 37) and got[0].stride() == (888, 37, 1)
    for a, b in zip(got, fn(bias, x, w)):
        torch.testing.assert_close(a, b)


def test_small_and_aligned_operands_are_never_copied():
    a, b = torch.randn(12, 32), torch.randn(32, 33)  # aligned rows; the (32, 33) one is small

    def fn(a, b):
        return (torch.mm(a, b),)

    graph, program = lowered(fn, a, b)
    assert program.nodes and all(hasattr(n, "target") for n in program.nodes)  # the mm alone
