"""A cat of many like pieces (buffers of one layout and dtype) read through a pointer chosen per
element (compiler/lowering/shapes.py `_load_selected_piece`, KernelWriter.load_selected): one load
per read instead of a masked load per piece. Values are eager's for pieces along any dim, of any
length, under an outer mask, and cats whose pieces differ still read piece by piece."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from compiler.lowering import shapes
from tests.lowering_cases import check, rand, transposed

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on masked-off lanes


def selected_pointers(source: str) -> int:
    """How many pointers the kernels choose per element."""
    return len(re.findall(r"= tl\.where\([^,]+ == 0, ptr_", source))


def loads(source: str) -> int:
    return source.count("tl.load(")


def per_head_rotary(cos, sin, *heads):
    """StableLM's: per-head tensors cat along the head dim, rotated on their first half of features."""
    x = torch.cat(heads, 1)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


def test_per_head_pieces_are_read_through_one_pointer():
    heads = [rand((2, 1, 7, 6), seed=i) for i in range(5)]
    cos, sin = rand((7, 6), seed=10), rand((7, 6), seed=11)
    result = check(per_head_rotary, cos, sin, *heads)
    source = result.kernel_sources
    assert selected_pointers(source) == 1
    # one load for the cat (five pieces); its reader loads cos, sin and the cat at three offsets
    assert loads(source) <= 6


def test_pieces_longer_than_one_along_the_dim_in_bf16():
    pieces = [rand((3, 4, 5), seed=20 + i).to(torch.bfloat16) for i in range(4)]
    result = check(lambda *xs: torch.cat(xs, 1).float().exp(), *pieces)
    assert selected_pointers(result.kernel_sources) == 1


def test_transposed_pieces_and_a_stack():
    pieces = [transposed((5, 3), seed=30 + i) for i in range(6)]
    assert selected_pointers(check(lambda *xs: torch.cat(xs, 0).sin(), *pieces).kernel_sources) == 1
    assert selected_pointers(check(lambda *xs: torch.stack(xs, 1).cos(), *pieces).kernel_sources) == 1


def test_a_cat_read_under_a_pad_mask():
    pieces = [rand((2, 3, 4), seed=40 + i) for i in range(3)]
    result = check(lambda *xs: F.pad(torch.cat(xs, 2), (1, 2, 0, 1)) * 3, *pieces)
    assert selected_pointers(result.kernel_sources) == 1


def test_unlike_pieces_are_read_piece_by_piece():
    """One piece transposed (another layout), or one of another dtype: masked loads, same values."""
    pieces = [rand((4, 5), seed=50), rand((4, 5), seed=51), transposed((4, 5), seed=52)]
    assert selected_pointers(check(lambda *xs: torch.cat(xs, 1).sin(), *pieces).kernel_sources) == 0
    mixed = [rand((4, 5), seed=53), rand((4, 5), seed=54), rand((4, 5), seed=55).to(torch.bfloat16)]
    assert selected_pointers(check(lambda *xs: torch.cat(xs, 1).sin(), *mixed).kernel_sources) == 0


def test_two_pieces_and_the_switch_off_read_by_masks(monkeypatch):
    pieces = [rand((4, 5), seed=60 + i) for i in range(4)]
    assert selected_pointers(check(lambda *xs: torch.cat(xs[:2], 1).sin(), *pieces).kernel_sources) == 0
    monkeypatch.setattr(shapes, "SELECT_LIKE_PIECES", False)
    result = check(lambda *xs: torch.cat(xs, 1).sin(), *pieces)
    assert selected_pointers(result.kernel_sources) == 0
    assert loads(result.kernel_sources) == 4


def test_pieces_computed_by_an_earlier_kernel():
    """Pieces that are graph outputs too are buffers an earlier kernel writes: the cat's reader reads
    them once each, not as elements read again (no evict_last)."""
    def fn(a, b, c):
        pieces = [a.sin(), b.cos(), c.exp()]
        return torch.cat(pieces, 1) * 2, *pieces

    source = check(fn, *(rand((3, 4), seed=70 + i) for i in range(3))).kernel_sources
    assert selected_pointers(source) == 1
    assert "evict_last" not in source


@pytest.mark.parametrize("dim", [0, 1])
def test_like_pieces_read_inside_a_reduction(dim):
    """The cat read in a reduction kernel's loop (a softmax over it, rows along either dim): the
    pointer is chosen per element of the [XBLOCK, RBLOCK] tile."""
    pieces = [rand((5, 37), seed=80 + i).to(torch.bfloat16) for i in range(4)]
    result = check(lambda *xs: torch.softmax(torch.cat(xs, dim).float(), -1), *pieces)
    assert selected_pointers(result.kernel_sources) >= 1


def test_a_gather_from_a_cat_of_like_pieces():
    """Rows gathered from a cat (an embedding table kept in pieces): the cat is inlined into the
    gather's kernel (compiler/inline_gathers.py), and the piece is chosen by the gathered index."""
    def fn(a, b, c, idx):
        return torch.cat([a, b, c], 0).sin()[idx] * 2

    pieces = [rand((4, 6), seed=90 + i) for i in range(3)]
    result = check(fn, *pieces, torch.tensor([0, 11, 5, 7, 3, -1, 2]))
    assert selected_pointers(result.kernel_sources) == 1
    assert len(result.artifact.manifest["kernels"]) == 1
