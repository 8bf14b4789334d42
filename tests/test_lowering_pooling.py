"""max_pool2d_with_indices lowered as pointwise window work, against eager: values and the
positions of the maxima (exactly: ties keep the first, NaN wins), padding, strides, dilation,
ceil_mode, 3-D and channels-last inputs, and the pool's two outputs in one kernel."""

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

