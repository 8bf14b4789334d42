"""The scheduler: fused kernel counts for named patterns, cycle and mutation safety,
memory planning, and the explanations it records."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import compiler
from client.runtime import load
from compiler import split_reductions
from compiler.explain import describe
from compiler.indexing import index_symbol
from compiler.inline_gathers import box_coordinates
from compiler.ir import Layout
from compiler.fx_import import from_fx, run_eager
from tests.compare import assert_close_outputs, assert_within_eager_error, reduction_passes
from tests.corpus import corpus_inputs, load_graph


def compile_and_check(fn, *inputs, options=None):
    """Compiles fn, checks outputs and mutated inputs against eager, returns the artifact."""
    graph = from_fx(make_fx(fn)(*inputs), inputs)
    artifact = compiler.compile(graph, "cpu", options)
    ours = [t.clone() for t in inputs]
    theirs = [t.clone() for t in inputs]
    assert_close_outputs(load(artifact)(*ours), [o for o in _eager_mutating(graph, theirs)])
    assert_close_outputs(ours, theirs, where="mutated inputs")
    return artifact


def _eager_mutating(graph, inputs):
    from compiler.fx_import import resolve_op, from_arg

    env = {spec.name: t for spec, t in zip(graph.inputs, inputs)}
    for node in graph.nodes:  # eager ATen on the caller's tensors, so in-place ops mutate them
        env[node.name] = resolve_op(node.target)(*[from_arg(a, env, torch.device("cpu")) for a in node.args],
                                                 **{k: from_arg(v, env, torch.device("cpu")) for k, v in node.kwargs.items()})
    return [from_arg(ref, env, torch.device("cpu")) for ref in graph.outputs]


def kernel_count(artifact) -> int:
    return len(artifact.manifest["kernels"])


x = torch.randn(9, 40)
w, b, r = torch.randn(40), torch.randn(40), torch.randn(9, 40)


def test_layer_norm_forward_is_one_kernel():
    assert kernel_count(compile_and_check(lambda x, w, b: F.layer_norm(x, (40,), w, b), x, w, b)) == 1


def test_softmax_is_one_kernel():
    assert kernel_count(compile_and_check(lambda x: torch.softmax(x, -1), x)) == 1


def test_bias_gelu_is_one_kernel():
    assert kernel_count(compile_and_check(lambda x, b: F.gelu(x + b, approximate="tanh"), x, b)) == 1


def test_residual_add_layer_norm_is_one_kernel_with_two_outputs():
    def residual_ln(x, r, w, b):
        h = x + r
        return h, F.layer_norm(h, (40,), w, b)

    artifact = compile_and_check(residual_ln, x, r, w, b)
    assert kernel_count(artifact) == 1
    kernel = artifact.manifest["kernels"][0]
    stored = [line for line in artifact.kernel_source(kernel).splitlines() if "tl.store(" in line]
    assert len(stored) == 2


def test_cross_entropy_forward_is_at_most_two_kernels():
    target = torch.randint(0, 40, (9,))
    assert kernel_count(compile_and_check(lambda x, t: F.cross_entropy(x, t), x, target)) <= 2


def test_looped_reductions_fuse_and_stay_correct():
    wide = torch.randn(3, 2500)  # wider than a persistent row: the kernel loops over the reduction
    artifact = compile_and_check(lambda x: (torch.softmax(x, -1), F.layer_norm(x, (2500,))), wide)
    assert kernel_count(artifact) == 1
    assert artifact.manifest["kernels"][0]["config"]["persistent"] is False


@pytest.mark.parametrize("name", ["adam_step_fp32", "adam_step_inplace_fp32"])
def test_adam_step_is_at_most_one_kernel_per_parameter(name):
    graph = load_graph(name)
    artifact = compiler.compile(graph, "cpu")
    params = sum(1 for spec in graph.inputs if spec.name.startswith("p"))
    assert params == 3
    assert 1 <= kernel_count(artifact) <= params
    inputs = corpus_inputs(name)
    assert_close_outputs(load(artifact)(*inputs), run_eager(graph, inputs))


def test_transpose_add_fuses_by_reordering_loops():
    artifact = compile_and_check(lambda a, b: torch.relu(a.t() + 1) * b, torch.randn(30, 20), torch.randn(20, 30))
    assert kernel_count(artifact) == 1


def test_fusion_across_an_extern_would_be_a_cycle_and_is_refused():
    def fn(a, m):
        h = torch.sigmoid(a)          # kernel
        p = h @ m                     # extern, needs h
        return h + p                  # needs h and p: fusing it with h would put p inside the group
    artifact = compile_and_check(fn, torch.randn(8, 8), torch.randn(8, 8))
    assert kernel_count(artifact) == 2
    reasons = [r["reason"] for r in artifact.manifest["fusion"]["refused"]]
    assert any("cycle" in reason for reason in reasons), reasons


def test_mutation_keeps_reads_before_and_after_in_order():
    def fn(a, c):
        before = a * 2
        a.add_(c)
        after = a * 3
        return before, after
    compile_and_check(fn, torch.randn(5, 7), torch.randn(5, 7))


def test_unfused_chain_planned_peak_memory_does_not_grow_with_length():
    def chain(n):
        def fn(a):
            for i in range(n):
                a = torch.sin(a) + i
            return a
        return fn
    peaks = []
    for n in (3, 12):
        for fusion in (False, True):
            artifact = compile_and_check(chain(n), torch.randn(6, 11), options={"fusion": fusion})
            peaks.append((fusion, artifact.plan["peak_bytes"]))
    unfused = [p for f, p in peaks if not f]
    fused = [p for f, p in peaks if f]
    assert unfused[0] == unfused[1]
    assert fused[0] == fused[1] <= unfused[0]


def test_internal_buffers_are_never_allocated():
    artifact = compile_and_check(lambda a: torch.exp(torch.sin(a) * 2) + 1, torch.randn(6, 11))
    allocations = [s for s in artifact.plan["steps"] if s["op"] == "alloc"]
    assert len(allocations) == 1  # the output only


def test_explain_lists_kernels_and_refusals():
    def fn(a, m):
        h = torch.sigmoid(a)
        return h + h @ m
    artifact = compile_and_check(fn, torch.randn(8, 8), torch.randn(8, 8))
    text = describe(artifact)
    assert "kernel" in text and "extern aten.mm.default" in text
    assert "fusions refused" in text and "cycle" in text
    assert "launch configs: heuristic launch configs" in text and "the score decided every fusion" in text


@pytest.mark.parametrize("fn, shape", [
    (lambda a: a.sum(), (1 << 18,)),                 # a full sum to a scalar
    (lambda a: a.sum(0), (1 << 16, 5)),              # a column sum of a tall matrix
    (lambda a: a.amax(-1), (2, 150_001)),            # a few very long rows
    (lambda a: a.to(torch.bfloat16).mean(), (600, 501)),
])
def test_large_reductions_with_few_outputs_are_split_in_two_kernels(fn, shape):
    artifact = compile_and_check(fn, torch.randn(*shape))
    partial, final = artifact.manifest["kernels"][-2:]
    assert final["numel"] * final["rnumel"] == partial["numel"]  # the final kernel reduces the partial results
    assert final["rnumel"] > 1 and partial["rnumel"] < math.prod(shape)


@pytest.mark.parametrize("dtype, shape", [
    (torch.float32, (4, 16, 64, 64)),   # 16 channels, 16,384 elements each: 16-way split
    (torch.bfloat16, (4, 24, 48, 60)),  # 11,520 elements each, not a power of two
])
def test_batch_norm_statistics_over_n_h_w_are_split_into_equal_chunks(dtype, shape, monkeypatch):
    """Training-mode BatchNorm: a welford reduction with one output per channel splits into chunk
    statistics and their combination (mean of means, M2 by the parallel formula). Output and running
    statistics are checked against a float64 run by Inductor's rule (error at most twice eager's),
    on data whose mean is far from zero, where a naive sum-of-squares variance would lose digits.
    A split kernel is free here, so that CPU-sized channels split as a GPU's big ones do."""
    monkeypatch.setattr(split_reductions, "LAUNCH_US", 0.0)
    channels = shape[1]

    def fn(x, weight, bias, running_mean, running_var):
        out = F.batch_norm(x, running_mean, running_var, weight, bias, training=True, momentum=0.1, eps=1e-5)
        return (out, running_mean, running_var)

    x = (torch.randn(shape) * 3 + 50).to(dtype)
    inputs = [x, torch.randn(channels, dtype=dtype), torch.randn(channels, dtype=dtype),
              torch.randn(channels, dtype=dtype), torch.rand(channels, dtype=dtype) + 0.5]
    artifact = compiler.compile(from_fx(make_fx(fn)(*[t.clone() for t in inputs]), inputs), "cpu")
    ours = load(artifact)(*[t.clone() for t in inputs])
    eager = fn(*[t.clone() for t in inputs])
    exact = fn(*[t.clone().double() for t in inputs])
    for got, theirs, want in zip(ours, eager, exact):
        error = lambda t: ((t.double() - want).norm() / want.norm()).item()  # noqa: E731
        assert error(got) <= 2 * error(theirs) + 1e-6, (error(got), error(theirs))
    reductions = [k for k in artifact.manifest["kernels"] if k["rnumel"] > 1]
    partial = max(reductions, key=lambda k: k["numel"])
    assert partial["numel"] > channels and partial["numel"] % channels == 0  # chunks x channels
    assert partial["numel"] * partial["rnumel"] == math.prod(shape)  # equal chunks tile every row


def test_cross_entropy_gathers_recompute_log_probs_instead_of_storing_them():
    logits, target = torch.randn(9, 40), torch.randint(0, 40, (9,))
    artifact = compile_and_check(lambda x, t: F.cross_entropy(x, t), logits, target)
    sizes = [meta["numel"] for meta in artifact.plan["buffers"].values()]
    assert max(sizes) < logits.numel()  # no [tokens x vocab] log-probabilities in memory


def test_a_gathered_pointwise_result_is_recomputed_at_the_gathered_index():
    def fn(a, idx):
        return torch.exp(a).index_select(0, idx) * 2
    artifact = compile_and_check(fn, torch.randn(50, 7), torch.tensor([3, 0, 49, 3]))
    assert all(meta["numel"] < 50 * 7 for meta in artifact.plan["buffers"].values())


@pytest.mark.parametrize("fn, loops", [
    (lambda x: F.cross_entropy(x, torch.arange(6) * 7), 1),                      # max + sum-exp in one pass
    (lambda x: torch.softmax(x, -1), 2),                                          # one online pass, one to write
    (lambda x: torch.softmax(x.masked_fill(x > 1, float("-inf")), -1), 2),        # -inf entries and rows
])
def test_wide_rows_use_an_online_softmax(fn, loops):
    wide = torch.randn(6, 3000)
    wide[0] = float("-inf")  # a fully masked row: eager gives NaN, so must we
    artifact = compile_and_check(fn, wide)
    source = artifact.kernel_source(artifact.manifest["kernels"][0])
    assert "_sum * " in source and len(reduction_passes(source)) == loops



@pytest.mark.parametrize("numel, rnumel, outer, split", [
    (256, 6272, False, False),     # ResNet's BatchNorm at 14x14: enough channels, a split only adds a kernel
    (128, 25088, False, False),    # at 28x28: whole rows keep the normalization in the kernel (re-read from L2)
    (64, 32 * 112 * 112, False, True),  # 64 channels of 401K elements: far too few programs
    (768, 4096, True, True),       # a bias gradient: a column sum of a tall matrix
    (3072, 8192, True, True),      # GPT-2's MLP bias gradient: 48 programs of columns, eight per SM wanted
    (4096, 32000, False, False),   # cross-entropy rows: plenty of programs
    (1, 1 << 20, False, True),     # a whole tensor to one value
    (1, 4096, False, False),       # too short to be worth a second kernel
    (30522, 4096, True, False),    # BERT's vocabulary bias gradient: 477 programs of columns already
    (24576, 1024, True, False),    # ConvMixer's channels-last means: 384 programs of columns
    (9600, 784, True, True),       # ReXNet's: 150 programs, split
])
def test_split_factor_weighs_unused_bandwidth_against_a_second_kernel(numel, rnumel, outer, split):
    factor = split_reductions.split_factor(numel, rnumel, outer)
    assert (factor > 1) == split
    if split:
        chunk = split_reductions.MIN_OUTER_CHUNK if outer else split_reductions.MIN_CHUNK
        assert rnumel // factor >= chunk
        programs = -(-numel // (split_reductions.OUTER_XBLOCK if outer else 1)) * factor
        full = split_reductions.FULL_OUTER_PROGRAMS if outer else split_reductions.FULL_PROGRAMS
        assert programs >= full or rnumel // (2 * factor) < chunk  # enough programs, or chunks as short as allowed


def test_an_outer_reduction_with_programs_enough_stays_whole_only_under_its_switch(monkeypatch):
    assert split_reductions.split_factor(30522, 4096, True) == 1
    monkeypatch.setattr(split_reductions, "WHOLE_OUTER_WHEN_BUSY", False)
    assert split_reductions.split_factor(30522, 4096, True) > 1  # the cost model alone splits it


def test_a_split_row_gets_chunks_short_enough_for_registers_or_programs_enough_for_loops():
    # 64 channels x 100352 (ResNet's BatchNorm at 56x56): 8 looped chunks of 12544 leave the SMs
    # half idle; 16 chunks of 6272 are each one load, and so are 49 of 2048 (a power of two)
    assert split_reductions.split_factor(64, 100352) == 49
    # a whole tensor to one value: 1024 looped chunks rather than 512
    assert split_reductions.split_factor(1, 1 << 24) == 1024


@pytest.mark.parametrize("numel, rnumel, outer, factor", [
    (768, 25088, True, 196),   # ConvNeXt's bias gradient: 196 chunks of 128 rows, not 128 of 196
    (1536, 6272, True, 49),    # 49 chunks of 128 rather than 32 of 196
    (768, 6304, True, 32),     # ViT's 32 x 197 rows: no power of two of 128+ divides them
    (64, 100352, True, 512),   # 784 chunks of 128 would pass MAX_EXACT_FACTOR: 512 of 196
    (64, 401408, False, 16),   # 49 chunks of 8192 would be held in registers where 16 of 25088 loop
])
def test_a_split_prefers_chunks_of_a_power_of_two_that_divide_the_row(numel, rnumel, outer, factor, monkeypatch):
    assert split_reductions.split_factor(numel, rnumel, outer) == factor
    monkeypatch.setattr(split_reductions, "EXACT_CHUNKS", False)
    power_of_two_factor = split_reductions.split_factor(numel, rnumel, outer)
    assert power_of_two_factor & (power_of_two_factor - 1) == 0 and power_of_two_factor <= factor


def test_a_column_reduction_read_in_pieces_of_its_row_is_cut_at_that_digit(monkeypatch):
    # ConvNeXt's 32 x 7 x 7 rows read through an NCHW tensor: 32 chunks of 49 rather than 8 of 196
    assert split_reductions.split_factor(768, 1568, True, frozenset({49})) == 32
    assert split_reductions.split_factor(768, 1568, True) == 8
    assert split_reductions.split_factor(768, 1568, True, frozenset({7})) == 8  # chunks too short
    # 32 chunks of 784 rows would be fewer than the cost model asks for (196 of 128)
    assert split_reductions.split_factor(768, 25088, True, frozenset({784})) == 196
    assert split_reductions.split_factor(768, 1568, False, frozenset({49})) == 1  # row reductions: not this rule
    monkeypatch.setattr(split_reductions, "DIGIT_CHUNKS", False)
    assert split_reductions.split_factor(768, 1568, True, frozenset({49})) == 8


def test_group_norm_backward_sums_over_a_channels_last_tensor_are_all_outer_and_split_alike(monkeypatch):
    """PoolFormer's GroupNorm(1) backward: per-(image, channel) sums over H x W, read through the
    decomposition's views of channels-last tensors. Judged on the indices as written, one of the
    two sums over the same tensor was inner (not split) and the other outer (split in 16)."""
    from compiler.ir import ComputeNode
    from compiler.lowering import lower

    def fn(grad, x, mean, rstd, weight):
        return torch.ops.aten.native_group_norm_backward(grad, x, mean, rstd, weight, 4, 16, 900, 1,
                                                         [True, True, True])

    cl = torch.channels_last
    grad, x = (torch.randn(4, 16, 30, 30).contiguous(memory_format=cl) for _ in range(2))
    inputs = [grad, x, torch.randn(4, 1), torch.rand(4, 1) + 0.5, torch.randn(16)]

    def hw_sums():
        program = lower(from_fx(make_fx(fn)(*inputs), inputs))
        return [n for n in program.nodes if isinstance(n, ComputeNode) and n.is_reduction and n.rnumel == 900]

    sums = hw_sums()
    assert len(sums) == 2 and all(split_reductions.is_outer(n) for n in sums)
    factors = {split_reductions.split_factor(n.numel, n.rnumel, True, split_reductions.row_digits(n, {}))
               for n in sums}
    assert len(factors) == 1
    monkeypatch.setattr(split_reductions, "SIMPLIFIED_READS", False)
    assert not all(split_reductions.is_outer(n) for n in hw_sums())
    monkeypatch.undo()
    compile_and_check(fn, *inputs)


def test_a_crossed_column_sum_over_images_splits_per_image_and_its_nchw_stores_lose_their_division():
    """ConvNeXt's drop-path backward: per-image scale of an NCHW tensor, its channels-last copy
    summed over N x H x W. Chunks of one 7 x 7 image make the NCHW stores contiguous."""
    def fn(g, scale, weight):
        div = g.expand(32, 16, 7, 7) / 49
        mul = div * scale
        rows = (mul * weight).permute(0, 2, 3, 1).contiguous().view(32 * 49, 16)
        return div, mul, rows, rows.sum(0)

    inputs = [torch.randn(32, 16, 1, 1), torch.randn(32, 1, 1, 1), torch.randn(1, 16, 1, 1)]
    artifact = compile_and_check(fn, *inputs)
    shapes = [(k["numel"], k["rnumel"]) for k in artifact.manifest["kernels"]]
    assert (32 * 16, 49) in shapes and (16, 32) in shapes, shapes
    partial = next(k for k in artifact.manifest["kernels"] if k["rnumel"] == 49)
    source = artifact.kernel_source(partial)
    assert "// 49" not in source and "% 49" not in source


@pytest.mark.parametrize("hw", [(7, 7), (14, 14)])
def test_channels_last_statistics_of_an_nchw_tensor_split_per_image_match_eager(hw):
    """BatchNorm-style var_mean over N x H x W of an NCHW tensor copied to channels-last: welford's
    chunks are whole images (49 or 196 rows), combined over 32 chunks; mean far from zero."""
    def fn(x):
        rows = x.permute(0, 2, 3, 1).contiguous().view(-1, x.shape[1])
        return (rows,) + torch.var_mean(rows, dim=0, correction=0)

    x = torch.randn(32, 12, *hw) * 2 + 3
    artifact = compile_and_check(fn, x)
    image = hw[0] * hw[1]
    assert (32 * 12, image) in [(k["numel"], k["rnumel"]) for k in artifact.manifest["kernels"]]


@pytest.mark.parametrize("reduce", ["sum", "var_mean"])
def test_a_column_reduction_split_into_a_non_power_of_two_number_of_chunks_matches_eager(reduce):
    """3072 rows (3 x 1024) cut into 24 chunks of 128: the final pass reduces 24 partials, and
    welford's chunk statistics combine over a count that is no power of two."""
    def fn(x):
        return (x.sum(0),) if reduce == "sum" else torch.var_mean(x, dim=0, correction=0)

    x = torch.randn(3072, 64) * 2 + 3
    artifact = compiler.compile(from_fx(make_fx(fn)(x), [x]), "cpu")
    shapes = [(k["numel"], k["rnumel"]) for k in artifact.manifest["kernels"]]
    assert (24 * 64, 128) in shapes and (64, 24) in shapes, shapes
    got = load(artifact)(x)
    reference = fn(x.double())
    for g, e, r in zip(got, fn(x), reference):
        assert_within_eager_error(g, e, r, reduce, floor=1e-5)


def test_welford_column_chunks_divide_the_row_by_its_largest_divisor_not_only_by_powers_of_two(monkeypatch):
    """Inception-v3's BatchNorm over 32 x 147 x 147 rows (2^5 x 21609): halving the cost model's 1024
    chunks until they divide left 32 (one image each); its largest divisor up to 1024 is 1008."""
    assert split_reductions.welford_factor(32 * 147 * 147, 1024, outer=True) == 1008
    assert split_reductions.welford_factor(32 * 147 * 147, 1024, outer=False) == 32  # row reductions: halved
    assert split_reductions.welford_factor(131, 8, outer=True) == 1  # a prime row: no equal chunks
    monkeypatch.setattr(split_reductions, "WELFORD_DIVISOR_CHUNKS", False)
    assert split_reductions.welford_factor(32 * 147 * 147, 1024, outer=True) == 32


def test_a_welford_column_reduction_split_by_an_odd_divisor_matches_float64():
    """var_mean over 1764 rows (2^2 x 3^2 x 7^2) of 64 columns: 7 chunks of 252 rows, not 4 of 441;
    the chunk statistics combine within eager's error, on data whose mean is far from zero."""
    def fn(x):
        return torch.var_mean(x, dim=0, correction=0)

    x = torch.randn(1764, 64) * 2 + 30
    artifact = compiler.compile(from_fx(make_fx(fn)(x), [x]), "cpu")
    shapes = [(k["numel"], k["rnumel"]) for k in artifact.manifest["kernels"]]
    assert (7 * 64, 252) in shapes and (64, 7) in shapes, shapes
    for g, e, r in zip(load(artifact)(x), fn(x), fn(x.double())):
        assert_within_eager_error(g, e, r, "var_mean", floor=1e-5)


def test_looped_welford_with_a_partial_last_step_matches_float64():
    """Looped welford (rows longer than a block, the last step masked): one reciprocal of the step
    number per step replaces a division per element; mean far from zero. CPU eager accumulates
    in double here (error ~1e-8), so the floor is float32's: a wrong weight or a mishandled tail
    step errs by 1e-3 or more."""
    def fn(x):
        return torch.var_mean(x, dim=(0, 2, 3), correction=0)

    x = torch.randn(4, 3, 40, 50) * 3 + 50  # 3 rows of 8,000 elements: not split, not a multiple of a block
    artifact = compiler.compile(from_fx(make_fx(fn)(x), [x]), "cpu")
    assert any("for roffset" in artifact.kernel_source(k) for k in artifact.manifest["kernels"])
    exact = fn(x.double())
    for got, theirs, want in zip(load(artifact)(x), fn(x), exact):
        error = lambda t: ((t.double() - want).norm() / want.norm()).item()  # noqa: E731
        assert error(got) <= 2 * error(theirs) + 1e-5, (error(got), error(theirs))


def test_a_cast_input_is_read_again_not_stored_and_reloaded_by_a_later_loop():
    """log_softmax of a bf16 tensor cast to float32 over rows too long for one block: the second
    and third loops read the bf16 input again and cast it, rather than writing a float32 copy in
    the first loop and reading it back (twice the bytes, and a buffer that need not exist)."""
    def fn(x):
        return torch.log_softmax(x.float(), -1)

    x = torch.randn(5, 3000).to(torch.bfloat16)
    artifact = compile_and_check(fn, x)
    (kernel,) = artifact.manifest["kernels"]
    source = artifact.kernel_source(kernel)
    passes = reduction_passes(source)
    assert len(passes) >= 2 and sum(text.count("tl.store(") for text in passes) == 1
    assert sum(meta["numel"] >= x.numel() for meta in artifact.plan["buffers"].values()) == 1  # the output


def test_a_stored_value_with_wider_inputs_is_read_back_not_recomputed():
    """The other side of the rule: a float32 sum of two float32 inputs reads 8 bytes per element
    to save reading 4 back, so the later loop loads it."""
    def fn(a, b):
        s = a + b
        return s / s.sum(-1, keepdim=True), s

    a, b = torch.rand(4, 3000), torch.rand(4, 3000)
    artifact = compile_and_check(fn, a, b)
    (kernel,) = artifact.manifest["kernels"]
    second_loop = reduction_passes(artifact.kernel_source(kernel))[1]
    assert second_loop.count("tl.load(") == 1


def test_group_norm_is_one_kernel_with_its_saved_statistics():
    """GroupNorm's statistics (over channels of a group and the spatial dims), the normalized output
    and the bf16 casts of mean and rstd it saves all map onto one looped kernel: the channel index
    of the output is split into (group, channel in group) by simplifying the view's index terms."""
    def fn(x, weight, bias):
        return torch.ops.aten.native_group_norm(x, weight, bias, 2, 8, 40 * 36, 4, 1e-5)

    x = torch.randn(2, 8, 40, 36).to(torch.bfloat16) * 2 + 3
    weight, bias = torch.randn(8).to(torch.bfloat16), torch.randn(8).to(torch.bfloat16)
    artifact = compile_and_check(fn, x, weight, bias)
    assert len(artifact.manifest["kernels"]) == 1


def test_widening_casts_are_recomputed_by_their_readers_not_stored(monkeypatch):
    """A bf16 BatchNorm backward computes in float32: it casts its input and incoming gradient up;
    the statistics kernel and the gradient kernel each read the bf16 tensors again rather than one
    writing float32 copies for the other to read back. (CPU eager wants bf16 saved statistics.)"""
    def fn(grad, x, weight, mean, invstd):
        return torch.ops.aten.native_batch_norm_backward(grad, x, weight, None, None, mean, invstd, True, 1e-5,
                                                         [True, True, True])

    monkeypatch.setattr(split_reductions, "LAUNCH_US", 0.0)  # split the statistics, as a GPU's big ones are
    x = (torch.randn(4, 6, 32, 32) * 2 + 1).to(torch.bfloat16)
    grad = torch.randn(4, 6, 32, 32).to(torch.bfloat16)
    weight, mean, invstd = [t.to(torch.bfloat16) for t in (torch.randn(6), torch.randn(6), torch.rand(6) + 0.5)]
    artifact = compile_and_check(fn, grad, x, weight, mean, invstd)
    assert len(artifact.manifest["kernels"]) > 1
    wide = [name for name, meta in artifact.plan["buffers"].items()
            if meta["numel"] >= x.numel() and meta["dtype"] == "float32"]
    assert not wide, wide


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def test_rotary_embedding_is_one_kernel_the_negated_half_recomputed_by_the_cat():
    """`q * cos + rotate_half(q) * sin`: the negated half has its own (half) iteration space, so no
    loop holds it with the cat that reads it; it is evaluated where the cat reads it, not stored."""
    q = torch.randn(2, 3, 5, 6, 18)  # odd sizes; read through a non-contiguous slice
    cos, sin = torch.randn(5, 1, 16), torch.randn(5, 1, 16)
    artifact = compile_and_check(lambda q, c, s: q[..., 1:17] * c + _rotate_half(q[..., 1:17]) * s, q, cos, sin)
    assert kernel_count(artifact) == 1


def test_rotary_backward_negated_half_is_recomputed_by_its_padding():
    """The rotary backward negates half of grad * sin and pads both halves back with slice_backward:
    the negated half is evaluated where its padding reads it, never stored (3 kernels before)."""
    def fn(grad, sin, cos):
        scaled = grad * sin
        half = scaled.shape[-1] // 2
        first = torch.ops.aten.slice_backward(scaled[..., :half], scaled.shape, -1, half, scaled.shape[-1], 1)
        second = torch.ops.aten.slice_backward(-scaled[..., half:], scaled.shape, -1, 0, half, 1)
        return grad * cos + first + second

    grad = torch.randn(3, 7, 4, 22)
    sin, cos = torch.randn(7, 1, 22), torch.randn(7, 1, 22)
    artifact = compile_and_check(fn, grad, sin, cos)
    assert kernel_count(artifact) <= 2
    assert all(meta["numel"] == grad.numel() for meta in artifact.plan["buffers"].values())  # no negated half
    # the recomputed half is read at its own coordinates shifted by the half (x - 11), not at a storage
    # offset taken apart again into a div/mod chain that only the mask keeps in range
    sources = "".join(artifact.kernel_source(k) for k in artifact.manifest["kernels"])
    assert "// 11" not in sources and "% 11" not in sources, sources


def test_box_coordinates_map_a_view_to_the_stored_layout():
    stored = Layout.contiguous((4, 6, 10), "float32")
    i, j, k = (index_symbol("x", n) for n in range(3))
    half = Layout((4, 6, 5), stored.stride, 5, "float32")  # x[..., 5:]
    assert box_coordinates(half, stored, (i, j, k)) == [i, j, k + 5]
    transposed = Layout((10, 6, 4), (1, 10, 60), 0, "float32")
    assert box_coordinates(transposed, stored, (i, j, k)) == [k, j, i]
    broadcast = Layout((3, 4, 6, 10), (0, 60, 10, 1), 0, "float32")
    assert box_coordinates(broadcast, stored, (index_symbol("y", 0), i, j, k)) == [i, j, k]
    assert box_coordinates(Layout((4, 3, 10), (60, 20, 1), 0, "float32"), stored, (i, j, k)) is None  # x[:, ::2]
    assert box_coordinates(Layout((4, 60), (60, 1), 0, "float32"), stored, (i, j)) is None  # a reshape
    assert box_coordinates(Layout((4, 6, 6), stored.stride, 5, "float32"), stored, (i, j, k)) is None  # past the end
    assert box_coordinates(Layout((4, 6, 10), stored.stride, 0, "int32"), stored, (i, j, k)) is None  # a bitcast


def test_fused_bf16_intermediates_stay_float32_and_only_stores_round():
    """A bf16 chain fused into one kernel rounds what it stores, not each op's result (two
    conversions per op and element, and no more accurate): one bf16 cast, at the store. An
    explicit cast in the chain still rounds, and the result stays within Inductor's rule."""
    def fn(x, y):
        return (torch.tanh(x * 0.5 + y) * y + x * x,)

    x, y = torch.randn(37, 41).to(torch.bfloat16), torch.randn(37, 41).to(torch.bfloat16)
    artifact = compile_and_check(fn, x, y)
    (kernel,) = artifact.manifest["kernels"]
    before_store = artifact.kernel_source(kernel).split("tl.store")[0]
    assert before_store.count(".to(tl.bfloat16)") == 0, before_store

    def with_cast(x, y):
        return ((x.float() * 3.0).to(torch.bfloat16) * y,)

    artifact = compile_and_check(with_cast, x, y)
    (kernel,) = artifact.manifest["kernels"]
    assert artifact.kernel_source(kernel).split("tl.store")[0].count(".to(tl.bfloat16)") == 1  # the cast's


def _rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def test_small_kernels_of_one_shape_share_a_launch_without_sharing_a_buffer():
    """Two RMS norms of different tensors: no buffer in common, so the fusion rounds never pair
    them; both are small, so they become one kernel (one launch instead of two)."""
    def fn(x, y, w, v):
        return _rms(x, w), _rms(y, v)

    artifact = compile_and_check(fn, torch.randn(16, 32), torch.randn(16, 32), torch.randn(32), torch.randn(32))
    assert kernel_count(artifact) == 1
    apart = compile_and_check(fn, torch.randn(16, 32), torch.randn(16, 32), torch.randn(32), torch.randn(32),
                              options={"max_fusion_size": 8})
    assert kernel_count(apart) == 2  # the size limit holds for them too


def test_fusion_never_swaps_two_draws_from_torch_generator():
    """With eager_random the dropouts are ATen calls drawing from torch's generator in program
    order. Fusing the two norms (small, same shape) would need y's dropout before the first norm's
    readers, among them the dropout of its result: the draws would swap and each mask would
    land on the other tensor. Draws depend on the previous draw, so that fusion is refused."""
    def fn(x, y, w):
        first = torch.ops.aten.native_dropout(_rms(x, w), 0.5, True)[0]  # as aot_autograd's graphs have it
        second = _rms(torch.ops.aten.native_dropout(y, 0.5, True)[0], w)
        return first, second

    x, y, w = torch.randn(16, 32), torch.randn(16, 32), torch.randn(32)
    graph = from_fx(make_fx(fn)(x, y, w), [x, y, w])
    artifact = compiler.compile(graph, "cpu", {"eager_random": True})
    torch.manual_seed(3)
    ours = load(artifact)(x, y, w)
    torch.manual_seed(3)
    assert_close_outputs(ours, run_eager(graph, [x, y, w]))


@pytest.mark.parametrize("special", [float("inf"), float("nan"), float("-inf")])
def test_an_online_softmax_row_with_an_infinity_or_nan_matches_eager(special):
    # the one-exponential update takes a new max and rescales in one step; +inf, NaN and -inf
    # entries must still give eager's NaN or finite rows, row by row
    wide = torch.randn(5, 3000)
    wide[1, 7] = special
    wide[2, 2999] = special
    wide[3, :] = float("-inf")
    wide[3, 1500] = special
    artifact = compile_and_check(lambda x: torch.log_softmax(x, -1), wide)
    assert "_gap" in artifact.kernel_source(artifact.manifest["kernels"][0])  # the online update ran
    compile_and_check(lambda x: torch.logsumexp(x, -1), wide)
