"""Composite training ops against eager, forward and backward: softmax, log_softmax,
native_layer_norm (with and without weight/bias), cross_entropy, a transformer-style
MLP block; and matmuls, which must stay ATen calls (Extern steps). Backward graphs come
from torch.autograd.grad inside the traced function, as aot_autograd would give them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.lowering_cases import BF16, FLOAT32, FLOAT_DTYPES, INT64, check, rand, transposed

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on masked-off lanes


def _grads(outputs, inputs, grad_outputs):
    return list(torch.autograd.grad(outputs, inputs, grad_outputs))


def _leaf(x):
    return x.detach().requires_grad_(True)


# --- softmax / log_softmax -----------------------------------------------------------------------

@pytest.mark.parametrize("dim", [-1, 0])
@pytest.mark.parametrize("shape", [(7,), (3, 7), (2, 3, 5), (1, 1000)], ids=str)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_forward(name, dtype, shape, dim):
    fn = getattr(torch, name)
    check(lambda v: fn(v, dim), rand(shape, dtype) * 4)


@pytest.mark.parametrize("dim", [-1, 0])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_backward(name, dtype, dim):
    fn = getattr(torch, name)

    def run(x, g):
        x = _leaf(x)
        y = fn(x, dim)
        return [y] + _grads(y, x, g)

    check(run, rand((3, 7), dtype) * 3, rand((3, 7), dtype, seed=1))


def test_softmax_extreme_values_and_masking():
    x = torch.tensor([[1e4, 0.0, -1e4, 3.0], [float("-inf"), 1.0, 2.0, float("-inf")], [5.0, 5.0, 5.0, 5.0]])
    check(lambda v: (torch.softmax(v, -1), torch.log_softmax(v, -1)), x)


def test_softmax_non_contiguous_and_dtype_argument():
    check(lambda v: (torch.softmax(v, -1), torch.softmax(v, 0, dtype=FLOAT32)), transposed((5, 7), BF16))


def test_attention_scores_pattern():
    def fn(scores, mask):
        scores = scores.masked_fill(mask, float("-inf")) * 0.125
        return torch.softmax(scores, -1)

    mask = torch.triu(torch.ones(6, 6, dtype=torch.bool), diagonal=1)
    check(fn, rand((2, 6, 6)) * 3, mask)


# --- layer norm ---------------------------------------------------------------------------------

@pytest.mark.parametrize("affine", ["weight_bias", "weight_only", "none"])
@pytest.mark.parametrize("shape", [(7,), (3, 7), (2, 3, 16), (2, 1000)], ids=str)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_layer_norm_forward(dtype, shape, affine):
    n = shape[-1]
    w = rand((n,), dtype, seed=1) if affine != "none" else None
    b = rand((n,), dtype, seed=2) if affine == "weight_bias" else None

    def fn(x, *params):
        weight = params[0] if params else None
        bias = params[1] if len(params) > 1 else None
        out, mean, rstd = torch.ops.aten.native_layer_norm(x, [n], weight, bias, 1e-5)
        # CPU eager keeps bf16 statistics; the meta kernel (CUDA's semantics, which the compiler
        # follows) makes them float32: compare them as float32 with bf16's tolerance
        return out, mean.float(), rstd.float(), F.layer_norm(x, (n,), weight, bias)

    tolerance = {"atol": 2e-2, "rtol": 2e-2} if dtype == BF16 else {}
    check(fn, rand(shape, dtype) * 2 + 1, *[p for p in (w, b) if p is not None], **tolerance)


def test_layer_norm_over_two_dims():
    check(lambda x, w, b: torch.ops.aten.native_layer_norm(x, [3, 5], w, b, 1e-6),
          rand((4, 3, 5)), rand((3, 5), seed=1), rand((3, 5), seed=2))


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_layer_norm_backward(dtype, affine):
    n = 16

    def fn(x, g, *params):
        x = _leaf(x)
        params = [_leaf(p) for p in params]
        y = F.layer_norm(x, (n,), *params) if params else F.layer_norm(x, (n,))
        return [y] + _grads(y, [x] + params, g)

    params = [rand((n,), dtype, seed=2), rand((n,), dtype, seed=3)] if affine else []
    check(fn, rand((3, 5, n), dtype), rand((3, 5, n), dtype, seed=1), *params)


def test_native_layer_norm_backward_op():
    def fn(g, x, mean, rstd, w, b):
        return torch.ops.aten.native_layer_norm_backward(g, x, [7], mean, rstd, w, b, [True, True, True])

    x = rand((5, 7))
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [7], None, None, 1e-5)
    check(fn, rand((5, 7), seed=1), x, mean, rstd, rand((7,), seed=2), rand((7,), seed=3))


# --- cross entropy ------------------------------------------------------------------------------

def _cross_entropy(reduction: str, **kwargs):
    def fn(logits, target):
        logits = _leaf(logits)
        loss = F.cross_entropy(logits, target, reduction=reduction, **kwargs)
        return [loss] + _grads(loss, logits, torch.ones_like(loss))

    return fn


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_cross_entropy_forward_backward(dtype, reduction):
    check(_cross_entropy(reduction), rand((6, 11), dtype) * 2, rand((6,), INT64, low=0, high=11, seed=1))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_cross_entropy_mean_unfused(dtype):
    check(_cross_entropy("mean"), rand((6, 11), dtype) * 2, rand((6,), INT64, low=0, high=11, seed=1),
          options={"fusion": False})


@pytest.mark.parametrize("fusion", [True, False])
def test_cross_entropy_ignore_index_and_label_smoothing(fusion):
    def fn(logits, target):
        logits = _leaf(logits)
        loss = F.cross_entropy(logits, target, ignore_index=-100) + F.cross_entropy(logits, target.clamp(min=0),
                                                                                     label_smoothing=0.1)
        return [loss] + _grads(loss, logits, torch.ones_like(loss))

    target = torch.tensor([3, -100, 0, 10, -100, 7])
    check(fn, rand((6, 11)), target, options={"fusion": fusion})


@pytest.mark.parametrize("fusion", [True, False])
def test_loss_with_matmul_gradient(fusion):
    """The smallest graph found that shows the cycle: a count, a loss and a matmul gradient scaled by the count."""
    def fn(x, t, a, b):
        logp = torch.log_softmax(x, -1)
        count = (t != -100).sum().float()
        loss = -logp.gather(1, t.unsqueeze(1)).squeeze(1).sum() / count
        g = torch.mm(a, b) / count
        return loss, g - torch.exp(logp) * g.sum(-1, keepdim=True)

    inputs = rand((6, 11)), rand((6,), INT64, low=0, high=11, seed=1), rand((6, 4), seed=2), rand((4, 11), seed=3)
    result = check(fn, *inputs, expect_no_extern=False, options={"fusion": fusion})
    assert result.externs == ["aten.mm.default"]


def test_nll_loss_on_log_softmax():
    def fn(logits, target):
        logp = torch.log_softmax(logits, -1)
        return F.nll_loss(logp, target), logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)

    check(fn, rand((5, 9)), rand((5,), INT64, low=0, high=9, seed=1))


# --- matmuls stay extern -----------------------------------------------------------------------

@pytest.mark.parametrize("op", ["mm", "addmm", "bmm", "linear", "matmul"])
def test_matmuls_are_extern(op):
    a, b, c = rand((4, 6)), rand((6, 5), seed=1), rand((5,), seed=2)
    fns = {
        "mm": (lambda x, y, z: torch.mm(x, y).relu(), (a, b, c)),
        "addmm": (lambda x, y, z: torch.addmm(z, x, y) * 2, (a, b, c)),
        "bmm": (lambda x, y, z: torch.bmm(x, y) + 1, (rand((2, 4, 6)), rand((2, 6, 5), seed=1), c)),
        "linear": (lambda x, y, z: F.linear(x, y.t(), z), (a, b, c)),
        "matmul": (lambda x, y, z: torch.matmul(x, y) - z, (rand((2, 4, 6)), b, c)),
    }
    fn, inputs = fns[op]
    result = check(fn, *inputs, expect_no_extern=False)
    assert result.externs, "the matmul should run as an ATen call"
    assert set(result.externs) <= {"aten.mm.default", "aten.addmm.default", "aten.bmm.default"}, result.externs
    if op != "linear":  # linear's bias add happens inside addmm
        assert result.kernels, "the pointwise epilogue should be a generated kernel"


@pytest.mark.parametrize("dtype", [FLOAT32, BF16], ids=str)
def test_a_product_over_one_column_is_a_fused_outer_product(dtype):
    """LLaMA's rotary frequencies (`inv_freq @ positions`, K = 1), also from transposed and
    expanded operands: no ATen call, one kernel with the cos/sin readers. A stored product is the
    one the GEMM rounds once (equal to eager's bit for bit); read in the kernel, it stays float32,
    as every fused intermediate does (judged against float64: bf16 positions up to 512 round by 2)."""
    def rotary(inv_freq, positions):
        freqs = (inv_freq[None, :, None].expand(3, -1, 1) @ positions[:, None, :]).transpose(1, 2)
        emb = torch.cat((freqs, freqs), -1)
        return emb.cos(), emb.sin()

    inv_freq, positions = rand((19,), dtype, low=0.01, high=1.0), rand((3, 37), dtype, low=0.0, high=512.0)
    assert len(check(rotary, inv_freq, positions, reference64=True).kernels) == 1
    bmm = check(lambda x, y: torch.bmm(x, y), rand((3, 19, 1), dtype), rand((3, 1, 37), dtype, seed=1))
    assert torch.equal(bmm.outputs[0], bmm.expected[0])
    mm = check(lambda x, y: torch.mm(x.t(), y), transposed((1, 23), dtype), rand((1, 9), dtype, seed=1))
    assert torch.equal(mm.outputs[0], mm.expected[0])


def test_a_product_over_two_columns_stays_a_gemm():
    result = check(lambda x, y: torch.mm(x, y), rand((23, 2)), rand((2, 9), seed=1), expect_no_extern=False)
    assert result.externs == ["aten.mm.default"]


def test_matmul_of_transposed_and_computed_operands():
    result = check(lambda x, y: torch.mm(x.t().exp(), y[:, ::2]), transposed((6, 4)), rand((6, 10), seed=1),
                   expect_no_extern=False)
    assert result.externs == ["aten.mm.default"]


def test_linear_backward():
    def fn(x, w, b, g):
        x, w, b = _leaf(x), _leaf(w), _leaf(b)
        y = F.linear(x, w, b)
        return [y] + _grads(y, [x, w, b], g)

    result = check(fn, rand((3, 4, 6)), rand((5, 6), seed=1), rand((5,), seed=2), rand((3, 4, 5), seed=3),
                   expect_no_extern=False)
    assert set(result.externs) <= {"aten.mm.default", "aten.addmm.default", "aten.bmm.default"}, result.externs


# --- a transformer MLP block, forward and backward ----------------------------------------------

@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_transformer_block_pointwise_parts(dtype):
    """Residual + layer norm + gelu + dropout-free bias adds, without matmuls: no extern."""
    def fn(x, r, w, b, bias):
        x, r, w, b = _leaf(x), _leaf(r), _leaf(w), _leaf(b)
        h = x + r
        y = F.layer_norm(h, (8,), w, b)
        z = F.gelu(y + bias, approximate="tanh")
        loss = (z * z).mean()
        return [loss, z] + _grads(loss, [x, r, w, b], torch.ones_like(loss))

    check(fn, rand((2, 3, 8), dtype), rand((2, 3, 8), dtype, seed=1), rand((8,), dtype, seed=2),
          rand((8,), dtype, seed=3), rand((8,), dtype, seed=4))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_transformer_layer_forward_backward(dtype):
    """A pre-norm attention + MLP layer, forward and backward: only the matmuls may be ATen calls."""
    d, heads, seq = 8, 2, 5

    def fn(x, wqkv, wo, w1, w2, g1, b1, g2, b2, mask):
        params = [_leaf(p) for p in (x, wqkv, wo, w1, w2, g1, b1, g2, b2)]
        x, wqkv, wo, w1, w2, g1, b1, g2, b2 = params
        h = F.layer_norm(x, (d,), g1, b1)
        q, k, v = (h @ wqkv).split(d, dim=-1)
        q, k, v = (t.view(2, seq, heads, d // heads).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-1, -2)) * (d // heads) ** -0.5
        attn = torch.softmax(scores.masked_fill(mask, float("-inf")), -1)
        y = x + (attn @ v).transpose(1, 2).reshape(2, seq, d) @ wo
        z = y + F.gelu(F.layer_norm(y, (d,), g2, b2) @ w1, approximate="tanh") @ w2
        loss = z.float().pow(2).mean()
        return [loss] + _grads(loss, params, torch.ones_like(loss))

    mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)
    inputs = [rand((2, seq, d), dtype), rand((d, 3 * d), dtype, seed=1) * 0.3, rand((d, d), dtype, seed=2) * 0.3,
              rand((d, 4 * d), dtype, seed=3) * 0.3, rand((4 * d, d), dtype, seed=4) * 0.3, rand((d,), dtype, seed=5),
              rand((d,), dtype, seed=6), rand((d,), dtype, seed=7), rand((d,), dtype, seed=8), mask]
    result = check(fn, *inputs, expect_no_extern=False, reference64=True)
    assert set(result.externs) <= {"aten.mm.default", "aten.bmm.default", "aten.addmm.default"}, result.externs
