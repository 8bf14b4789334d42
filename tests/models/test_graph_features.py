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


def test_a_graph_that_only_writes_its_inputs_compiles(api_server, tmp_path):
    """An optimizer-like update returns nothing; the wire format needs an output (the backend adds
    one and drops it)."""
    def fn(weight, grad):
        with torch.no_grad():
            weight.mul_(0.5).add_(grad, alpha=-0.1)

    compiled, be = compile_with(api_server, tmp_path, fn)
    weight, grad = torch.randn(5, 3), torch.randn(5, 3)
    mine, theirs = weight.clone(), weight.clone()
    assert compiled(mine, grad) is None
    fn(theirs, grad)
    torch.testing.assert_close(mine, theirs)
    assert be.stats["fallbacks"] == 0 and be.stats["graphs"] >= 1, be.stats


def test_batchnorm_running_statistics_are_written_by_the_compiled_graph(api_server, tmp_path, monkeypatch):
    """Train-mode BatchNorm updates its running statistics inside the forward graph fusewire compiles
    (aot_autograd's keep_inference_input_mutations), not by copies aot_autograd runs afterwards."""
    from client.backend import Backend

    graphs = []
    compile_graph = Backend.compile_graph
    monkeypatch.setattr(Backend, "compile_graph",
                        lambda self, gm, inputs, **kwargs: graphs.append(gm) or compile_graph(self, gm, inputs, **kwargs))
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    reference = torch.nn.Sequential(*(m for m in __import__("copy").deepcopy(model)))
    compiled, be = compile_with(api_server, tmp_path, model)
    x = torch.randn(2, 3, 7, 9)
    compiled(x).sum().backward()
    reference(x).sum().backward()
    for name, buffer in model.named_buffers():
        torch.testing.assert_close(buffer, dict(reference.named_buffers())[name], msg=name)
    forward = graphs[0]
    written = [n for n in forward.graph.nodes if n.op == "call_function" and "copy_" in str(n.target)]
    assert len(written) == 3, forward.graph  # running_mean, running_var, num_batches_tracked
    assert be.stats["fallbacks"] == 0
