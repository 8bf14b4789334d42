"""Indexing lowerings against eager: embedding and its dense backward, gather,
index_select, x[idx] (index.Tensor) with one or several index tensors, negative
indices; and the scatter-style ops the backward passes need."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.lowering_cases import BF16, FLOAT32, FLOAT_DTYPES, INT64, check, rand, transposed

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on masked-off lanes


def _indices(shape, high, low=0, seed=1):
    return rand(shape, INT64, low=low, high=high, seed=seed)


# --- embedding ---------------------------------------------------------------------------------

@pytest.mark.parametrize("index_shape", [(1,), (7,), (3, 7), (2, 1, 4)], ids=str)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_embedding(dtype, index_shape):
    check(lambda w, i: (F.embedding(i, w), F.embedding(i, w) * 2), rand((10, 6), dtype), _indices(index_shape, 10))


def test_embedding_large_table_and_non_contiguous_weight():
    check(lambda w, t, i: (F.embedding(i, w), F.embedding(i, t)), rand((1000, 4)), transposed((13, 5)),
          _indices((3, 7), 13))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_embedding_dense_backward(dtype):
    """Repeated indices must accumulate. With this few indices it stays ATen's own embedding
    backward (one kernel on a GPU): never its decomposition, index_put with accumulate, which ran
    as ATen's generic index_put_, many times slower on a GPU (docs/PERF.md, real models)."""
    def fn(w, i, g):
        w = w.detach().requires_grad_(True)
        out = F.embedding(i, w)
        return [out] + list(torch.autograd.grad(out, w, g))

    indices = torch.tensor([[1, 3, 1, 0], [3, 3, 9, 1]])
    result = check(fn, rand((10, 6), dtype), indices, rand((2, 4, 6), dtype, seed=2), expect_no_extern=False)
    assert result.externs == ["aten.embedding_dense_backward.default"]


def test_embedding_dense_backward_op_with_padding_idx():
    def fn(g, i):
        return torch.ops.aten.embedding_dense_backward(g, i, 10, 1, False)

    result = check(fn, rand((2, 4, 6)), torch.tensor([[1, 3, 1, 0], [3, 3, 9, 1]]), expect_no_extern=False)
    assert result.externs == ["aten.embedding_dense_backward.default"]


@pytest.mark.parametrize("dtype", [FLOAT32, BF16], ids=str)
@pytest.mark.parametrize("padding_idx", [-1, 5])
def test_embedding_dense_backward_of_many_indices_scatters_in_float32(dtype, padding_idx):
    """Past ATen's sort threshold, into a table where rows collide little: the rows are added by
    one index_add_ into a float32 table (the grad read through a transposed view, scaled on the
    way), padding_idx's row left zero; error at most eager's against a float64 run."""
    from compiler.lowering.indexing import ATEN_SORTS_ABOVE

    count, rows = (ATEN_SORTS_ABOVE // 61 + 1) * 61, 397
    indices = _indices((count // 61, 61), rows)
    grad = rand((24, count), dtype).t().reshape(count // 61, 61, 24)

    def fn(g, i):
        return torch.ops.aten.embedding_dense_backward(g * 2, i, rows, padding_idx, False)

    result = check(fn, grad, indices, expect_no_extern=False, atol=0.5 if dtype == BF16 else None)
    assert result.externs == ["aten.index_add_.default"]
    reference = fn(grad.double(), indices)
    (got,), eager = result.outputs, fn(grad, indices)
    assert (got.double() - reference).abs().max() <= (eager.double() - reference).abs().max() + 1e-6
    if padding_idx >= 0:
        assert not got[padding_idx].any() and got[padding_idx + 1].any()


@pytest.mark.parametrize("count, rows", [(4000, 30), (3000, 5000)], ids=["crowded rows", "few indices"])
def test_embedding_dense_backward_keeps_atens_op_where_it_is_faster(count, rows):
    def fn(g, i):
        return torch.ops.aten.embedding_dense_backward(g, i, rows, -1, False)

    result = check(fn, rand((count, 8)), _indices((count,), rows), expect_no_extern=False)
    assert result.externs == ["aten.embedding_dense_backward.default"]


# --- gather / index_select ----------------------------------------------------------------------

@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("dtype", [FLOAT32, BF16, INT64], ids=str)
def test_gather(dtype, dim):
    x = rand((5, 7), dtype)
    size = x.shape[dim]
    index = _indices((3, 4) if dim == 0 else (5, 3), size)
    check(lambda v, i: (torch.gather(v, dim, i), v.gather(dim, i) * 2), x, index)


def test_gather_3d_and_non_contiguous():
    check(lambda v, i: torch.gather(v, 1, i), transposed((2, 6, 3)), _indices((2, 4, 3), 6))


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("index_len", [1, 4, 9])
def test_index_select(dim, index_len):
    x = rand((5, 7, 3))
    check(lambda v, i: torch.index_select(v, dim, i), x, _indices((index_len,), x.shape[dim]))


def test_index_select_and_gather_repeated_indices():
    check(lambda v, i: (torch.index_select(v, 0, i), torch.gather(v, 1, i.view(-1, 1).expand(-1, 3) % 4)),
          rand((6, 4)), torch.tensor([1, 0, 5, 5, 2, 2]))


# --- index.Tensor -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [FLOAT32, BF16, INT64, torch.bool], ids=str)
def test_index_leading_dim(dtype):
    check(lambda v, i: (v[i], v[i] if dtype == torch.bool else v[i] * 2), rand((6, 5), dtype), _indices((4,), 6))


def test_index_inner_dim_and_2d_index():
    check(lambda v, i, j: (v[:, i], v[j], v[:, :, i[:2]], v[1:, j]), rand((6, 5, 4)), _indices((3,), 4),
          _indices((2, 3), 5, seed=2))


def test_index_several_tensors():
    x = rand((6, 5, 4))
    i, j = _indices((3,), 6), _indices((3,), 5, seed=2)
    check(lambda v, a, b: (v[a, b], v[a, b, 1], v[:, b, a[:1] % 4]), x, i, j)


def test_index_broadcast_indices():
    check(lambda v, a, b: v[a.view(3, 1), b.view(1, 4)], rand((6, 5)), _indices((3,), 6), _indices((4,), 5, seed=2))


def test_index_negative_indices():
    check(lambda v, i: (v[i], v[:, i]), rand((6, 6)), torch.tensor([-1, -6, 0, 3, -2]))


def test_index_non_adjacent_tensors():
    """v[a, :, b] puts the broadcast index dims first (PyTorch's rule for non-adjacent indices)."""
    a, b = _indices((3,), 6), _indices((2, 1), 4, seed=2)
    check(lambda v, i, j: (v[i, :, j[0]], v[i, :, j], v[j[:, 0], 1:, j[:, 0]]), rand((6, 5, 4)), a, b)


# --- scatter-style ops (the backward of the ops above) --------------------------------------------

def test_index_select_and_gather_backward():
    def fn(x, i, g, h):
        x = x.detach().requires_grad_(True)
        a = torch.index_select(x, 0, i)
        b = torch.gather(x, 1, i[:3].view(3, 1).expand(3, 2) % 4)
        return [a, b] + list(torch.autograd.grad([a, b], x, [g, h]))

    result = check(fn, rand((6, 4)), torch.tensor([1, 5, 1, 0]), rand((4, 4), seed=1), rand((3, 2), seed=2),
                   expect_no_extern=False)
    assert result.externs == ["aten.index_put.default"]  # index_select's backward: index_add over 4 rows


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_scatter_and_scatter_add(dim):
    """Short index along the dim: unrolled compares, no ATen call. The index may be smaller than x
    in the other dims (those elements keep x's value); scatter's index has no duplicates here
    (which entry wins is unspecified in eager)."""
    x = rand((4, 5))
    index = torch.stack([torch.randperm(x.shape[dim], generator=torch.Generator().manual_seed(i))[:2] for i in range(3)],
                        dim=1 if dim == 0 else 0)  # (2, 3) along dim 0, (3, 2) otherwise
    src = rand((5, 5), seed=1)
    check(lambda v, i, s: (torch.scatter(v, dim, i, s), torch.scatter(v, dim, i, -2.5), torch.scatter_add(v, dim, i, s)),
          x, index, src)


def test_scatter_add_duplicates_accumulate():
    index = torch.tensor([[0, 0, 2], [1, 1, 1]])
    check(lambda v, i, s: torch.scatter_add(v, 1, i, s), rand((2, 4)), index, rand((2, 3), seed=1))


def test_one_hot_by_scatter():
    """nll_loss_backward's pattern: zeros.scatter(1, target[:, None], -1.0)."""
    check(lambda t, g: torch.zeros(6, 11).scatter(1, t.unsqueeze(1), -1.0) * g, _indices((6,), 11), rand((6, 1)))


def test_scatter_ops_that_stay_extern():
    def fn(x, i, t):
        return torch.index_add(x, 0, i[:, 0], t), x.index_put((i[:, 0] // 2,), t, accumulate=True), \
            torch.scatter_add(x, 1, i.repeat(1, 10) % 5, t.repeat(1, 4))

    index = torch.tensor([[0, 1], [3, 2], [2, 0], [1, 4]])
    result = check(fn, rand((4, 5)), index, rand((4, 5), seed=2), expect_no_extern=False)
    assert sorted(set(result.externs)) == ["aten.index_put.default", "aten.scatter_add.default"], result.externs
