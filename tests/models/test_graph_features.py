"""What real models' graphs hold besides ops, through the backend against the real stack with
on_error="raise" (any fallback fails the test): non-tensor and view outputs, ops with several
outputs, mutation of inputs, integer and SymInt inputs (dynamo's automatic dynamic shapes), and
captured constants."""

from __future__ import annotations

import torch

from client.backend import backend
from client_helpers import TOKEN


def compile_with(api_server, tmp_path, fn):
    be = backend(url=api_server.url, token=TOKEN, cache_dir=tmp_path, on_error="raise")
    return torch.compile(fn, backend=be), be


def test_non_tensor_view_and_multi_output_results(api_server, tmp_path):
    def fn(x):
        var, mean = torch.var_mean(x, 0)
        return x.t(), x.shape[0], var * 2, mean, x[1:].view(-1)

    compiled, be = compile_with(api_server, tmp_path, fn)
    x = torch.randn(6, 5)
    got, want = compiled(x), fn(x)
    assert got[1] == want[1] == 6
    for g, w in zip(got[:1] + got[2:], want[:1] + want[2:]):
        torch.testing.assert_close(g, w)
    assert be.stats["fallbacks"] == 0 and be.stats["graphs"] >= 1


def test_mutated_inputs_change_as_in_eager(api_server, tmp_path):
    def fn(x, running):
        running.mul_(0.9).add_(x.mean(0), alpha=0.1)
        return x - running

    compiled, be = compile_with(api_server, tmp_path, fn)
    x, running = torch.randn(7, 3), torch.randn(3)
    mine, theirs = running.clone(), running.clone()
    torch.testing.assert_close(compiled(x, mine), fn(x, theirs))
    torch.testing.assert_close(mine, theirs)
    assert not mine.equal(running) and be.stats["fallbacks"] == 0


def test_integer_and_symbolic_inputs_are_compiled_per_signature(api_server, tmp_path):
    def fn(x, n):
        return (x * n).softmax(-1)[:, :n]

    compiled, be = compile_with(api_server, tmp_path, fn)
    for rows, n in ((4, 2), (6, 3), (9, 5)):  # the second call makes dynamo mark sizes and n dynamic
        x = torch.randn(rows, 8)
        torch.testing.assert_close(compiled(x, n), fn(x, n))
    assert be.stats["fallbacks"] == 0 and be.stats["graphs"] >= 2, be.stats


def test_captured_constants_travel_with_the_graph(api_server, tmp_path):
    table = torch.randn(4, 8)

    def fn(x):
        low = torch.tensor(torch.finfo(x.dtype).min)  # a 0-d constant, as attention masks build them
        return torch.where(x > 0, x * table, low) + torch.tensor([1.0, 2.0, 3.0, 4.0])[:, None]

    compiled, be = compile_with(api_server, tmp_path, fn)
    x = torch.randn(4, 8)
    torch.testing.assert_close(compiled(x), fn(x))
    assert be.stats["fallbacks"] == 0 and be.stats["compiles"] + be.stats["remote_hits"] >= 1
