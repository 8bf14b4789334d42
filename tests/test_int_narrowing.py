"""Index arithmetic compared in int32 (KernelWriter.narrow_int): ATen computes positions in int64
(a max-pool backward's window bounds, an arange's masks), the kernel computes indices in int32
when every buffer fits, and a comparison of such values with small constants needs no 64-bit
compare, which takes several instructions where int32 takes one (the pool backward's kernel:
1290 PTX instructions for 8 elements a thread, 742 narrowed)."""

from __future__ import annotations

import re

import torch

from tests.lowering_cases import kernel_sources
from tests.test_scheduler import compile_and_check


def test_pool_backward_window_bounds_compare_in_int32():
    x = torch.randn(2, 3, 13, 11)
    out, indices = torch.ops.aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1])
    grad = torch.randn_like(out)

    def backward(grad, x, indices):
        return torch.ops.aten.max_pool2d_with_indices_backward(grad, x, [3, 3], [2, 2], [1, 1], [1, 1], False, indices)

    source = kernel_sources(compile_and_check(backward, grad, x, indices))
    compared = re.findall(r"= (tmp\d+) ([<>]=?|==|!=) (-?\d+)$", source, re.M)
    assert compared, "window bounds are compared with literals"
    int64_constants = set(re.findall(r"(tmp\d+) = tl\.full\(\[XBLOCK\], -?\d+, tl\.int64\)", source))
    assert not any(re.search(rf"[<>=!]=? {name}\b", source) for name in int64_constants)
    # the saved positions are int64 tensors: comparing them with the window's position stays int64
    assert ".to(tl.int64)" in source


def test_a_constant_beyond_int32_keeps_the_int64_compare():
    x = torch.randn(37)
    source = kernel_sources(compile_and_check(lambda x: torch.where(torch.arange(37) * 4 < 2**33, x, -x), x))
    assert "8589934592" in source


def test_negative_positions_compare_correctly():
    """An index expression that goes negative (the window before the first one) stays signed."""
    x = torch.randn(3, 29)
    compile_and_check(lambda x: torch.where(torch.arange(29) - 7 >= -3, x, 0.0), x)


def test_small_integers_widened_to_int64_compute_in_int32():
    """A max-pool's saved int8 window offsets decoded to flat int64 positions, negative offsets
    included (Python's floor division and remainder signs): no int64 division is left."""
    offsets = torch.randint(-128, 128, (5, 7, 9), dtype=torch.int8)

    def decode(offsets):
        wide = offsets.to(torch.int64)
        return (wide // 3 - 1) * 112 + torch.remainder(wide, 3) + torch.arange(9) * 2

    source = kernel_sources(compile_and_check(decode, offsets))
    assert "// 3" in source and "tl.abs(tmp" in source
    assert not re.search(r"// tl\.abs", source)
