"""A cat stored piece by piece (compiler/lowering/concatenation.py): each piece computed from a
reduction is written into its slice of the result by the reduction's own kernel; the values are
eager's, whatever the layout of the result. With MANY_PIECES_BY_PIECE (off by default), a cat of more
than MAX_MASKED_PIECES pieces is stored by piece whatever reads it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from compiler.fx_import import from_fx
from compiler.ir import ComputeNode
from compiler.lowering import concatenation, lower
from tests.lowering_cases import check, rand, strided, transposed

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on masked-off lanes


def class_token_then_norm(class_token, x, weight, bias):
    """CoaT's: a class token before the LayerNorm of the patch tokens; the result is a graph output."""
    normed = F.layer_norm(x, x.shape[-1:], weight, bias)
    return torch.cat([class_token.expand(x.shape[0], -1, -1), normed], 1)


def class_token_inputs():
    return rand((1, 1, 24), seed=1), rand((3, 37, 24), seed=2), rand((24,), seed=3), rand((24,), seed=4)


def writers_by_buffer(fn, *inputs) -> tuple[dict[str, list[ComputeNode]], str]:
    """(each buffer's compute nodes that store into it, the buffer of the graph's first output)."""
    program = lower(from_fx(make_fx(fn)(*inputs), list(inputs)))
    writers: dict[str, list[ComputeNode]] = {}
    for node in program.nodes:
        if isinstance(node, ComputeNode):
            for name in {store.buffer.name for store in node.stores}:
                writers.setdefault(name, []).append(node)
    return writers, program.outputs[0].buffer.name


def cat_writers(fn, *inputs) -> list[ComputeNode]:
    """The compute nodes that store into the buffer of the graph's first output."""
    writers, out = writers_by_buffer(fn, *inputs)
    return writers.get(out, [])


def kernels_reading(artifact, position: int) -> int:
    """How many kernels of the plan read graph input `position`."""
    name = artifact.plan["inputs"][position]["buffer"]
    return sum(1 for step in artifact.plan["steps"] if step["op"] == "kernel" and name in step["args"])


def test_a_normalized_piece_is_written_by_the_norms_kernel(monkeypatch):
    inputs = class_token_inputs()
    assert len(cat_writers(class_token_then_norm, *inputs)) == 2
    by_piece = check(class_token_then_norm, *inputs)
    assert kernels_reading(by_piece.artifact, 1) == 1  # the LayerNorm's input is read once
    monkeypatch.setattr(concatenation, "CAT_BY_PIECE", False)
    assert len(cat_writers(class_token_then_norm, *inputs)) == 1
    whole = check(class_token_then_norm, *inputs)
    assert kernels_reading(whole.artifact, 1) == 2  # the cat's kernel normalizes again


def test_pieces_from_reductions_into_a_non_contiguous_result():
    """Sums and maxima of a transposed input stacked in the middle dim, read by a matmul through a
    reshape: each piece lands in a strided slice of the result."""
    def fn(x, w):
        stacked = torch.stack([x.sum(1), x.amax(1), x.mean(1) * 3], 1)
        return stacked.reshape(stacked.shape[0], -1) @ w, stacked

    x, w = rand((7, 37, 11), seed=5).transpose(0, 2), rand((21, 4), seed=6)
    assert len(cat_writers(lambda a, b: fn(a, b)[::-1], x, w)) == 3
    check(fn, x, w, expect_no_extern=False)


def test_channels_last_pieces_of_batch_norms():
    def fn(a, b):
        left = F.batch_norm(a, None, None, training=True)
        right = F.batch_norm(b, None, None, training=True).relu()
        return torch.cat([left, right], 1)

    a = rand((2, 3, 5, 7), seed=7).to(memory_format=torch.channels_last)
    b = rand((2, 4, 5, 7), seed=8).to(memory_format=torch.channels_last)
    assert len(cat_writers(fn, a, b)) == 2
    check(fn, a, b)


def test_a_cat_that_only_pointwise_ops_read_stays_one_node():
    """Not in memory otherwise: the cat's node fuses into its reader instead."""
    def fn(class_token, x, weight, bias):
        return class_token_then_norm(class_token, x, weight, bias) * 2

    assert len(cat_writers(fn, *class_token_inputs())) == 1


def test_a_slice_of_a_normalized_buffer_stays_in_one_node():
    """ReXNet's: channels 0-26 of a BatchNorm with a residual added, cat to channels 27-37. A slice's
    node would cover part of the norm's loops, which no kernel fuses."""
    def fn(x, shortcut):
        y = F.batch_norm(x, None, None, training=True)
        return torch.cat([y[:, :3] + shortcut, y[:, 3:]], 1)

    inputs = rand((2, 5, 4, 3), seed=9), rand((2, 3, 4, 3), seed=10)
    assert len(cat_writers(fn, *inputs)) == 1
    check(fn, *inputs)


def many_pieces(count: int) -> list[torch.Tensor]:
    """`count` pieces of odd lengths along dim 1, every other one transposed or sliced with a step."""
    makers = [rand, transposed, strided]
    return [makers[i % 3]((3, 2 * i + 1, 5), seed=20 + i) for i in range(count)]


def rotated(*pieces):
    """A cat read by pointwise ops only, as StableLM's per-head LayerNorms by its rotary embedding."""
    return torch.cat(pieces, 1).sin() * 2 + 1


def most_inputs_per_kernel(artifact) -> int:
    """The most graph inputs one kernel of the plan reads: the cat's pieces, where it is one masked node."""
    names = [spec["buffer"] for spec in artifact.plan["inputs"]]
    return max(sum(1 for name in names if name in step["args"]) for step in artifact.plan["steps"]
               if step["op"] == "kernel")


def buffer_writers(fn, *inputs) -> int:
    """The most compute nodes that store into one buffer."""
    writers, _ = writers_by_buffer(fn, *inputs)
    return max(len(nodes) for nodes in writers.values())


@pytest.fixture
def many_pieces_by_piece(monkeypatch):
    monkeypatch.setattr(concatenation, "MANY_PIECES_BY_PIECE", True)


def test_a_cat_of_many_pieces_is_stored_and_read_as_one_buffer(many_pieces_by_piece):
    """More than MAX_MASKED_PIECES: each piece is written into the buffer, which the reader reads."""
    pieces = many_pieces(12)
    assert buffer_writers(rotated, *pieces) == 12
    result = check(rotated, *pieces)
    assert most_inputs_per_kernel(result.artifact) == 1  # no kernel reads every piece under a mask


def test_a_stack_of_many_pieces_is_stored(many_pieces_by_piece):
    pieces = [transposed((3, 5), seed=40 + i) for i in range(9)]
    assert buffer_writers(lambda *xs: torch.stack(xs, 1).cos(), *pieces) == 9
    check(lambda *xs: torch.stack(xs, 1).cos(), *pieces)


def test_a_cat_of_max_masked_pieces_stays_one_node(many_pieces_by_piece):
    """As many as MAX_MASKED_PIECES: one masked node, fused into its reader."""
    pieces = many_pieces(concatenation.MAX_MASKED_PIECES)
    assert buffer_writers(rotated, *pieces) == 1
    assert most_inputs_per_kernel(check(rotated, *pieces).artifact) == len(pieces)


def test_many_pieces_switched_off_stay_one_node():  # the default
    pieces = many_pieces(12)
    assert buffer_writers(rotated, *pieces) == 1
    assert most_inputs_per_kernel(check(rotated, *pieces).artifact) == 12


def test_a_cat_inside_a_decomposition_is_stored_where_it_is_made(monkeypatch, many_pieces_by_piece):
    """diag_embed's decomposition cats zeros before its input and masks the result: a cat stored by
    piece is realized there too, not read lazily through its masks."""
    monkeypatch.setattr(concatenation, "MAX_MASKED_PIECES", 1)

    def fn(x):
        return torch.ops.aten.diag_embed.default(x, 1).sin()

    x = transposed((5, 3), seed=50)
    assert buffer_writers(fn, x) == 2
    check(fn, x)
