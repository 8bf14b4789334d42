"""Reduction lowerings against eager: sum, mean, amax, amin, prod, var, var_mean, std,
argmax, argmin, any, all, max.dim and min.dim over single dims, several dims, all dims,
negative dims, with and without keepdim; reductions of size 1, 1000 and 5000 (a huge
reduction with a tiny output), non-contiguous inputs, NaNs and ties."""

from __future__ import annotations

import pytest
import torch

from tests.lowering_cases import BF16, BOOL, FLOAT32, FLOAT_DTYPES, INT64, check, expanded, rand, strided, transposed

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on masked-off lanes

SHAPE = (3, 7, 5)
# dims argument -> as written in user code; None means "all dims" (the op's default overload)
DIMS = [0, 1, -1, -2, (0, 2), (1, 2), (-1, 0), (0, 1, 2), None]


def _reduce(name: str, dims, keepdim: bool):
    fn = getattr(torch, name)
    if dims is None:
        return lambda x: fn(x)
    return lambda x: fn(x, dims, keepdim=keepdim)


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dims", DIMS, ids=str)
@pytest.mark.parametrize("name", ["sum", "mean", "amax", "amin"])
def test_reduction_dims(name, dims, keepdim):
    check(_reduce(name, dims, keepdim), rand(SHAPE))


@pytest.mark.parametrize("dims", [0, -1, (0, 2), None], ids=str)
@pytest.mark.parametrize("name", ["sum", "mean", "amax", "amin", "prod"])
def test_reduction_bf16(name, dims):
    if name == "prod" and isinstance(dims, tuple):
        dims = dims[0]  # prod takes a single dim
    x = rand(SHAPE, BF16, low=0.5, high=1.5) if name == "prod" else rand(SHAPE, BF16)
    check(_reduce(name, dims, False), x)


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dim", [0, -1, None], ids=str)
def test_prod(dim, keepdim):
    x = rand(SHAPE, low=0.5, high=1.5)
    check(lambda v: torch.prod(v) if dim is None else torch.prod(v, dim, keepdim=keepdim), x)


@pytest.mark.parametrize("name", ["sum", "amax", "amin", "prod"])
def test_reduction_int64(name):
    x = rand(SHAPE, INT64, low=-3, high=4)
    fn = getattr(torch, name)
    several = 0 if name == "prod" else (0, 2)  # prod takes a single dim
    check(lambda v: (fn(v, -1), fn(v, several), fn(v)), x)


def test_sum_of_bool_and_int_promotes_to_int64():
    check(lambda b, i: (b.sum(), b.sum(-1), i.sum(0), torch.sum(i.to(torch.int32), 1)),
          rand((3, 7), BOOL), rand((3, 7), INT64))


def test_sum_with_dtype_argument():
    check(lambda v: (torch.sum(v, -1, dtype=FLOAT32), torch.sum(v, 0, dtype=torch.float64),
                     torch.mean(v, -1, dtype=FLOAT32)), rand((3, 7), BF16))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("size", [1, 7, 1000, 5000])
@pytest.mark.parametrize("name", ["sum", "mean", "amax", "amin"])
def test_reduction_sizes(name, size, dtype):
    """A whole vector to one value: size 1, a block-sized one and the looped 'huge reduction'."""
    check(lambda v: (getattr(torch, name)(v), getattr(torch, name)(v, 0, keepdim=True)), rand((size,), dtype))


@pytest.mark.parametrize("shape", [(1, 1000), (1000, 1), (2, 5000), (1000, 3)], ids=str)
def test_reduction_rows(shape):
    check(lambda v: (v.sum(-1), v.amax(0), v.mean(-1, keepdim=True)), rand(shape))


@pytest.mark.parametrize("layout", ["transposed", "strided", "expanded"])
@pytest.mark.parametrize("name", ["sum", "amax", "mean", "var"])
def test_reduction_non_contiguous(name, layout):
    x = {"transposed": transposed, "strided": strided, "expanded": expanded}[layout]((7, 5))
    fn = getattr(torch, name)
    check(lambda v: (fn(v, 0), fn(v, -1, keepdim=True), fn(v)), x)


def test_cumsum():
    """A short cumsum decomposes into a masked sum (prims.sum), lowered like any reduction."""
    check(lambda v: (torch.cumsum(v, -1), torch.cumsum(v, 0)), rand((3, 7)))


@pytest.mark.parametrize("dim", [-1, 1])
def test_long_scans_as_aten_calls_keep_their_neighbours_in_kernels(dim, monkeypatch):
    """SCAN_KERNELS off (the A/B switch that puts back the old rule): a scan past
    SCAN_KERNEL_MAX_LENGTH is an ATen call; the pointwise work before and after it still compiles to
    kernels (Mamba-2's segment sums: a masked fill, a cumsum along a non-innermost dim, an exp)."""
    from compiler.lowering import registry

    monkeypatch.setattr(registry, "SCAN_KERNELS", False)
    n = registry.SCAN_KERNEL_MAX_LENGTH + 7
    mask = torch.rand(n, n) > 0.3

    def fn(v):
        scanned = torch.cumsum(v.masked_fill(mask, 0.0) * 2, dim)
        return torch.exp(scanned.masked_fill(~mask, -1.0)), torch.cumprod(v[..., :5] * 0.1 + 1, 1)

    result = check(fn, rand((3, n, n)).transpose(1, 2), expect_no_extern=False)
    assert sorted(result.externs) == ["aten.cumprod.default", "aten.cumsum.default"]
    assert len(result.kernels) >= 2


def test_a_scan_at_the_length_limit_keeps_the_decomposition():
    """Short rows keep PyTorch's masked sums, which unroll into pointwise work (no scan kernel)."""
    from compiler.lowering.registry import SCAN_KERNEL_MAX_LENGTH

    result = check(lambda v: torch.cumsum(v, 1).exp(), rand((5, SCAN_KERNEL_MAX_LENGTH, 3)))
    assert not result.externs and "tl.cumsum" not in result.kernel_sources


def test_reduce_over_reduced():
    check(lambda v: (v.sum(-1).amax(0), (v - v.mean(-1, keepdim=True)).pow(2).sum()), rand((7, 33)))


# --- variance ------------------------------------------------------------------------------

@pytest.mark.parametrize("correction", [0, 1])
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dims", [0, -1, (0, 2), None], ids=str)
@pytest.mark.parametrize("name", ["var", "std", "var_mean"])
def test_variance(name, dims, keepdim, correction):
    fn = getattr(torch, name)
    check(lambda v: fn(v, dims, correction=correction, keepdim=keepdim), rand(SHAPE) * 3 + 2)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_variance_unbiased_flag_and_dtypes(dtype):
    x = rand((7, 33), dtype)
    check(lambda v: (torch.var(v, -1, unbiased=False), torch.std(v, 0, unbiased=True), torch.var(v), torch.std(v),
                     torch.var_mean(v, -1, unbiased=False)), x)


@pytest.mark.filterwarnings("ignore:var... degrees of freedom:UserWarning")  # size 1, correction 1
@pytest.mark.parametrize("size", [1, 1000, 5000])
def test_variance_sizes(size):
    """Size 1 with correction 1 divides by zero (inf/nan, as eager); large sizes stay stable."""
    x = rand((size,)) + 100.0  # a large mean: a naive sum-of-squares would lose the variance
    check(lambda v: (torch.var(v), torch.var(v, correction=0), torch.var_mean(v, 0, correction=0)), x)


# --- argmax/argmin, max.dim/min.dim ------------------------------------------------------------

@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dim", [0, 1, -1, None], ids=str)
@pytest.mark.parametrize("name", ["argmax", "argmin"])
@pytest.mark.parametrize("dtype", [FLOAT32, BF16, INT64], ids=str)
def test_arg_reductions(dtype, name, dim, keepdim):
    x = rand(SHAPE, dtype, low=-3, high=3) if dtype == INT64 else rand(SHAPE, dtype)  # INT64: ties, first wins
    check(lambda v: getattr(torch, name)(v, dim, keepdim=keepdim), x)


@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_arg_reductions_ties_and_nan(name):
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0], [float("nan"), 5.0, float("nan"), 9.0], [2.0, 2.0, 2.0, 2.0],
                      [-float("inf"), float("inf"), 0.0, float("inf")]])
    fn = getattr(torch, name)
    check(lambda v: (fn(v, -1), fn(v, 0), fn(v)), x)


@pytest.mark.parametrize("size", [1, 1000, 5000])
def test_arg_reductions_sizes(size):
    check(lambda v: (v.argmax(), v.argmin(0), v.argmax(0, keepdim=True)), rand((size,)))


@pytest.mark.parametrize("layout", ["transposed", "strided"])
def test_arg_reductions_non_contiguous(layout):
    x = {"transposed": transposed, "strided": strided}[layout]((7, 5))
    check(lambda v: (v.argmax(0), v.argmin(-1), v.argmax()), x)


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dim", [0, -1])
@pytest.mark.parametrize("dtype", [FLOAT32, BF16, INT64], ids=str)
def test_max_min_dim(dtype, dim, keepdim):
    x = rand(SHAPE, dtype, low=-3, high=3) if dtype == INT64 else rand(SHAPE, dtype)

    def fn(v):
        values, indices = torch.max(v, dim, keepdim=keepdim)
        low, where = torch.min(v, dim, keepdim=keepdim)
        return values, indices, low, where

    check(fn, x)


def test_max_min_with_nan():
    x = torch.tensor([[1.0, float("nan"), 3.0], [2.0, -1.0, 0.5]])
    check(lambda v: (torch.max(v, -1), torch.min(v, -1), v.amax(-1), v.amin(0), v.max(), v.min()), x)


def test_max_min_over_long_rows_with_nan_in_looped_kernels():
    """Rows too long for one block: the looped max/min (and softmax's online max) still let a NaN win.
    On the "cpu" target they reduce with tl.max / tl.min and a NaN count, not tl.reduce, whose combine
    the interpreter runs in Python."""
    x = rand((3, 5003), seed=4)
    x[1, 4000] = float("nan")
    result = check(lambda v: (v.amax(-1), v.amin(-1), v.max(), torch.softmax(v, -1)), x)
    sources = [result.artifact.kernel_source(k) for k in result.artifact.manifest["kernels"]]
    assert not [s for s in sources if "_fw_max_combine)" in s or "_fw_min_combine)" in s]


def test_max_min_full():
    check(lambda v, i: (v.max(), v.min(), i.max(), i.min()), rand(SHAPE), rand(SHAPE, INT64))


# --- any / all -------------------------------------------------------------------------------

@pytest.mark.parametrize("dims", [0, -1, (0, 1), None], ids=str)
@pytest.mark.parametrize("dtype", [BOOL, FLOAT32, INT64], ids=str)
@pytest.mark.parametrize("name", ["any", "all"])
def test_any_all(name, dtype, dims):
    x = rand(SHAPE, dtype, low=0, high=2) if dtype != BOOL else rand(SHAPE, BOOL)
    if dtype == FLOAT32:
        x = torch.floor(x)  # zeros and ones
    fn = getattr(torch, name)
    check(lambda v: fn(v) if dims is None else (fn(v, dims), fn(v, dims, keepdim=True)), x)


@pytest.mark.parametrize("value", [True, False])
def test_any_all_uniform(value):
    x = torch.full((1000,), value)
    check(lambda v: (v.any(), v.all(), v.any(0), v.all(0)), x)


# --- reductions in training graphs ------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_mean_backward_and_sum_backward(dtype):
    def fn(x):
        x = x.detach().requires_grad_(True)
        loss = x.mean(-1).sum() + (x * x).sum(0).mean()
        return loss, torch.autograd.grad(loss, x)[0]

    check(fn, rand((7, 5), dtype))


def test_amax_backward():
    def fn(x):
        x = x.detach().requires_grad_(True)
        y = x.amax(-1)
        return y, torch.autograd.grad(y.sum(), x)[0]

    check(fn, rand((7, 5)))


@pytest.mark.parametrize("name", ["var", "std", "max_dim", "logsumexp", "norm"])
def test_reduction_backward(name):
    forward = {"var": lambda x: x.var(-1), "std": lambda x: x.std(0), "max_dim": lambda x: x.max(-1).values,
               "logsumexp": lambda x: torch.logsumexp(x, -1), "norm": lambda x: torch.linalg.vector_norm(x, 2, -1)}[name]

    def fn(x):
        x = x.detach().requires_grad_(True)
        y = forward(x)
        return [y] + list(torch.autograd.grad(y, x, torch.ones_like(y)))

    check(fn, rand((4, 6)))


@pytest.mark.parametrize("dtype", [FLOAT32, BF16])
def test_values_that_repeat_along_the_reduced_dim_are_loaded_per_row_and_counted_per_element(dtype):
    """A load whose index has no reduction term (a per-row mean, a mask broadcast over the
    reduced dim) keeps the shape [XBLOCK, 1]; every reduction of it must still count each
    element of the row: its sum is value * length, its variance 0, its argmax the first."""
    def fn(x, per_row, mask):
        centered = x - per_row[:, None]
        repeated = per_row[:, None].expand(-1, x.shape[1])
        masked = torch.where(mask[None, :], x, 0.0)  # a reduction over dim 0: the mask is per output column
        return (centered.sum(1), repeated.sum(1), repeated.amax(1), repeated.var(1), repeated.argmax(1),
                (repeated - 1).amin(1), masked.sum(0))

    result = check(fn, rand((37, 301), dtype), rand((37,), dtype), rand((301,), BOOL))
    assert "+ xindex, xmask, other=0" in result.kernel_sources


def test_per_row_loads_in_a_looped_reduction_and_under_a_masked_op():
    # rows longer than one block (a loop over the row); a pad makes a masked load inside the row
    def fn(x, per_row):
        padded = torch.nn.functional.pad(x, (3, 0))
        return (padded - per_row[:, None]).sum(1), (x * per_row[:, None]).amax(1)

    check(fn, rand((9, 5000)), rand((9,)))


@pytest.mark.filterwarnings("ignore::UserWarning")  # eager's "degrees of freedom is <= 0"
@pytest.mark.parametrize("fn", [
    lambda x: torch.var_mean(x, correction=0),
    lambda x: torch.std_mean(x, dim=-1),
    lambda x: (x.sum(-1), x.mean(-1)),
], ids=["var_mean", "std_mean_dim", "sum_mean_dim"])
@pytest.mark.parametrize("shape", [(0,), (3, 0)], ids=str)
def test_reductions_over_no_elements_read_nothing_and_give_eagers_nan(fn, shape):
    """An empty row folds every index to a constant: the load stays masked (an unmasked one read
    past an empty tensor and crashed), and a mean over nothing is NaN, not 0."""
    check(fn, torch.randn(shape))


@pytest.mark.parametrize("fn, shapes", [
    (lambda x: torch.softmax(x, -1), [(0, 5)]),
    (lambda x: torch.log_softmax(x, -1), [(3, 0)]),
    (lambda x: torch.nn.functional.layer_norm(x, (4,)), [(0, 4)]),
    (lambda x: x.reshape(2, 0, 3).sum(1) + 1, [(0, 6)]),   # a view of no elements
    (lambda a, b: torch.cat([a, b]) * 2, [(0,), (0,)]),     # only legacy empty pieces
], ids=["softmax_no_rows", "log_softmax_empty_rows", "layer_norm_no_rows", "view_of_nothing", "cat_of_nothing"])
def test_ops_over_zero_size_tensors_compile_and_match_eager(fn, shapes):
    """OpInfo's later samples: each of these crashed the compiler (a division by zero in the split
    cost model, a view's index math dividing by a zero stride, an empty list of cat pieces)."""
    check(fn, *[torch.randn(s) for s in shapes])


def test_gather_from_a_0d_tensor():
    check(lambda x, i: torch.gather(x, 0, i) * 2, torch.tensor(3.5), torch.zeros(1, dtype=torch.int64))
