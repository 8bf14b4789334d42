"""Pointwise kernels over cells of 2 or 2 x 2 outputs (compiler/unrolled_lanes.py): pool backwards
against eager with ties, padding at every edge, odd sizes, channels-last and non-contiguous
gradients, fused with a ReLU's mask and a BatchNorm backward; the loads the lanes share written
once; the kernels that keep their 1D form."""

from __future__ import annotations

import pytest
import torch

from compiler import unrolled_lanes
from tests.lowering_cases import BF16, FLOAT32, check, rand

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on masked-off lanes


@pytest.fixture(autouse=True)
def small_kernels_unroll(monkeypatch):
    """Cells from 8 on, so that CPU-sized shapes take the unrolled form."""
    monkeypatch.setattr(unrolled_lanes, "MIN_CELLS", 8)


def unrolled(result) -> list[int]:
    """The outputs per point of each kernel over cells."""
    return [k["config"]["unrolled"] for k in result.artifact.manifest["kernels"] if k["config"].get("unrolled")]


def loads(result) -> int:
    return sum(result.artifact.kernel_source(k).count("tl.load(") for k in result.artifact.manifest["kernels"])


def pool_and_indices(x, kernel=3, stride=2, padding=1):
    return torch.ops.aten.max_pool2d_with_indices(x, [kernel, kernel], [stride, stride], [padding, padding])


def max_pool_backward(kernel=3, stride=2, padding=1):
    def fn(grad, x, indices):
        return torch.ops.aten.max_pool2d_with_indices_backward(grad, x, [kernel, kernel], [stride, stride],
                                                               [padding, padding], [1, 1], False, indices)
    return fn


def pool_backward_inputs(shape, dtype=FLOAT32, ties=False, channels_last=False, **window):
    x = torch.randint(0, 3, shape).to(dtype) if ties else rand(shape, dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    out, indices = pool_and_indices(x, **window)
    return rand(out.shape, dtype, seed=5), x, indices


@pytest.mark.parametrize("dtype", [FLOAT32, BF16], ids=str)
@pytest.mark.parametrize("shape, lanes", [((2, 3, 12, 16), 4), ((1, 2, 13, 20), 2), ((2, 2, 10, 7), 2)], ids=str)
def test_a_max_pool_backward_over_cells_matches_eager(dtype, shape, lanes):
    """Odd heights or widths leave their dim whole: cells of 2 along the other."""
    result = check(max_pool_backward(), *pool_backward_inputs(shape, dtype))
    assert unrolled(result) == [lanes]


@pytest.mark.parametrize("kernel, stride, padding, dilation", [(3, 1, 1, 1), (2, 3, 0, 1), (4, 3, 1, 1), (3, 2, 0, 2),
                                                            (2, 1, 0, 1), (4, 2, 2, 1)], ids=str)
def test_other_windows_match_eager_whatever_form_they_take(kernel, stride, padding, dilation):
    """Strides of 1 and 3, dilation, windows of 2 to 4: over cells or not, the gradients are eager's."""
    def fn(grad, x, indices):
        return torch.ops.aten.max_pool2d_with_indices_backward(grad, x, [kernel] * 2, [stride] * 2, [padding] * 2,
                                                               [dilation] * 2, False, indices)

    x = torch.randint(0, 4, (2, 3, 14, 16)).to(FLOAT32)  # ties: one element the maximum of several windows
    out, indices = torch.ops.aten.max_pool2d_with_indices(x, [kernel] * 2, [stride] * 2, [padding] * 2, [dilation] * 2)
    check(fn, rand(out.shape, seed=4), x, indices)


def test_explain_names_a_kernel_over_cells():
    from compiler.explain import describe

    result = check(max_pool_backward(), *pool_backward_inputs((2, 3, 12, 16)))
    assert "pointwise in cells of 4 outputs over 288," in describe(result.artifact)


def test_a_cell_of_2x2_loads_each_of_its_four_windows_once():
    """Even rows and columns are covered by one window, odd ones by two: the cell's lanes read the
    windows (i..i+1, j..j+1), one index and one gradient each; a window a lane's position cannot
    be covered by is never loaded (its cover is known false)."""
    result = check(max_pool_backward(), *pool_backward_inputs((2, 3, 12, 16)))
    assert unrolled(result) == [4]
    assert loads(result) == 8


def test_ties_send_one_gradient_to_one_element_and_several_windows_sum():
    """Many equal values: one element is the maximum of up to four windows, whose gradients add."""
    result = check(max_pool_backward(), *pool_backward_inputs((2, 2, 12, 12), ties=True))
    assert unrolled(result) == [4]


def test_a_channels_last_pool_backward_over_cells():
    grad, x, indices = pool_backward_inputs((2, 8, 10, 12), BF16, channels_last=True)
    result = check(max_pool_backward(), grad.contiguous(memory_format=torch.channels_last), x, indices)
    assert unrolled(result) == [4]


def test_a_non_contiguous_gradient():
    grad, x, indices = pool_backward_inputs((2, 3, 12, 16))
    wide = rand((2, 3, 6, 12), seed=9)[..., 2:10]  # rows of 8 at a stride of 12, two elements in
    result = check(max_pool_backward(), wide, x, indices)
    assert unrolled(result) == [4]


def test_a_window_of_2_and_no_padding():
    """A 2x2 stride-2 max pool's backward: one window covers each position."""
    grad, x, indices = pool_backward_inputs((2, 3, 8, 12), kernel=2, stride=2, padding=0)
    result = check(max_pool_backward(kernel=2, stride=2, padding=0), grad, x, indices)
    assert len(result.artifact.manifest["kernels"]) == 1


def test_an_average_pool_backward_over_cells():
    def fn(grad, x):
        return torch.ops.aten.avg_pool2d_backward(grad, x, [3, 3], [2, 2], [1, 1], False, True, None)

    result = check(fn, rand((2, 3, 6, 8), BF16), rand((2, 3, 12, 16), BF16))
    assert unrolled(result) == [4]


def test_a_pool_backward_fused_with_a_relus_mask():
    """ResNet's backward as a GPU's benchmark-driven fusion leaves it: the pool's backward and the
    ReLU's mask in one kernel, whose mask is read at the output's own position (a vector of 2)."""
    def fn(grad, x, indices, relu_out):
        back = max_pool_backward()(grad, x, indices)
        return torch.where(relu_out <= 0, torch.zeros((), dtype=back.dtype), back)

    grad, x, indices = pool_backward_inputs((2, 3, 12, 16), BF16)
    result = check(fn, grad, x, indices, rand((2, 3, 12, 16), BF16, low=-1, high=1, seed=3))
    assert unrolled(result) == [4]
    assert any("tl.arange(0, 2)[None, :], xmask[:, None], other=0" in result.artifact.kernel_source(k)
               for k in result.artifact.manifest["kernels"])


def test_a_resnet_stem_backward_with_the_pool_over_cells():
    """Convolution, BatchNorm in train mode, ReLU and the 3x3 stride-2 max pool, with the input's
    gradient, each op a kernel of its own (the CPU's score fuses the pool's backward into the
    BatchNorm's reduction): the whole stem against float64."""
    def stem(x, weight, gamma, beta):
        y = torch.nn.functional.conv2d(x, weight, padding=1)
        y = torch.nn.functional.batch_norm(y, None, None, gamma, beta, training=True)
        y = torch.ops.aten.max_pool2d_with_indices(torch.relu(y), [3, 3], [2, 2], [1, 1])[0]
        loss = (y * y).sum()
        return (loss, *torch.autograd.grad(loss, (x,)))

    x = rand((2, 3, 16, 24)).requires_grad_()
    result = check(stem, x, rand((4, 3, 3, 3), seed=11).requires_grad_(), rand((4,), seed=12),
                   rand((4,), seed=13), expect_no_extern=False, reference64=True, options={"fusion": False})
    assert set(result.externs) >= {"aten.convolution.default"}
    assert unrolled(result)


def test_kernels_that_keep_their_1d_form():
    """A pool's forward reads 2*w - 1 + j (no gather); a nearest upsampling reads w // 2, a digit
    of the output's own index; the switch off."""
    assert not unrolled(check(lambda x: pool_and_indices(x), rand((2, 3, 12, 16))))
    assert not unrolled(check(lambda x: torch.ops.aten.upsample_nearest2d(x, [12, 16]), rand((2, 3, 6, 8))))


def test_the_switch_keeps_the_1d_kernel(monkeypatch):
    monkeypatch.setattr(unrolled_lanes, "UNROLLED_LANES", False)
    result = check(max_pool_backward(), *pool_backward_inputs((2, 3, 12, 16)))
    assert not unrolled(result)
    assert loads(result) == 8 * 1  # one kernel, 4 candidate windows x 2 buffers, for each output


# --- pieces: a short dim walked whole, each lane reading its own piece of a stack or cat ---------


def qkv_gradient_stack(q, k, v):
    """A ViT's q/k/v gradients stacked back into the fused projection's layout, q and k through work
    of their own first (EVA-02's rotary backward on every token but the class token)."""
    tokens = q.shape[2] - 1
    cos = torch.linspace(-1, 1, tokens * q.shape[3], device=q.device).view(tokens, -1).to(q.dtype)
    sin = cos.flip(0)
    rotated = lambda t: torch.cat([t[:, :, :1], t[:, :, 1:] * cos + t[:, :, 1:].flip(-1) * sin], 2)  # noqa: E731
    return torch.stack([rotated(q), rotated(k).neg(), v], 0).permute(1, 3, 0, 2, 4).contiguous()


@pytest.mark.parametrize("dtype", [FLOAT32, BF16], ids=str)
def test_a_stack_of_three_pieces_walks_them_as_three_lanes_and_matches_eager(dtype):
    q, k, v = (rand((2, 3, 9, 10), dtype, seed=s) for s in range(3))
    result = check(qkv_gradient_stack, q, k, v)
    assert unrolled(result) == [3]


def test_each_lane_loads_only_its_own_piece(monkeypatch):
    """The 1D kernel loads every piece's inputs at every output (its masks known only at run time):
    6 loads; over lanes each lane's masks are known and it loads its own piece's two inputs alone,
    and a load two lanes make of the same element is written once: 3 loads a cell."""
    inputs = [rand((3, 5, 7), seed=s) for s in range(3)]
    stack = lambda a, b, c: torch.stack([a * b, b + c, c - a], 1)  # noqa: E731
    lanes = check(stack, *inputs)
    assert unrolled(lanes) == [3] and loads(lanes) == 3
    monkeypatch.setattr(unrolled_lanes, "PIECE_LANES", False)
    flat = check(stack, *inputs)
    assert not unrolled(flat) and loads(flat) == 6
    assert "tl.where" in flat.artifact.kernel_source(flat.artifact.manifest["kernels"][0])
    assert "tl.where" not in lanes.artifact.kernel_source(lanes.artifact.manifest["kernels"][0])


def test_a_stack_of_copies_keeps_its_contiguous_stores():
    """One load a piece (VOLO's stack of q/k/v gradients): the 1D kernel, whose stores are contiguous."""
    inputs = [rand((3, 5, 7), seed=s) for s in range(3)]
    assert not unrolled(check(lambda a, b, c: torch.stack([a, b * 2, c + 1], 1), *inputs))


def test_pieces_from_non_contiguous_inputs_and_a_cat_along_an_outer_dim():
    a, b = rand((6, 4, 5), seed=1).transpose(0, 2), rand((5, 4, 6), seed=2)
    result = check(lambda a, b: torch.cat([(a * a.flip(1)).unsqueeze(0), (b * b.flip(1)).unsqueeze(0)], 0)
                   .permute(1, 0, 2, 3) + 1, a, b)
    assert unrolled(result) == [2]


def test_short_dims_that_select_no_piece_stay_1d():
    """A dim of 3 that every input spans (no masks to fold), or a stack along the innermost dim
    (interleaved pairs: its lanes would be neighbouring elements), keeps the 1D kernel."""
    assert not unrolled(check(lambda x, y: x * y.sin(), rand((4, 3, 10)), rand((4, 3, 10), seed=1)))
    assert not unrolled(check(lambda x, y: torch.stack([x, -y], -1).flatten(-2), rand((6, 10)), rand((6, 10), seed=1)))
