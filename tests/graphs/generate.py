"""Generates the wire-graph corpus: tests/graphs/<name>.json and tests/graphs/inputs.json.

Every graph is a real training function (forward or backward) traced with make_fx at
ATen level with no decomposition table, so composite ops (aten._softmax,
aten.native_layer_norm, aten.gelu, aten.nll_loss_forward, ...) appear as themselves.
Backward graphs trace a function that calls torch.autograd.grad, so they hold the
backward ops (native_layer_norm_backward, _softmax_backward_data, gelu_backward, ...).

Each graph is checked as it is written: read back with parse_graph, it must hold the
ops its case expects, and run_eager on it must equal the traced function itself on
fresh random inputs (bit for bit), with finite outputs; anything else stops the script.

    .venv/bin/python tests/graphs/generate.py            # (re)writes the corpus
    .venv/bin/python tests/graphs/generate.py --check    # compares, writes nothing
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from compiler.fx_import import from_fx, random_inputs, run_eager, torch_dtype  # noqa: E402
from compiler.graph import graph_to_json, parse_graph  # noqa: E402

OUT = Path(__file__).resolve().parent
F32, BF16 = "float32", "bfloat16"
EPS = 1e-5


@dataclass(frozen=True)
class In:
    """One input: shape, dtype, value range [low, high) (ints: randint; floats: uniform),
    whether autograd differentiates it, and `transposed` for a view with its last two
    dims swapped (non-contiguous strides)."""

    shape: tuple[int, ...]
    dtype: str = F32
    range: tuple[float, float] | None = None
    grad: bool = False
    transposed: bool = False

    def strides(self) -> list[int]:
        shape = list(self.shape)
        if self.transposed:
            shape[-1], shape[-2] = shape[-2], shape[-1]
        strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
        if self.transposed:
            strides[-1], strides[-2] = strides[-2], strides[-1]
        return strides


@dataclass(frozen=True)
class Case:
    name: str
    fn: Callable
    inputs: tuple[In, ...]
    expect: tuple[str, ...] = field(default=())  # ops that must appear, undecomposed


# ---------------------------------------------------------------------------------
# The training functions
# ---------------------------------------------------------------------------------


def softmax(x):
    return torch.softmax(x, dim=-1)


def log_softmax(x):
    return F.log_softmax(x, dim=-1)


def softmax_upcast(x):
    return torch.softmax(x.float(), dim=-1).to(x.dtype)


def softmax_backward(x, grad):
    return torch.autograd.grad(torch.softmax(x, dim=-1), x, grad)


def layer_norm(x, weight, bias):
    return F.layer_norm(x, x.shape[-1:], weight, bias, EPS)


def layer_norm_backward(x, weight, bias, grad):
    return torch.autograd.grad(layer_norm(x, weight, bias), (x, weight, bias), grad)


def rms_norm(x, weight):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight


def rms_norm_upcast(x, weight):
    """The Llama form: normalise in float32, cast back, then scale."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    return h.to(x.dtype) * weight


def rms_norm_backward(x, weight, grad):
    return torch.autograd.grad(rms_norm(x, weight), (x, weight), grad)


def gelu(x):
    return F.gelu(x)


def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def gelu_backward(x, grad):
    return torch.autograd.grad(F.gelu(x), x, grad)


def gelu_tanh_backward(x, grad):
    return torch.autograd.grad(F.gelu(x, approximate="tanh"), x, grad)


def silu(x):
    return F.silu(x)


def swiglu(x):
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def swiglu_backward(x, grad):
    return torch.autograd.grad(swiglu(x), x, grad)


def bias_residual(x, bias, residual):
    return x + bias + residual


def bias_residual_layer_norm(x, bias, residual, weight, ln_bias):
    h = x + bias + residual
    return h, F.layer_norm(h, h.shape[-1:], weight, ln_bias, EPS)


def residual_rms_norm(x, residual, weight):
    h = x + residual
    return h, rms_norm_upcast(h, weight)


def cross_entropy(logits, targets):
    return F.cross_entropy(logits, targets)


def cross_entropy_backward(logits, targets):
    return torch.autograd.grad(F.cross_entropy(logits, targets), logits)


def attn_causal_triu(scores):
    n = scores.shape[-1]
    causal = torch.triu(torch.ones(n, n, dtype=torch.bool, device=scores.device), diagonal=1)
    return torch.softmax((scores * 0.25).masked_fill(causal, float("-inf")), dim=-1)


def attn_mask_where(scores, keep):
    """A padding-style bool mask input; masked scores get the dtype's lowest finite value."""
    return torch.softmax(torch.where(keep, scores * 0.25, torch.finfo(scores.dtype).min), dim=-1)


def attention(q, k, v):
    b, h, t, d = q.shape
    scores = q @ k.transpose(-2, -1) * d**-0.5
    causal = torch.triu(torch.ones(t, t, dtype=torch.bool, device=q.device), diagonal=1)
    probs = torch.softmax(scores.masked_fill(causal, float("-inf")), dim=-1)
    return (probs @ v).transpose(1, 2).reshape(b, t, h * d)


def attention_backward(q, k, v, grad):
    return torch.autograd.grad(attention(q, k, v), (q, k, v), grad)


def transpose_permute(x):
    return x.permute(2, 0, 1).contiguous(), x.transpose(0, 1).contiguous(), x.transpose(-1, -2) * 2.0


def noncontig_softmax(x):
    return torch.softmax(x * 2.0 + 1.0, dim=-1), x.sum(0)


def reductions(x):
    return x.sum(0), x.sum(-1), x.amax(-1), x.mean(0), x.sum(-1, keepdim=True)


def var_mean(x):
    var, mean = torch.var_mean(x, dim=-1, keepdim=True)
    return var, mean, (x - mean) * torch.rsqrt(var + EPS)


def mlp(x, w1, b1, w2, b2, w3):
    h = F.gelu(F.linear(x, w1, b1), approximate="tanh")
    return F.linear(h, w2, b2), F.linear(h, w3)


def mlp_backward(x, w1, b1, w2, b2, w3, grad):
    out, side = mlp(x, w1, b1, w2, b2, w3)
    return torch.autograd.grad((out, side.sum()), (x, w1, b1, w2, b2, w3), (grad, None))


ADAM = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, step=3)


def _adam_scalars() -> tuple[float, float]:
    a = ADAM
    step_size = a["lr"] / (1 - a["beta1"] ** a["step"])
    return step_size, math.sqrt(1 - a["beta2"] ** a["step"])


def adam_step(p0, g0, m0, v0, p1, g1, m1, v1, p2, g2, m2, v2):
    """AdamW over three params, written out with out-of-place tensor ops. Inputs: per param
    (param, grad, exp_avg, exp_avg_sq); outputs: per param the new (param, exp_avg, exp_avg_sq)."""
    return _adam(p0, g0, m0, v0, p1, g1, m1, v1, p2, g2, m2, v2)


def _adam(*tensors):
    a, (step_size, bc2_sqrt) = ADAM, _adam_scalars()
    out = []
    for p, g, m, v in zip(*[iter(tensors)] * 4):
        p = p * (1 - a["lr"] * a["weight_decay"])
        m = m * a["beta1"] + g * (1 - a["beta1"])
        v = v * a["beta2"] + g * g * (1 - a["beta2"])
        p = p.addcdiv(m, v.sqrt() / bc2_sqrt + a["eps"], value=-step_size)
        out += [p, m, v]
    return tuple(out)


def adam_step_inplace(p0, g0, m0, v0, p1, g1, m1, v1, p2, g2, m2, v2):
    """The same step as torch.optim.AdamW's for-loop writes it: in-place ops (on copies, so
    the graph's inputs are not mutated)."""
    return _adam_inplace(p0, g0, m0, v0, p1, g1, m1, v1, p2, g2, m2, v2)


def _adam_inplace(*tensors):
    a, (step_size, bc2_sqrt) = ADAM, _adam_scalars()
    out = []
    for p, g, m, v in zip(*[iter(tensors)] * 4):
        p, m, v = p.clone(), m.clone(), v.clone()
        p.mul_(1 - a["lr"] * a["weight_decay"])
        m.lerp_(g, 1 - a["beta1"])
        v.mul_(a["beta2"]).addcmul_(g, g, value=1 - a["beta2"])
        denom = (v.sqrt() / bc2_sqrt).add_(a["eps"])
        p.addcdiv_(m, denom, value=-step_size)
        out += [p, m, v]
    return tuple(out)


def clip_grad_norm(g0, g1, g2):
    """clip_grad_norm_(max_norm=1.0) written out; returns the clipped grads and the total norm."""
    grads = (g0, g1, g2)
    norms = torch.stack([torch.linalg.vector_norm(g, 2.0) for g in grads])
    total = torch.linalg.vector_norm(norms, 2.0)
    coef = torch.clamp(1.0 / (total + 1e-6), max=1.0)
    return tuple(g * coef for g in grads) + (total,)


def embedding(weight, ids):
    return F.embedding(ids, weight)


def embedding_backward(weight, ids, grad):
    return torch.autograd.grad(F.embedding(ids, weight), weight, grad)


def cat_slice(a, b):
    c = torch.cat([a, b], dim=1)
    return c[:, 3:40:2], c.narrow(0, 1, 5).sum(0), c[2] * 2.0, torch.cat([c[:, :5], a[:, -5:]], dim=0)


def index_select_gather(x, rows, cols):
    return x.index_select(0, rows), x.gather(1, cols), x[rows] + 1.0


# ---------------------------------------------------------------------------------
# The cases
# ---------------------------------------------------------------------------------


def _both(name: str, fn: Callable, inputs: Callable[[str], tuple[In, ...]], expect: tuple[str, ...] = (),
          dtypes: tuple[str, ...] = (F32, BF16)) -> list[Case]:
    short = {F32: "fp32", BF16: "bf16"}
    return [Case(f"{name}_{short[d]}", fn, inputs(d), expect) for d in dtypes]


def _adam_inputs() -> tuple[In, ...]:
    shapes = [(7, 33), (33,), (5, 3, 17)]
    return tuple(x for s in shapes for x in (In(s), In(s), In(s), In(s, range=(0.01, 1.0))))


def cases() -> list[Case]:
    ln = ("aten.native_layer_norm.default",)
    out = [
        *_both("softmax", softmax, lambda d: (In((7, 33), d),), ("aten._softmax.default",)),
        *_both("log_softmax", log_softmax, lambda d: (In((13, 50), d),), ("aten._log_softmax.default",)),
        Case("softmax_backward_fp32", softmax_backward, (In((7, 33), grad=True), In((7, 33))),
             ("aten._softmax_backward_data.default",)),
        Case("softmax_upcast_bf16", softmax_upcast, (In((7, 33), BF16),), ("aten._to_copy.default",)),
        *_both("layer_norm", layer_norm, lambda d: (In((5, 3, 17), d), In((17,), d), In((17,), d)), ln),
        *_both("layer_norm_backward", layer_norm_backward,
               lambda d: (In((5, 3, 17), d, grad=True), In((17,), d, grad=True), In((17,), d, grad=True), In((5, 3, 17), d)),
               ("aten.native_layer_norm_backward.default",)),
        Case("rms_norm_fp32", rms_norm, (In((5, 3, 17)), In((17,))), ("aten.rsqrt.default", "aten.mean.dim")),
        Case("rms_norm_bf16", rms_norm_upcast, (In((5, 3, 17), BF16), In((17,), BF16)), ("aten._to_copy.default",)),
        Case("rms_norm_backward_fp32", rms_norm_backward, (In((5, 3, 17), grad=True), In((17,), grad=True), In((5, 3, 17)))),
        *_both("gelu", gelu, lambda d: (In((7, 33), d),), ("aten.gelu.default",)),
        *_both("gelu_tanh", gelu_tanh, lambda d: (In((7, 33), d),), ("aten.gelu.default",)),
        Case("gelu_backward_fp32", gelu_backward, (In((7, 33), grad=True), In((7, 33))), ("aten.gelu_backward.default",)),
        Case("gelu_tanh_backward_bf16", gelu_tanh_backward, (In((7, 33), BF16, grad=True), In((7, 33), BF16)),
             ("aten.gelu_backward.default",)),
        *_both("silu", silu, lambda d: (In((7, 33), d),), ("aten.silu.default",)),
        *_both("swiglu", swiglu, lambda d: (In((7, 66), d),), ("aten.split.Tensor", "aten.silu.default")),
        Case("swiglu_backward_fp32", swiglu_backward, (In((7, 66), grad=True), In((7, 33))), ("aten.silu_backward.default",)),
        Case("bias_residual_fp32", bias_residual, (In((5, 3, 17)), In((17,)), In((5, 3, 17))), ("aten.add.Tensor",)),
        *_both("bias_residual_layer_norm", bias_residual_layer_norm,
               lambda d: (In((5, 3, 17), d), In((17,), d), In((5, 3, 17), d), In((17,), d), In((17,), d)), ln),
        Case("residual_rms_norm_bf16", residual_rms_norm, (In((5, 3, 17), BF16), In((5, 3, 17), BF16), In((17,), BF16))),
        *_both("cross_entropy", cross_entropy, lambda d: (In((13, 50), d), In((13,), "int64", range=(0, 50))),
               ("aten._log_softmax.default", "aten.nll_loss_forward.default")),
        *_both("cross_entropy_backward", cross_entropy_backward,
               lambda d: (In((13, 50), d, grad=True), In((13,), "int64", range=(0, 50))),
               ("aten.nll_loss_backward.default", "aten._log_softmax_backward_data.default")),
        *_both("attn_causal_triu", attn_causal_triu, lambda d: (In((2, 3, 9, 9), d),),
               ("aten.triu.default", "aten.masked_fill.Scalar", "aten._softmax.default")),
        Case("attn_mask_where_fp32", attn_mask_where, (In((2, 3, 9, 9)), In((9, 9), "bool")), ("aten.where.self",)),
        Case("attention_fp32", attention, (In((2, 3, 9, 16)),) * 3, ("aten.bmm.default", "aten._softmax.default")),
        Case("attention_backward_fp32", attention_backward, (In((2, 3, 9, 16), grad=True),) * 3 + (In((2, 9, 48)),),
             ("aten._softmax_backward_data.default", "aten.bmm.default")),
        Case("transpose_permute_fp32", transpose_permute, (In((5, 3, 17)),), ("aten.permute.default", "aten.transpose.int")),
        Case("noncontig_softmax_fp32", noncontig_softmax, (In((7, 33), transposed=True),), ("aten._softmax.default",)),
        Case("noncontig_layer_norm_bf16", layer_norm, (In((13, 50), BF16, transposed=True), In((50,), BF16), In((50,), BF16)), ln),
        *_both("reductions", reductions, lambda d: (In((13, 50), d),), ("aten.sum.dim_IntList", "aten.amax.default")),
        *_both("var_mean", var_mean, lambda d: (In((5, 3, 17), d),), ("aten.var_mean.correction",)),
        *_both("mlp", mlp, lambda d: (In((5, 3, 33), d), In((50, 33), d), In((50,), d), In((17, 50), d), In((17,), d), In((9, 50), d)),
               ("aten.addmm.default", "aten.mm.default")),
        Case("mlp_backward_fp32", mlp_backward,
             tuple(In(s, grad=True) for s in [(5, 3, 33), (50, 33), (50,), (17, 50), (17,), (9, 50)]) + (In((5, 3, 17)),),
             ("aten.mm.default", "aten.gelu_backward.default")),
        Case("adam_step_fp32", adam_step, _adam_inputs(), ("aten.addcdiv.default", "aten.sqrt.default")),
        Case("adam_step_inplace_fp32", adam_step_inplace, _adam_inputs(), ("aten.addcdiv_.default", "aten.lerp_.Scalar")),
        Case("clip_grad_norm_fp32", clip_grad_norm, (In((7, 33)), In((33,)), In((5, 3, 17))),
             ("aten.linalg_vector_norm.default", "aten.stack.default")),
        *_both("embedding", embedding, lambda d: (In((50, 16), d), In((5, 7), "int64", range=(0, 50))), ("aten.embedding.default",)),
        Case("embedding_backward_fp32", embedding_backward, (In((50, 16), grad=True), In((5, 7), "int64", range=(0, 50)), In((5, 7, 16))),
             ("aten.embedding_dense_backward.default",)),
        *_both("cat_slice", cat_slice, lambda d: (In((7, 33), d), In((7, 17), d)),
               ("aten.cat.default", "aten.slice.Tensor", "aten.select.int")),
        Case("index_select_gather_fp32", index_select_gather,
             (In((13, 50)), In((7,), "int64", range=(0, 13)), In((13, 5), "int64", range=(0, 50))),
             ("aten.index_select.default", "aten.gather.default", "aten.index.Tensor")),
    ]
    names = [c.name for c in out]
    assert len(names) == len(set(names)), "duplicate case names"
    return out


# ---------------------------------------------------------------------------------
# Tracing, checking, writing
# ---------------------------------------------------------------------------------


def make_inputs(case: Case, seed: int) -> list[torch.Tensor]:
    """Random example inputs with each In's layout and value range."""
    generator = torch.Generator().manual_seed(seed)
    tensors = []
    for spec in case.inputs:
        dtype = torch_dtype(spec.dtype)
        storage_shape = list(spec.shape)
        if spec.transposed:
            storage_shape[-1], storage_shape[-2] = storage_shape[-2], storage_shape[-1]
        if spec.range is not None and not dtype.is_floating_point:
            t = torch.randint(int(spec.range[0]), int(spec.range[1]), storage_shape, generator=generator)
        elif spec.range is not None:
            t = torch.empty(storage_shape).uniform_(spec.range[0], spec.range[1], generator=generator)
        elif dtype == torch.bool:
            t = torch.rand(storage_shape, generator=generator) < 0.5
        else:
            t = torch.randn(storage_shape, generator=generator)
        t = t.to(dtype)
        tensors.append(t.transpose(-1, -2) if spec.transposed else t)
    return tensors


def prepare(case: Case, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Fresh leaves (the caller's tensors untouched), requiring grad where the case says."""
    fresh = [t.detach().clone() for t in tensors]  # clone keeps the strides of dense tensors
    assert all(f.stride() == t.stride() for f, t in zip(fresh, tensors))
    return [f.requires_grad_(True) if spec.grad else f for spec, f in zip(case.inputs, fresh)]


def trace(case: Case):
    examples = make_inputs(case, seed=0)
    gm = make_fx(case.fn)(*prepare(case, examples))
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return from_fx(gm, examples)


def value_ranges(case: Case, graph) -> dict[str, list]:
    return {spec.name: list(i.range) for spec, i in zip(graph.inputs, case.inputs) if i.range is not None}


def check(case: Case, graph, ranges: dict[str, list]) -> None:
    """The graph as read back must hold the expected ops and compute what the function does."""
    targets = {node.target for node in graph.nodes}
    missing = [op for op in case.expect if op not in targets]
    if missing:
        raise SystemExit(f"{case.name}: expected ops {missing} missing; graph has {sorted(targets)}")
    for spec, i in zip(graph.inputs, case.inputs):
        if list(spec.shape) != list(i.shape) or spec.strides() != i.strides():
            raise SystemExit(f"{case.name}: input {spec.name} has shape {spec.shape} stride {spec.stride}, wanted {i.shape} {i.strides()}")
    for seed in (0, 1):
        inputs = random_inputs(graph, seed=seed, int_ranges={k: tuple(v) for k, v in ranges.items()})
        expected = _flat(case.fn(*prepare(case, inputs)))
        got = run_eager(graph, inputs)
        _compare(case.name, seed, expected, got)


def _flat(value) -> list[torch.Tensor]:
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _flat(v)]
    return [value]


def _compare(name: str, seed: int, expected: list, got: list) -> None:
    if len(expected) != len(got):
        raise SystemExit(f"{name}: function returns {len(expected)} tensors, graph {len(got)}")
    for i, (e, g) in enumerate(zip(expected, got)):
        e = e.detach()
        try:
            torch.testing.assert_close(g, e, rtol=0, atol=0, equal_nan=True)
        except AssertionError as exc:
            raise SystemExit(f"{name}: output {i} differs from the function (seed {seed}):\n{exc}") from None
        if g.is_floating_point() and not bool(torch.isfinite(g).all()):
            raise SystemExit(f"{name}: output {i} is not finite (seed {seed}); pick inputs that keep it finite")


def ranges_json(ranges: dict[str, dict[str, list]]) -> str:
    """inputs.json: one graph a line, {"<graph>": {"<input>": [low, high_exclusive]}}."""
    lines = [f"  {json.dumps(name)}: {json.dumps(r, sort_keys=True)}" for name, r in sorted(ranges.items())]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the files on disk, write nothing")
    parser.add_argument("names", nargs="*", help="only these cases")
    args = parser.parse_args()
    selected = [c for c in cases() if not args.names or c.name in args.names]
    ranges_path = OUT / "inputs.json"
    all_ranges = json.loads(ranges_path.read_text()) if ranges_path.exists() and args.names else {}
    stale = []
    for case in selected:
        text = graph_to_json(trace(case))
        graph = parse_graph(text)
        ranges = value_ranges(case, graph)
        check(case, graph, ranges)
        if ranges:
            all_ranges[case.name] = ranges
        path = OUT / f"{case.name}.json"
        if args.check:
            stale += [case.name] if not path.exists() or path.read_text() != text + "\n" else []
        else:
            path.write_text(text + "\n")
        print(f"{case.name:32s} {len(graph.inputs):3d} inputs {len(graph.nodes):4d} nodes {len(graph.outputs):3d} outputs")
    ranges_text = ranges_json(all_ranges)
    if args.check:
        stale += ["inputs.json"] if not args.names and ranges_path.read_text() != ranges_text else []
        if stale:
            raise SystemExit(f"out of date: {stale}; run {Path(__file__).relative_to(ROOT)}")
    else:
        ranges_path.write_text(ranges_text)
    print(f"{len(selected)} graphs {'checked' if args.check else 'written'} under {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
