"""Shape lowerings against eager: views as index remaps (view/reshape of non-contiguous
inputs, permute, transpose, t, expand, squeeze, unsqueeze, slice with steps, select),
tensors assembled from pieces (cat, stack, constant_pad_nd, split, chunk, repeat),
clone/contiguous, and copy_ into a slice of an input."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import compiler
from compiler.fx_import import from_fx
from compiler.lowering import masked_pieces, shapes
from tests.lowering_cases import BF16, BOOL, FLOAT32, INT64, check, expanded, rand, strided, transposed

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on masked-off lanes

DTYPES = [FLOAT32, BF16, INT64, BOOL]
SOURCES = {"contiguous": rand, "transposed": transposed, "strided": strided, "expanded": expanded}


def _source(layout: str, shape, dtype=FLOAT32):
    return SOURCES[layout](shape, dtype)


# --- views -------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", list(SOURCES))
@pytest.mark.parametrize("target", [(35,), (5, 7), (7, 5), (-1,), (1, 35, 1), (5, 1, 7)], ids=str)
def test_reshape(target, layout):
    """reshape of a (7, 5) tensor: a view where strides allow, an index remap elsewhere."""
    check(lambda v: (v.reshape(target) * 2, v.reshape(target)), _source(layout, (7, 5)))


@pytest.mark.parametrize("layout", list(SOURCES))
def test_view_3d(layout):
    x = _source(layout, (4, 3, 6))
    check(lambda v: (v.reshape(12, 6), v.reshape(4, 18), v.reshape(2, 2, 3, 3, 2), v.reshape(-1, 3)), x)


def test_view_of_contiguous_keeps_storage():
    check(lambda v: (v.view(5, 7), v.view(-1), v.view(35, 1)), rand((7, 5)))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_view_dtypes(dtype):
    check(lambda v: (v.view(3, 7).t(), v.reshape(21)), rand((7, 3), dtype))


@pytest.mark.parametrize("dims", [(0, 1, 2), (2, 0, 1), (1, 2, 0), (2, 1, 0), (-1, 0, 1)], ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
def test_permute(dims, layout):
    check(lambda v: (v.permute(dims), v.permute(dims) + 1, v.permute(dims).reshape(-1)), _source(layout, (3, 4, 5)))


@pytest.mark.parametrize("dims", [(0, 1), (1, 2), (0, 2), (-1, -2)], ids=str)
def test_transpose(dims):
    check(lambda v: (v.transpose(*dims), v.transpose(*dims).contiguous(), v.transpose(*dims) * 2), rand((3, 4, 5)))


@pytest.mark.parametrize("shape", [(7,), (3, 7), (1, 5)], ids=str)
def test_t(shape):
    check(lambda v: (v.t(), v.t() + 1, v.t().contiguous()), rand(shape))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_expand(dtype):
    check(lambda a, b: (a.expand(4, 3, 7), b.expand(3, 7) * 1, a.expand(2, -1, -1).contiguous(), b.expand_as(a)),
          rand((3, 7), dtype), rand((3, 1), dtype, seed=1))


def test_broadcast_to_and_expand_of_expanded():
    check(lambda v: (torch.broadcast_to(v, (2, 7, 5)).sum(0), v.expand(3, 7, 5) + 1), expanded((7, 5)))


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_squeeze_unsqueeze(layout):
    x = _source(layout, (1, 7, 1, 5))
    check(lambda v: (v.squeeze(), v.squeeze(0), v.squeeze(2), v.squeeze(-1), v.squeeze((0, 2)), v.unsqueeze(0),
                     v.unsqueeze(-1), v.unsqueeze(2) * 2, v.squeeze().unsqueeze(1)), x)


@pytest.mark.parametrize("layout", list(SOURCES))
def test_slice_with_steps(layout):
    x = _source(layout, (9, 8))
    check(lambda v: (v[1:7], v[::2], v[1::3, 2:7:2], v[:, -3:], v[-5:-1:2], v[:, ::4] * 2, v[7:100], v[2:3, 5:6]), x)


@pytest.mark.parametrize("dtype", [FLOAT32, BF16, INT64], ids=str)
def test_slice_of_computed_value(dtype):
    check(lambda v: ((v * 2)[1::2], (v + 1)[:, 1:4].sum(-1) if dtype != INT64 else (v + 1)[:, 1:4]), rand((7, 6), dtype))


@pytest.mark.parametrize("layout", list(SOURCES))
def test_select(layout):
    x = _source(layout, (4, 7, 5))
    check(lambda v: (v[0], v[-1], v[:, 3], v[:, :, -2], v[2, 1], v.select(1, 0) * 3, v[1][2][3]), x)


@pytest.mark.parametrize("dims", [(0,), (-1,), (0, 1)], ids=str)
def test_flip(dims):
    check(lambda v: (torch.flip(v, dims), torch.flip(v, dims) * 2), transposed((4, 5)))


def test_narrow_and_unbind():
    check(lambda v: (v.narrow(0, 1, 3), v.narrow(-1, 1, 2), *v.unbind(1)), rand((5, 3)))


@pytest.mark.parametrize("layout", list(SOURCES))
def test_clone_contiguous(layout):
    x = _source(layout, (7, 5))
    check(lambda v: (v.clone(), v.contiguous(), v.t().contiguous(), v.clone(memory_format=torch.contiguous_format)), x)


def test_chain_of_views_of_computed_value():
    check(lambda v: (v.exp().t().reshape(5, 7)[1:, ::2].unsqueeze(0).expand(2, -1, -1) + 1), rand((7, 5)))


# --- cat / stack ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat_two(dim, dtype):
    a = rand((3, 4), dtype)
    b = rand((3, 4), dtype, seed=1) if dim == 0 else rand((3, 2), dtype, seed=1)
    if dim == 0:
        b = rand((2, 4), dtype, seed=1)
    check(lambda x, y: torch.cat([x, y], dim), a, b)


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_cat_three_pieces(dim):
    sizes = [[2, 3, 4], [2, 3, 4], [2, 3, 4]]
    for i, extra in enumerate((1, 3, 2)):
        sizes[i][dim] = extra
    pieces = [rand(s, seed=i) for i, s in enumerate(sizes)]
    check(lambda a, b, c: (torch.cat([a, b, c], dim), torch.cat([a, b, c], dim) * 2), *pieces)


def test_cat_non_contiguous_and_computed_pieces():
    check(lambda a, b, c: torch.cat([a.exp(), b, c[:, ::2]], 1), transposed((3, 4)), strided((3, 2)), rand((3, 6), seed=2))


def test_cat_same_tensor_twice_and_size_one_pieces():
    check(lambda a, b: (torch.cat([a, a], 0), torch.cat([a[:1], b, a[-1:]], 0)), rand((3, 5)), rand((1, 5), seed=1))


def test_cat_mixed_dtypes_promotes():
    check(lambda a, b: torch.cat([a, b], 0), rand((2, 3), BF16), rand((1, 3), FLOAT32, seed=1))


def test_cat_size_1000():
    check(lambda a, b: torch.cat([a, b]), rand((1000,)), rand((7,), seed=1))


def interleaved_position_embedding(sin_a, cos_a, sin_b, cos_b):
    """EdgeNeXt's: two stacks of sin and cos interleaved along a new last dim, flattened, concatenated."""
    first = torch.stack([sin_a, cos_a], 4).view(*sin_a.shape[:3], -1)
    second = torch.stack([sin_b, cos_b], 4).view(*sin_b.shape[:3], -1)
    return torch.cat([second, first], 3).permute(0, 3, 1, 2)


def index_divisions(source: str) -> int:
    return source.count("//") + source.count("%")


def test_a_cat_of_flattened_stacks_reads_its_producers_without_extra_divisions(monkeypatch):
    """The pieces' lengths (32) divide the cat's (64): each piece's index wraps, so the divisions that
    unflatten it into the stacks' dims join with the cat dim's own (lowering/shapes.py)."""
    pieces = [rand((2, 3, 5, 16), seed=i) for i in range(4)]
    wrapped = check(interleaved_position_embedding, *pieces).kernel_sources
    monkeypatch.setattr(shapes, "WRAPPED_PIECE_INDEX", False)
    bounded = check(interleaved_position_embedding, *pieces).kernel_sources  # masked_pieces joins them too
    monkeypatch.setattr(masked_pieces, "BOUNDED_PIECE_INDEX", False)
    plain = check(interleaved_position_embedding, *pieces).kernel_sources
    assert index_divisions(wrapped) < index_divisions(plain) and index_divisions(bounded) < index_divisions(plain)


def class_token_backward(grad, conv_grad):
    """CoaT's: the gradient of [class token; patch tokens] split again, the patch tokens' part
    reshaped to an image, added to a channels-last convolution's gradient, and padded back."""
    batch, tokens, channels = grad.shape
    side = conv_grad.shape[-1]
    image = grad[:, 1:].permute(0, 2, 1).reshape(batch, channels, side, side) + conv_grad
    back = image.reshape(batch, channels, side * side).permute(0, 2, 1)
    padded = torch.zeros_like(grad).slice_scatter(back, 1, 1)
    return padded + F.pad(grad[:, :1], (0, 0, 0, tokens - 1))


def class_token_forward(class_token, conv_out):
    """CoaT's and ViT's: a channels-last image's pixels as tokens after a class token."""
    batch, channels, side, _ = conv_out.shape
    tokens = conv_out.reshape(batch, channels, side * side).permute(0, 2, 1) * 2
    return torch.cat([class_token.expand(batch, -1, -1), tokens], 1)


def test_masked_pieces_read_through_views_without_the_divisions_of_their_offset(monkeypatch):
    """A piece loaded at `x - 1` (slice_scatter, pad, cat) of a reshaped channels-last tensor: with the
    piece's index known to lie in it (lowering/masked_pieces.py), the reshapes' divisions join and
    the channels-last tensor is read at a plain offset (sm_90 kernels, where the reshaped sum is
    inlined into the pad); the values are eager's either way."""
    grad, conv_grad = rand((2, 26, 8)), rand((2, 8, 5, 5), seed=1).to(memory_format=torch.channels_last)
    class_token = rand((1, 1, 8), seed=2)
    check(class_token_backward, grad, conv_grad)
    check(class_token_forward, class_token, conv_grad)
    bounded = gpu_kernel_sources(class_token_backward, grad, conv_grad)
    monkeypatch.setattr(masked_pieces, "BOUNDED_PIECE_INDEX", False)
    check(class_token_backward, grad, conv_grad)
    check(class_token_forward, class_token, conv_grad)
    assert index_divisions(bounded) < index_divisions(gpu_kernel_sources(class_token_backward, grad, conv_grad))


def gated_cat_backward(gated, gate, first, second, conv):
    """Mamba-2's gate backward: a cat whose first piece is a reshaped product, read across its rows
    (permuted) beside a convolution's output: a kernel 2D-tiled along the cat's dim."""
    joined = torch.cat([(gated * gate.unsqueeze(-1)).view(2, 64, 40), first, second], 2).permute(0, 2, 1)
    return joined * conv[:, :, :64]


def test_a_piece_at_offset_zero_tiled_along_the_cat_reads_its_producer_at_a_plain_offset(monkeypatch):
    """The first piece is loaded at the cat dim's bare symbol; in a tiled kernel rindex stands there,
    over the whole cat (56), and the piece (40) is placed like any other (masked_pieces.py)."""
    inputs = [rand((2, 64, 5, 8)), rand((2, 64, 5), seed=1), rand((2, 64, 8), seed=2), rand((2, 64, 8), seed=3),
              rand((2, 56, 67), seed=4)]
    check(gated_cat_backward, *inputs)
    placed = gpu_kernel_sources(gated_cat_backward, *inputs)
    monkeypatch.setattr(masked_pieces, "BARE_SYMBOLS_PLACED", False)
    check(gated_cat_backward, *inputs)
    assert index_divisions(placed) < index_divisions(gpu_kernel_sources(gated_cat_backward, *inputs))


def relative_logits_to_absolute(logits):
    """HaloNet's and BoTNet's rel_logits_1d: each row's [W, 2W - 1] logits padded by a column, flattened,
    padded by W - 1 more, and viewed as [W + 1, 2W - 1], every row shifted by one (pads after the end only;
    the model slices the result, in a kernel of its own in both models' captures)."""
    rows, width, span = logits.shape
    flat = F.pad(logits, (0, 1)).reshape(rows, width * (span + 1))
    return F.pad(flat, (0, span - width)).reshape(rows, width + 1, span)


def test_a_pad_after_the_end_reads_its_views_at_rows_the_bound_joins(monkeypatch):
    """Inside a pad that adds after the end, the index lies below the piece's size (END_PAD_PLACED):
    the division that a view puts beneath it joins with the row's, where unbounded it carries a
    `(x // 207 + (x % 207) // 192) % rows` term; the values are eager's either way."""
    logits = rand((6, 5, 9))
    check(relative_logits_to_absolute, logits)
    placed = gpu_kernel_sources(relative_logits_to_absolute, logits)
    monkeypatch.setattr(shapes, "END_PAD_PLACED", False)
    check(relative_logits_to_absolute, logits)
    assert index_divisions(placed) < index_divisions(gpu_kernel_sources(relative_logits_to_absolute, logits))


def test_a_slice_from_the_start_or_to_the_end_is_tested_on_one_side(monkeypatch):
    """slice_scatter over [0, 3) tests `< 3` only, over [5, 9) `>= 5` only; the values are eager's."""
    def fn(x, head, tail):
        return x.slice_scatter(head, 1, 0, 3) * 2, x.slice_scatter(tail, 1, 5) + 1

    inputs = rand((6, 9)), rand((6, 3), seed=1), rand((6, 4), seed=2)
    one_sided = check(fn, *inputs).kernel_sources
    assert ">= 0" not in one_sided and "< 9" not in one_sided and "< 3" in one_sided and ">= 5" in one_sided
    monkeypatch.setattr(shapes, "ONE_SIDED_SLICE_MASKS", False)
    assert ">= 0" in check(fn, *inputs).kernel_sources


def gpu_kernel_sources(fn, *inputs: torch.Tensor) -> str:
    """The kernels' Triton sources for an H100 (nothing run), heuristic configs."""
    artifact = compiler.compile(from_fx(make_fx(fn)(*inputs), list(inputs)), "cuda:sm_90",
                                {"autotune": False, "benchmark_fusion": False})
    return "\n".join(artifact.kernel_source(k) for k in artifact.manifest["kernels"])


def test_a_piece_whose_length_does_not_divide_the_cat_keeps_a_plain_offset(monkeypatch):
    """ReXNet's channel cat (27 + 11 of 38): a modulo by 27 in every element cost more than it saved."""
    def fn(a, b):
        return torch.cat([a * 2, b], 1)

    inputs = rand((2, 5, 3, 4), seed=1), rand((2, 3, 3, 4), seed=2)
    source = check(fn, *inputs).kernel_sources
    monkeypatch.setattr(shapes, "WRAPPED_PIECE_INDEX", False)
    assert source == check(fn, *inputs).kernel_sources


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_stack(dim):
    check(lambda a, b, c: (torch.stack([a, b], dim), torch.stack([a, b, c], dim)),
          rand((3, 4)), transposed((3, 4), seed=1), rand((3, 4), seed=2))


# --- padding -----------------------------------------------------------------------------------

PADS = [(1, 2), (0, 3), (2, 0, 1, 1), (-1, 2), (1, -2), (-1, -1, 1, 0), (3, 3, 0, 0, 1, 1),  # last dim first
        (0, 0, 0, 0, 0, 0), (0, 0, -1, 0), (0, 2, 0, 0)]


@pytest.mark.parametrize("pad", PADS, ids=str)
@pytest.mark.parametrize("dtype", [FLOAT32, BF16, INT64], ids=str)
def test_constant_pad_nd(pad, dtype):
    value = 2 if dtype == INT64 else -1.5
    check(lambda v: (F.pad(v, pad), F.pad(v, pad, value=value)), rand((2, 4, 5), dtype))


def test_pad_non_contiguous():
    check(lambda v: F.pad(v, (1, 1, -1, 2), value=3.0), transposed((4, 5)))


def test_a_pad_of_zeros_after_a_layer_norm_reuses_the_row_in_registers():
    """Swin pads its windows by zeros when the size divides: that pad is a copy, with no bound
    check, so the normalization's consumer reads x once (no masked second load)."""
    def fn(x, weight, bias):
        y = F.layer_norm(x, (x.shape[-1],), weight, bias)
        return F.pad(y, (0, 0, 0, 0, 0, 0)).view(2, 2, 3, 2, 3, 12).permute(0, 1, 3, 2, 4, 5).contiguous()

    result = check(fn, rand((2, 6, 6, 12), BF16), rand((12,), BF16), rand((12,), BF16), atol=2e-2, rtol=2e-2)
    assert result.kernel_sources.count("tl.load(ptr_arg0") == 1


# --- roll ---------------------------------------------------------------------------------------

ROLLS = [(1, 0), (-2, 1), (7, 1), (-9, 0), ((1, -3), (0, 1)), ((2, 3), (1, 1)), ((0, 5), (0, 1)), (3, None)]


@pytest.mark.parametrize("shifts,dims", ROLLS, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
def test_roll(shifts, dims, layout):
    """Shifts beyond the size, negative, of zero, a dim rolled twice, and no dims (the
    flattened tensor rolls) against eager, fused with pointwise work."""
    check(lambda v: (torch.roll(v, shifts, dims) * 2 + 1, torch.roll(v, shifts, dims)), _source(layout, (5, 6)))


def test_rolled_windows_index_without_a_signed_remainder():
    """Swin's shifted windows: the roll is index math, (i + n - shift) % n, with no per-element
    int64 remainder and sign fix-up."""
    def fn(x):
        return torch.roll(x, (-3, -3), (1, 2)).view(2, 2, 4, 2, 4, 6).permute(0, 1, 3, 2, 4, 5).contiguous()

    result = check(fn, rand((2, 8, 8, 6), BF16))
    sources = result.kernel_sources
    assert "% 8" in sources and "tl.abs" not in sources and "int64" not in sources


# --- split / chunk / repeat ---------------------------------------------------------------------

@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_split(size, dim):
    check(lambda v: [p * 1 for p in torch.split(v, size, dim)] + list(torch.split(v, size, dim)), rand((7, 6)))


@pytest.mark.parametrize("dim", [1, -1])
def test_split_unfused(dim):
    check(lambda v: [p * 1 for p in torch.split(v, 1, dim)] + list(torch.split(v, 1, dim)), rand((7, 6)),
          options={"fusion": False})


def test_neighbouring_columns_fused():
    check(lambda v: (v[:, 0] * 1, v[:, 1] * 1), rand((7, 6)))


def test_split_with_sizes():
    check(lambda v: [p + 1 for p in torch.split(v, [1, 4, 2], 0)] + [p for p in v.split([3, 3], -1)], rand((7, 6)))


@pytest.mark.parametrize("chunks", [1, 2, 3, 4])
def test_chunk(chunks):
    check(lambda v: [p * 2 for p in torch.chunk(v, chunks, -1)] + [p for p in v.chunk(chunks, 0)], transposed((7, 6)))


def test_qkv_split_pattern():
    """A fused qkv projection split into heads: split, view, permute."""
    def fn(qkv):
        q, k, v = qkv.split(8, dim=-1)
        return [t.view(2, 3, 2, 4).permute(0, 2, 1, 3).contiguous() for t in (q, k, v)]

    check(fn, rand((2, 3, 24)))


@pytest.mark.parametrize("repeats", [(2,), (1, 3), (2, 1, 2)], ids=str)
def test_repeat(repeats):
    check(lambda v: v.repeat(*repeats), rand((3,) if len(repeats) == 1 else (2, 3)))


# --- copy_ into views of inputs ---------------------------------------------------------------

def test_copy_into_slice_of_input():
    def fn(x, y):
        x[1:3].copy_(y)
        return x * 1

    check(fn, rand((5, 4)), rand((2, 4), seed=1))


def test_copy_into_strided_slice_with_broadcast_and_cast():
    def fn(x, y):
        x[:, ::2].copy_(y)  # y broadcasts over rows and is cast from bf16
        return x.sum(-1)

    check(fn, rand((3, 6)), rand((3,), BF16, seed=1))


def test_setitem_scalar_and_column():
    def fn(x, y):
        x[0] = y[0]
        x[:, -1] = y
        x[1:3, 0].fill_(2.5)
        return x.clone()

    check(fn, rand((4, 3)), rand((4,), seed=1))


def test_copy_from_flipped_self():
    """Valid in eager (flip copies): the in-place write must not overwrite what is still to be read."""
    check(lambda x: x.copy_(x.flip(0)), rand((3000,)))


def test_copy_whole_input():
    def fn(x, y):
        x.copy_(y.t())
        return x + 1

    check(fn, rand((3, 4)), rand((4, 3), seed=1))


def test_slice_scatter_and_select_scatter():
    check(lambda x, y, z: (torch.slice_scatter(x, y, 0, 1, 3), torch.select_scatter(x, z, 1, 2)),
          rand((5, 4)), rand((2, 4), seed=1), rand((5,), seed=2))


@pytest.mark.parametrize("bounded", [True, False])
def test_pieces_of_pieces_and_strided_scatters_of_reshaped_sources(bounded, monkeypatch):
    """Masked pieces inside masked pieces (a cat of a cat of a reshape, a pad of it) and a
    slice_scatter with a step, its source reshaped: each level's index placed in its own bounds
    (lowering/masked_pieces.py) or left as written, the values are eager's."""
    monkeypatch.setattr(masked_pieces, "BOUNDED_PIECE_INDEX", bounded)

    def fn(x, y, z, w):
        inner = torch.cat([x.reshape(2, 15), y], 1)
        outer = torch.cat([z, inner * 2], 1)
        padded = F.pad(outer.reshape(2, 2, 13), (3, 1, 1, 0))
        scattered = torch.zeros(6, 10).slice_scatter(w.reshape(6, 3), 1, 1, 10, 3)
        return outer, padded, scattered

    check(fn, rand((2, 3, 5)), rand((2, 4), seed=1), rand((2, 7), seed=2), transposed((3, 6), seed=3))


@pytest.mark.parametrize("fusion", [True, False])
def test_zero_size_tensors(fusion):
    check(lambda x: (x * 2, x.sum(0), x.reshape(3, 0)), rand((0, 3)), options={"fusion": fusion})


# --- backward of shape ops (slice_backward, select_backward, cat's split, pad's negative pad...) ----

SHAPE_BACKWARDS = {
    "slice": lambda x: x[1:, ::2],
    "select": lambda x: x[1],
    "expand": lambda x: x.expand(3, 4, 6),
    "cat": lambda x: torch.cat([x, x[:, :2] * 2], -1),
    "stack": lambda x: torch.stack([x, x * 3]),
    "pad": lambda x: F.pad(x, (1, 2, -1, 0)),
    "repeat": lambda x: x.repeat(2, 1),
    "unbind": lambda x: x.unbind(0)[1],
    "split": lambda x: x.split(4, -1)[1],
    "permute_reshape": lambda x: x.permute(1, 0).reshape(3, 8),
    "flip_roll": lambda x: x.flip(0).roll(1, -1),
    "narrow_squeeze": lambda x: x.narrow(1, 1, 3).unsqueeze(0).squeeze(0),
}


@pytest.mark.parametrize("name", list(SHAPE_BACKWARDS))
def test_shape_op_backward(name):
    def fn(x):
        x = x.detach().requires_grad_(True)
        y = SHAPE_BACKWARDS[name](x).exp()
        return [y] + list(torch.autograd.grad(y, x, torch.ones_like(y) * 0.5))

    check(fn, rand((4, 6)))


def test_as_strided_within_its_input_is_a_view_and_beyond_it_a_clear_error():
    from torch.fx.experimental.proxy_tensor import make_fx

    import compiler
    from compiler.fx_import import from_fx
    from compiler.lowering import LoweringError

    check(lambda x: torch.ops.aten.as_strided(x, [2, 3], [1, 2], 3) * 2, rand((10,)))  # elements 3..8
    # OpInfo's partial view: eager reads past the 10 elements, from a larger storage behind the input
    # that the graph's input spec (shape and strides) does not describe: refused, not read out of bounds
    x = torch.randn(20)[:10]
    graph = from_fx(make_fx(lambda v: torch.ops.aten.as_strided(v, [2, 2], [1, 2], 10))(x), [x])
    with pytest.raises(LoweringError, match="reaches element 13 of a tensor whose storage holds 10"):
        compiler.compile(graph, "cpu")


@pytest.mark.filterwarnings("error:tl.where with a non-boolean condition")
def test_a_cat_of_bool_masks_stays_bool_where_it_picks_values():
    """A masked bool piece read as a `where` condition (Funnel's attention masks cat before the
    softmax): tl.where(mask, piece, 0) would widen it to int32, a condition Triton deprecates."""
    a, b = rand((3, 4), seed=1) > 0, rand((3, 5), seed=2) > 0
    x, y = rand((3, 9), seed=3), rand((3, 9), seed=4)
    check(lambda a, b, x, y: torch.where(torch.cat([a, b], 1), x, y), a, b, x, y)
