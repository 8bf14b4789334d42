"""max_pool2d_with_indices and avg_pool2d, and their backwards, lowered as pointwise window work,
against eager: values and the positions of the maxima (exactly: ties keep the first, NaN wins),
the averages' divisors (padding counted or not, ceil_mode windows, an override), padding,
strides, dilation, 3-D and channels-last inputs, and the pool's two outputs in one kernel."""

from __future__ import annotations

import pytest
import torch

from tests.lowering_cases import BF16, FLOAT32, check, rand

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on masked-off lanes


def _pool(kernel, stride, padding, dilation=1, ceil_mode=False):
    return lambda x: torch.ops.aten.max_pool2d_with_indices(x, kernel, stride, padding, dilation, ceil_mode)


@pytest.mark.parametrize("dtype", [FLOAT32, BF16], ids=str)
@pytest.mark.parametrize("kernel, stride, padding, dilation, ceil_mode", [
    ([3, 3], [2, 2], [1, 1], 1, False),   # ResNet's stem
    ([2, 2], [2, 2], [0, 0], 1, False),   # halving
    ([3, 2], [1, 2], [1, 0], 1, True),    # uneven window, ceil_mode: the last window hangs over the edge
    ([3, 3], [2, 2], [1, 1], [2, 1], False),  # dilated
    ([3, 3], [], [0, 0], 1, False),       # stride defaults to the window
], ids=str)
def test_max_pool2d_matches_eager_values_and_indices(dtype, kernel, stride, padding, dilation, ceil_mode):
    result = check(_pool(kernel, stride, padding, dilation, ceil_mode), rand((2, 3, 13, 11), dtype))
    assert len(result.artifact.manifest["kernels"]) == 1  # the maximum and its position share the window's loads


def test_max_pool2d_ties_keep_the_first_maximum_and_nan_wins():
    x = torch.randint(0, 3, (1, 2, 9, 9)).float()  # many equal maxima per window
    x[0, 0, 4, 4] = float("nan")
    x[0, 1, :3, :3] = float("-inf")  # a window with nothing above -inf
    check(_pool([3, 3], [2, 2], [1, 1]), x)


def test_max_pool2d_of_a_3d_and_a_channels_last_input():
    check(_pool([3, 3], [2, 2], [1, 1]), rand((3, 10, 9)))
    check(_pool([3, 3], [2, 2], [1, 1]), rand((2, 5, 8, 7)).to(memory_format=torch.channels_last))



def _pool_backward(kernel, stride, padding, dilation=1, ceil_mode=False):
    def fn(x, grad_scale):
        out, indices = torch.ops.aten.max_pool2d_with_indices(x, kernel, stride, padding, dilation, ceil_mode)
        grad = out * grad_scale  # a gradient that differs per window
        return torch.ops.aten.max_pool2d_with_indices_backward(grad, x, kernel, stride, padding, dilation,
                                                               ceil_mode, indices)
    return fn


@pytest.mark.parametrize("dtype", [FLOAT32, BF16], ids=str)
@pytest.mark.parametrize("kernel, stride, padding, dilation, ceil_mode", [
    ([3, 3], [2, 2], [1, 1], 1, False),   # ResNet's stem: overlapping windows, an element may win several
    ([2, 2], [2, 2], [0, 0], 1, False),
    ([3, 2], [1, 2], [1, 0], 1, True),
    ([3, 3], [2, 2], [1, 1], [2, 1], False),
    ([3, 3], [], [0, 0], 1, False),
], ids=str)
def test_max_pool2d_backward_matches_eager(dtype, kernel, stride, padding, dilation, ceil_mode):
    """The backward gathers each element's gradient from the windows it won: no ATen call."""
    x = torch.randint(0, 4, (2, 3, 13, 11)).to(dtype)  # ties: an element wins several windows
    check(_pool_backward(kernel, stride, padding, dilation, ceil_mode), x, rand((1, 3, 1, 1), dtype))


def test_max_pool2d_backward_of_a_3d_input_and_a_transposed_gradient():
    def fn(x, grad_t):
        out, indices = torch.ops.aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1])
        return torch.ops.aten.max_pool2d_with_indices_backward(grad_t.transpose(-1, -2), x, [3, 3], [2, 2], [1, 1],
                                                               1, False, indices)
    check(fn, rand((3, 10, 9)), rand((3, 5, 5)))


AVG_POOLS = [  # kernel, stride, padding, ceil_mode, count_include_pad, divisor_override
    ([3, 3], [1, 1], [1, 1], False, False, None),   # PoolFormer's token mixer
    ([3, 3], [2, 2], [1, 1], True, True, None),     # ceil_mode: the last window hangs past the padding
    ([3, 3], [2, 2], [1, 1], False, True, None),    # ResNeSt's: no window clipped, a constant divisor
    ([2, 2], [2, 2], [0, 0], False, True, None),    # DenseNet's transitions
    ([3, 2], [2, 1], [1, 0], True, False, None),    # uneven window, padding not counted (constant along W only)
    ([3, 3], [], [1, 1], False, True, 5),           # stride defaults to the window; an override
]


@pytest.mark.parametrize("dtype", [FLOAT32, BF16], ids=str)
@pytest.mark.parametrize("kernel, stride, padding, ceil_mode, count_include_pad, divisor", AVG_POOLS, ids=str)
def test_avg_pool2d_and_its_backward_match_eager(dtype, kernel, stride, padding, ceil_mode, count_include_pad, divisor):
    def forward(x):
        return torch.ops.aten.avg_pool2d(x, kernel, stride, padding, ceil_mode, count_include_pad, divisor)

    def backward(x, grad):
        return torch.ops.aten.avg_pool2d_backward(grad, x, kernel, stride, padding, ceil_mode, count_include_pad,
                                                  divisor)

    x = rand((2, 3, 13, 11), dtype)
    check(forward, x)
    check(backward, x, rand(tuple(forward(x).shape), dtype))


def test_avg_pool2d_fuses_with_its_neighbours_on_a_channels_last_input():
    def token_mixer(x):  # PoolFormer: pool(x) - x, then a residual add
        return x + (torch.ops.aten.avg_pool2d(x, [3, 3], [1, 1], [1, 1], False, False) - x) * 0.5

    result = check(token_mixer, rand((2, 5, 8, 7)).to(memory_format=torch.channels_last))
    assert len(result.artifact.manifest["kernels"]) == 1
    check(lambda x: torch.ops.aten.avg_pool2d(x, [2, 2], [2, 2]), rand((3, 10, 9)))  # a 3-D input


def test_a_pool_whose_windows_are_never_clipped_divides_by_a_constant():
    """3x3 windows of stride 2 with padding 1 over 13 x 11 counting padding: none reaches past the
    padded input, so no window's bounds are computed for its divisor (lowering/pooling.py)."""
    def backward(x, grad):
        return torch.ops.aten.avg_pool2d_backward(grad, x, [3, 3], [2, 2], [1, 1], False, True, None)

    def clipped(x, grad):  # ceil_mode: the last row of windows hangs past the padding
        return torch.ops.aten.avg_pool2d_backward(grad, x, [3, 3], [2, 2], [1, 1], True, True, None)

    grad = rand((2, 3, 7, 6), seed=1)
    assert "minimum" not in check(backward, rand((2, 3, 13, 11)), grad).kernel_sources
    assert "minimum" in check(clipped, rand((2, 3, 12, 11)), grad).kernel_sources  # rows: ceil(11 / 2) + 1 = 7


def test_window_positions_inside_every_window_load_without_a_bounds_check(monkeypatch):
    """HGNetV2's stem pools a 2x2 window of stride 1 over a map padded to 113 x 113 with ceil_mode:
    every position of every window lies inside, so no load is masked. ResNet's 3x3 stride-2 pool with
    padding 1 over an even map checks only its first row and column of positions."""
    from compiler.lowering import pooling

    stem = check(_pool([2, 2], [1, 1], [0, 0], 1, True), rand((2, 3, 13, 11), BF16)).kernel_sources
    assert "& tmp" not in stem.split("tl.store")[0] and "-inf" in stem
    def masked_loads(shape):
        sources = check(_pool([3, 3], [2, 2], [1, 1]), rand(shape)).kernel_sources
        return len([line for line in sources.splitlines() if "tl.load" in line and "& tmp" in line])

    assert masked_loads((2, 3, 12, 10)) == 5  # the first row and column of positions: 3 + 3 - 1
    assert masked_loads((2, 3, 13, 11)) == 8  # odd sizes: the last window's last row and column hang over too
    monkeypatch.setattr(pooling, "STATIC_WINDOW_BOUNDS", False)
    assert masked_loads((2, 3, 12, 10)) == 9
