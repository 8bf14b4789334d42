"""The partitioners the backend hands aot_autograd: with `min_cut`, a cross-entropy's backward reads
the low-precision logits and per-row numbers, never fp32 log-probabilities the forward had to write.
(The full training run through the service with min_cut is in test_client_backend.py.)"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch._dynamo.backends.common import aot_autograd

from client.backend import partition_options

ROWS, WIDTH, VOCAB = 48, 32, 500


def backward_inputs(partitioner: str) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """(shape, dtype) of every tensor the backward graph receives, for a bf16 LM head + cross-entropy."""
    torch._dynamo.reset()
    seen: list[tuple[tuple[int, ...], torch.dtype]] = []

    def backward(gm, example_inputs):
        seen.extend((tuple(t.shape), t.dtype) for t in example_inputs if isinstance(t, torch.Tensor))
        return gm

    def head(x, weight, labels):
        logits = (x @ weight.t()).float()
        return F.cross_entropy(logits, labels)

    step = torch.compile(head, backend=aot_autograd(fw_compiler=lambda gm, _: gm, bw_compiler=backward,
                                                    **partition_options(partitioner)))
    x = torch.randn(ROWS, WIDTH, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(VOCAB, WIDTH, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, VOCAB, (ROWS,))
    loss = step(x, weight, labels)
    loss.backward()
    expected = head(x.detach().requires_grad_(), weight, labels)
    torch.testing.assert_close(loss, expected)
    return seen


def test_min_cut_saves_the_logits_not_fp32_log_probabilities():
    default, min_cut = backward_inputs("save_all"), backward_inputs("min_cut")
    wide_fp32 = ((ROWS, VOCAB), torch.float32)
    assert wide_fp32 in default  # the default partition saves the log-probabilities
    assert wide_fp32 not in min_cut
    assert sum(torch.Size(s).numel() * d.itemsize for s, d in min_cut) < \
        sum(torch.Size(s).numel() * d.itemsize for s, d in default)


def test_the_default_partition_passes_nothing_to_aot_autograd():
    assert partition_options("save_all") == {}
    options = partition_options("min_cut")
    assert options["partition_fn"] is not None and torch.ops.aten._log_softmax.default in options["decompositions"]
