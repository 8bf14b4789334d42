"""A reduction kernel's row order chosen by its accesses (compiler.row_order): T5's attention bias,
stored (query, key, head), feeds a softmax whose rows are (batch, head, query). With the heads
innermost in the row order, the bias is contiguous across a block of rows. Checked against eager
(the CPU interpreter runs the reordered kernels), and on the GPU target's launch config."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from compiler.bounds import WorkLimits
from compiler.codegen import generate
from compiler.codegen.heuristics import KernelShape, launch_config
from compiler.fx_import import from_fx
from compiler.lowering import lower
from compiler.options import CompileOptions
from compiler.scheduler import KernelGroup, schedule
from tests.test_scheduler import compile_and_check


def attention_with_position_bias(scores, bias, mask):
    """T5's self-attention softmax: the bias (query, key, head) permuted to (1, head, query, key),
    masked, stored for the backward, added to the scores."""
    position_bias = torch.where(mask, bias.permute(2, 0, 1).unsqueeze(0).float(), torch.finfo(torch.bfloat16).min)
    stored = position_bias.to(torch.bfloat16)
    return torch.softmax(scores + stored.float(), -1), stored


def _inputs(batch: int, heads: int, queries: int, keys: int):
    scores = torch.randn(batch, heads, queries, keys)
    bias = torch.randn(queries, keys, heads).to(torch.bfloat16)
    mask = torch.rand(queries, keys) > 0.2
    return scores, bias, mask


def _reduction_groups(fn, *inputs) -> list[KernelGroup]:
    graph = from_fx(make_fx(fn)(*inputs), list(inputs))
    options = CompileOptions(autotune=False, benchmark_fusion=False)
    planned = schedule(lower(graph, WorkLimits()), options, None)
    return [s for s in planned.steps if isinstance(s, KernelGroup) and s.is_reduction], planned


@pytest.mark.parametrize("heads", [8, 5, 12])
def test_heads_innermost_rows_match_eager(heads):
    """Head counts of a power of two, an odd one and one that straddles a block of 16 rows;
    odd query and key counts leave partial blocks."""
    inputs = _inputs(2, heads, 7, 33)
    groups, _ = _reduction_groups(attention_with_position_bias, *inputs)
    assert [g.row_block for g in groups] == [heads]
    compile_and_check(attention_with_position_bias, *inputs)


def test_non_contiguous_scores_and_bias_stay_correct():
    scores, bias, mask = _inputs(2, 8, 9, 24)
    compile_and_check(attention_with_position_bias, scores.transpose(2, 3).contiguous().transpose(2, 3),
                      bias.transpose(0, 1).contiguous().transpose(0, 1), mask)


def test_a_plain_softmax_keeps_its_rows_in_order():
    groups, _ = _reduction_groups(lambda x: torch.softmax(x, -1), torch.randn(2, 8, 7, 33))
    assert [g.row_block for g in groups] == [1]


def test_heads_too_few_to_fill_a_vector_keep_the_order():
    """Two heads are contiguous over only half a block's steps: no gain worth the change."""
    groups, _ = _reduction_groups(attention_with_position_bias, *_inputs(2, 2, 7, 33))
    assert [g.row_block for g in groups] == [1]


def test_the_gpu_config_covers_a_block_of_heads():
    """The GPU target's starting config puts a whole block of heads in one program (a row of 512
    would otherwise run one row per program on one warp), with warps for the wider tile."""
    groups, planned = _reduction_groups(attention_with_position_bias, *_inputs(2, 8, 16, 512))
    [kernel] = [k for k in generate(planned, "cuda:sm_90").kernels if k.rnumel > 1]
    assert kernel.config["XBLOCK"] == 8 and kernel.config["num_warps"] == 8 and kernel.config["persistent"]
    assert "(xindex % 8)" in kernel.source


@pytest.mark.parametrize("rnumel, persistent", [(512, True), (20000, False)])
def test_launch_config_rounds_the_row_block_up_to_a_power_of_two(rnumel, persistent):
    config = launch_config(KernelShape(4096, rnumel, True, row_block=12), "cuda:sm_90")
    assert config["XBLOCK"] == 16 and config["persistent"] is persistent
    assert launch_config(KernelShape(4096, rnumel, True), "cuda:sm_90")["XBLOCK"] == 1


@pytest.mark.parametrize("keys, row_block", [(2048, 8), (4096, 1)])
def test_a_row_block_of_persistent_rows_stays_within_the_block_limit(keys, row_block):
    """8 heads of rows of 4096 held at once would be 32768 elements a program: past
    row_order.MAX_BLOCK_ELEMENTS the rows keep their order (PoolFormer's GroupNorm statistics asked
    for 64 rows of 4096, which need 512 KiB of shared memory on an H100)."""
    groups, _ = _reduction_groups(attention_with_position_bias, *_inputs(1, 8, 4, keys))
    assert [g.row_block for g in groups] == [row_block]


def head_sums(a, b):
    """CoaT's factorized attention context: (batch, head, token) times (batch, token, head) summed over
    the tokens. Rows (batch, head) are in order already; b is contiguous across the heads only."""
    return (a.float() * b.transpose(1, 2).float()).sum(-1)


@pytest.mark.parametrize("tokens", [37, 301])
def test_rows_in_order_whose_access_is_contiguous_across_them_take_a_block(tokens):
    inputs = torch.randn(3, 8, tokens).to(torch.bfloat16), torch.randn(3, tokens, 8).to(torch.bfloat16)
    groups, _ = _reduction_groups(head_sums, *inputs)
    assert [g.row_block for g in groups] == [8]
    compile_and_check(head_sums, *inputs)


def test_a_block_of_long_rows_loops_over_them_in_whole_rows(monkeypatch):
    """8 rows of 3137 are past the block limit for persistent rows: the block loops, 8 rows a program,
    and walks no aligned row windows, whose shift per row would break b's contiguity across rows."""
    import compiler.row_order as row_order

    inputs = torch.randn(2, 8, 3137).to(torch.bfloat16), torch.randn(2, 3137, 8).to(torch.bfloat16)
    _, planned = _reduction_groups(head_sums, *inputs)
    [kernel] = [k for k in generate(planned, "cuda:sm_90").kernels if k.rnumel > 1]
    assert kernel.config["XBLOCK"] == 8 and not kernel.config["persistent"] and "rshift" not in kernel.source
    monkeypatch.setattr(row_order, "OWN_ORDER_ROW_BLOCK", False)
    _, planned = _reduction_groups(head_sums, *inputs)
    [kernel] = [k for k in generate(planned, "cuda:sm_90").kernels if k.rnumel > 1]
    assert kernel.config["XBLOCK"] == 1
