"""Pointwise kernels walked two outputs at a time (compiler/paired_lanes.py), their strided reads
loaded as aligned runs of 4 (compiler/codegen/lane_loads.py): stride-2 pools and interleaved pairs
against eager, with padding at every edge, odd heights, non-contiguous inputs, a ResNet stem with
its backward, and the kernels that must keep their 1D form."""

from __future__ import annotations

import pytest
import torch

from compiler import paired_lanes
from tests.lowering_cases import BF16, FLOAT32, check, rand, strided, transposed

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on masked-off lanes


@pytest.fixture(autouse=True)
def small_kernels_pair(monkeypatch):
    """Pairs from 8 on, so that CPU-sized shapes take the paired form."""
    monkeypatch.setattr(paired_lanes, "MIN_PAIRS", 8)


def paired_kernels(result) -> int:
    return sum(1 for k in result.artifact.manifest["kernels"] if k["config"].get("lanes"))


def run_loads(result) -> int:
    """Loads of aligned runs of 4 in the artifact's kernels."""
    return sum(result.artifact.kernel_source(k).count("tl.arange(0, 4)[None, :]) >=")
               for k in result.artifact.manifest["kernels"])


def max_pool(x):
    return torch.ops.aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1])


@pytest.mark.parametrize("dtype", [FLOAT32, BF16], ids=str)
@pytest.mark.parametrize("shape", [(2, 3, 12, 16), (1, 5, 13, 20), (3, 2, 7, 4)], ids=str)
def test_a_stride_2_max_pool_in_pairs_matches_eager(dtype, shape):
    result = check(max_pool, rand(shape, dtype))
    assert paired_kernels(result) == 1
    # two runs per window row, the left neighbour's and the pair's own; in rows of 4 the left
    # neighbour's run is the row above's own run
    assert run_loads(result) == (4 if shape[-1] == 4 else 6)


def test_ties_and_nan_keep_eagers_positions_in_pairs():
    x = torch.randint(0, 3, (2, 2, 9, 12)).to(FLOAT32)  # many ties
    x[0, 0, 3, 5] = float("nan")
    x[1, 1, 0, 0] = float("nan")  # the first element: its pair's left run lies before the buffer
    result = check(max_pool, x)
    assert paired_kernels(result) == 1


def test_a_max_pool_of_a_non_contiguous_input_in_pairs():
    """Rows of 12 elements at a stride of 16, the view starting one element in: every run starts
    3 elements before an aligned one, and the pool still reads pairs."""
    x = rand((2, 3, 10, 16))[:, :, :, 1:13]
    assert paired_kernels(check(max_pool, x)) == 1
    # a ::2 view of the columns: the pool reads every fourth element, no pairs
    assert paired_kernels(check(max_pool, strided((2, 3, 10, 12), step=2))) == 0


def test_a_halving_average_pool_and_its_consumer_in_pairs():
    def fn(x, y):
        return torch.ops.aten.avg_pool2d(x, [2, 2], [2, 2]) * y

    result = check(fn, rand((2, 4, 10, 12), BF16), rand((2, 4, 5, 6), BF16))
    assert paired_kernels(result) == 1
    assert run_loads(result) == 2  # one run per window row: both of its elements for each output


def test_interleaved_real_and_imaginary_parts_in_pairs():
    """|z|^2 of complex numbers stored as (real, imaginary) pairs, scaled per row."""
    def fn(x, scale):
        return (x[..., ::2] ** 2 + x[..., 1::2] ** 2) * scale

    result = check(fn, rand((3, 5, 32), BF16), rand((3, 5, 1), BF16))
    assert paired_kernels(result) == 1
    assert run_loads(result) == 1  # one run of 4 holds both parts of two numbers


def test_kernels_that_keep_their_1d_form():
    # an odd number of output columns: a pair would straddle two rows
    assert paired_kernels(check(max_pool, rand((2, 3, 10, 13)))) == 0
    # a ::2 slice reads one parity only: no element of a run is used twice
    assert paired_kernels(check(lambda x: x[..., ::2] * 2, rand((4, 6, 32)))) == 0
    # reads along another dim of a transposed input: its pairs are not contiguous
    assert paired_kernels(check(max_pool, transposed((2, 3, 12, 16)))) == 0


def test_the_switch_keeps_the_1d_kernel(monkeypatch):
    monkeypatch.setattr(paired_lanes, "PAIRED_LANES", False)
    result = check(max_pool, rand((2, 3, 12, 16)))
    assert paired_kernels(result) == 0 and run_loads(result) == 0


def test_a_resnet_stem_and_its_backward_with_paired_pools():
    """Convolution, BatchNorm in train mode, ReLU, the 3x3 stride-2 max pool and a halving average
    pool, with the gradients of the input and the weight: the pools' kernels read the normalized
    activations in pairs inside the graph's fusions, forward and backward."""
    def stem(x, weight, gamma, beta):
        def loss_of(x, weight):
            y = torch.nn.functional.conv2d(x, weight, padding=1)
            y = torch.nn.functional.batch_norm(y, None, None, gamma, beta, training=True)
            y = torch.ops.aten.max_pool2d_with_indices(torch.relu(y), [3, 3], [2, 2], [1, 1])[0]
            return (torch.ops.aten.avg_pool2d(y, [2, 2], [2, 2]) ** 2).sum()
        loss = loss_of(x, weight)
        return (loss, *torch.autograd.grad(loss, (x, weight)))

    x = rand((2, 3, 16, 24)).requires_grad_()
    weight = rand((4, 3, 3, 3), seed=11).requires_grad_()
    result = check(stem, x, weight, rand((4,), seed=12), rand((4,), seed=13), expect_no_extern=False,
                   reference64=True)
    assert set(result.externs) == {"aten.convolution.default", "aten.convolution_backward.default"}
    assert paired_kernels(result) >= 1
