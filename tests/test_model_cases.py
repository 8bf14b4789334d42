"""The kernel benchmark's case set drawn from real models (bench/model_cases.py): capture on fake
tensors, cutting kernel groups into standalone wire graphs, dedupe, names, value ranges, the fx
module rebuilt from a wire graph, and the checked-in set (bench/cases). CPU only, tiny sizes."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
from pathlib import Path
from collections import Counter

import pytest
import torch

import compiler
from bench.case_cutting import cut, moved_bytes, structure_key, value_layouts, with_views_between
from bench.kernels import Settings, relative_error, run_model_case
from bench.model_capture import HELD_OUT_SOURCES, SOURCES, capture_source
from bench.model_cases import (CASES_DIR, case_from_json, case_inputs, case_to_json, cases_from_graphs, load_cases,
                               write_cases)
from client.runtime import load
from compiler.fx_import import from_fx, run_eager, to_fx
from compiler.graph import DTYPES, Graph, Node, Ref, TensorSpec, parse_graph, validate_graph
from compiler.options import Limits
from tests.corpus import corpus_inputs, load_graph

EXTERN_OPS = {"aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.convolution.default",
              "aten._scaled_dot_product_flash_attention_for_cpu.default", "aten.native_dropout.default"}
NAME = re.compile(r"^[a-z0-9]+(_[a-z0-9]+)*_(fw|bw)_[a-z0-9_]+_([0-9x]+|scalar)"  # source, graph kind, ops, shape
                  r"_(bf16|fp16|fp32|fp64|i64|i32|i8|u8|bool)(_\d+)?$")  # dtype, a number when the stem repeats


@pytest.fixture(scope="module")
def captured():
    return {source: capture_source(source, "tiny") for source in ("gpt2", "cnn_norm")}


@pytest.fixture(scope="module")
def case_set(captured):
    return cases_from_graphs(captured.items())


def raw_group_keys(captured, source: str) -> list[str]:
    """Every kernel-group case of a source before dedupe, by structure."""
    from bench.case_cutting import group_cases

    return [case.key for graph in captured[source] for case in group_cases(graph.graph, source, graph.name)]


# ---------------------------------------------------------------------------------
# (a) extraction at tiny sizes
# ---------------------------------------------------------------------------------


def test_each_source_yields_cases_and_repeated_layers_collapse(captured, case_set):
    for source in ("gpt2", "cnn_norm"):
        assert case_set.reports[source].kept > 0, case_set.reports[source].line(source)
    raw = raw_group_keys(captured, "gpt2")
    assert Counter(raw).most_common(1)[0][1] >= 2, "GPT-2's two identical layers must give repeated groups"
    kept = [case.key for case in case_set.cases if case.source == "gpt2"]
    assert len(kept) == len(set(kept)) == len(set(raw)) < len(raw)
    assert case_set.reports["gpt2"].duplicates == len(raw) - len(set(raw))


def test_names_are_unique_and_readable(case_set):
    names = [case.name for case in case_set.cases]
    assert len(names) == len(set(names))
    for case in case_set.cases:
        assert NAME.match(case.name) and case.name.startswith(f"{case.source}_{case.graph_name[:2]}_"), case.name


def test_cases_are_valid_wire_graphs_without_extern_calls(case_set):
    for case in case_set.cases:
        validate_graph(case.graph, Limits())
        assert parse_graph(case_to_json(case)["graph"]) == case.graph
        assert case.graph.inputs and case.graph.outputs
        assert not EXTERN_OPS & {node.target for node in case.graph.nodes}, case.name
        assert case.moved_bytes > 0


def test_cnn_norm_cases_hold_its_normalizations(case_set):
    ops = {node.target for case in case_set.cases if case.source == "cnn_norm" for node in case.graph.nodes}
    assert {"aten.native_group_norm.default", "aten.silu.default", "aten.relu.default"} <= ops
    assert any("batch_norm" in op for op in ops)


def test_fake_capture_matches_a_capture_on_real_tensors():
    """The bench sizes are captured on fake tensors; at tiny size the same code on real tensors
    must give the very same graphs."""
    from bench.model_capture import CNN_SIZES, ConvNormBlock, captured_graphs, run_compiled

    dims = CNN_SIZES["tiny"]
    block = ConvNormBlock(dims["channels"], dims["groups"]).train().to(dtype=torch.bfloat16)
    images = torch.randn(dims["batch"], dims["channels"], dims["side"], dims["side"], dtype=torch.bfloat16)
    real = captured_graphs("cnn_norm", run_compiled(lambda compiled: compiled(images), block, contextlib.nullcontext()))
    fake = capture_source("cnn_norm", "tiny")
    assert [structure_key(g.graph) for g in fake] == [structure_key(g.graph) for g in real if g.kind == "fw"]


def test_channels_last_captures_give_the_layouts_the_backend_compiles():
    """Captured as the backend rewrites convolutions (client/channels_last.py, setting "on": the CPU
    has no GPU for "auto"), the block's BatchNorm reads its convolution's result channels-last,
    although the meta kernel plans that result contiguous (bench/case_cutting.py lays it out as
    the device does); the block's output stays contiguous, as eager's is."""
    graphs = capture_source("cnn_norm", "tiny", channels_last="on")
    assert [structure_key(g.graph) for g in graphs] != [structure_key(g.graph) for g in capture_source("cnn_norm", "tiny")]
    norms = [case for case in cases_from_graphs([("cnn_norm", graphs)]).cases
             if any("batch_norm" in node.target for node in case.graph.nodes)]
    assert norms
    for case in norms:
        images = [spec for spec in case.graph.inputs if len(spec.shape) == 4]
        assert images and all(torch.empty_strided(spec.shape, spec.strides(), device="meta").is_contiguous(
            memory_format=torch.channels_last) for spec in images), case.name
    layouts = value_layouts(graphs[0].graph)
    output = graphs[0].graph.outputs[0]
    assert layouts[(output.ref, output.index)].stride == [512, 64, 8, 1]  # 2 x 8 x 8 x 8, contiguous


LOSS_INDEXING = ("nll_loss_forward", "nll_loss_backward", "gather", "scatter")  # a cross-entropy, whole or decomposed


def test_index_inputs_get_valid_ranges(case_set):
    losses = [c for c in case_set.cases if any(n.target.split(".")[1] in LOSS_INDEXING for n in c.graph.nodes)
              and any(s.dtype == "int64" for s in c.graph.inputs)]
    assert losses
    for case in losses:
        layouts = value_layouts(case.graph)
        node = next(n for n in case.graph.nodes if n.target.split(".")[1] in LOSS_INDEXING)
        if "nll_loss" in node.target:
            scores = node.args[0] if "forward" in node.target else node.args[1]
            classes = layouts[(scores.ref, scores.index)].shape[-1]
        else:  # gather / scatter(self, dim, index, ...)
            classes = layouts[(node.args[0].ref, node.args[0].index)].shape[node.args[1]]
        int_inputs = [s.name for s in case.graph.inputs if s.dtype == "int64"]
        assert int_inputs and all(case.input_ranges[name] == (0, classes) for name in int_inputs), case.name
        for spec, tensor in zip(case.graph.inputs, case_inputs(case, seed=3)):
            if spec.name in case.input_ranges:
                low, high = case.input_ranges[spec.name]
                assert low <= tensor.min().item() and tensor.max().item() < high


# ---------------------------------------------------------------------------------
# (b) cases compile with fusewire and match eager
# ---------------------------------------------------------------------------------


PICKS = ("native_layer_norm_backward", "add_native_layer_norm", "scatter", "safe_softmax",  # scatter: the loss backward
         "native_group_norm_silu", "batch_norm")


def tolerance(a: torch.dtype, b: torch.dtype) -> float:
    return 2e-2 if {a, b} & {torch.bfloat16, torch.float16} else 1e-4


def test_picked_cases_compile_and_match_eager(case_set):
    picked = [next(c for c in case_set.cases if pick in c.name or any(pick in n.target for n in c.graph.nodes))
              for pick in PICKS]  # a name lists at most four ops: a case may hold the op unnamed
    for case in picked:
        inputs = case_inputs(case, seed=1)
        expected = run_eager(case.graph, inputs)
        artifact = compiler.compile(case.graph, "cpu", {"autotune": False, "benchmark_fusion": False})
        ours = load(artifact)(*inputs)
        assert artifact.manifest["kernels"], case.name
        layouts = value_layouts(case.graph)
        for ref, got, want in zip(case.graph.outputs, ours, expected, strict=True):
            assert str(got.dtype).removeprefix("torch.") == layouts[(ref.ref, ref.index)].dtype  # PyTorch's meta dtype
            assert got.shape == want.shape
            # CPU eager returns bf16 normalization statistics where the meta kernel (and CUDA) say float32
            error = relative_error([got], [want])
            assert error <= tolerance(got.dtype, want.dtype), f"{case.name} {ref}: {error}"


def test_model_case_runs_through_the_benchmark_path_on_cpu(case_set, monkeypatch):
    import bench.kernels as kernels

    # timing needs CUDA: replays take these times, in this order (eager and fusewire in turn, 3 rounds,
    # then the same-bytes copy)
    replays = iter([1.0, 0.6, 2.0, 0.4, 3.0, 0.5, 0.5])
    monkeypatch.setattr(kernels, "graph_time_ms", lambda fn, inputs: next(replays))
    case = next(c for c in case_set.cases if "native_layer_norm_backward" in c.name)
    settings = Settings("cpu", copy_gbs=1.0, with_inductor=False, autotune=False, benchmark_fusion=False)
    row = run_model_case(case, settings)
    assert row["rel_error"] < 2e-2 and row["bytes"] == case.moved_bytes
    assert row["eager"]["rounds_ms"] == [1.0, 2.0, 3.0] and row["eager"]["ms"] == 2.0
    assert row["fusewire"]["rounds_ms"] == [0.6, 0.4, 0.5] and row["fusewire"]["ms"] == 0.5  # the median round
    assert row["fusewire"]["GB/s"] == round(case.moved_bytes / 0.5 / 1e6, 1)
    assert row["same_bytes_copy_ms"] == 0.5 and row["fusewire"]["%same_bytes_copy"] == 100.0
    assert row["plan_bytes"] >= row["bytes"] // 2  # what the kernels move: see the plan-bytes test


def test_plan_bytes_count_a_second_read_of_an_input_and_only_the_slice_a_kernel_reaches():
    import torch.nn.functional as F

    import compiler
    from bench.kernels import moved_by_plan, plan_bytes
    from compiler.fx_import import from_fx
    from torch.fx.experimental.proxy_tensor import make_fx

    def plan_of(fn, *inputs):
        graph = from_fx(make_fx(fn)(*inputs), list(inputs))
        return compiler.compile(graph, "cuda:sm_90", {"autotune": False, "benchmark_fusion": False}).plan

    x = torch.randn(32, 64, 56, 56)  # large enough that the statistics split into their own kernels
    w, b, mean, var = torch.randn(64), torch.randn(64), torch.randn(64), torch.rand(64) + 0.5
    plan = plan_of(lambda x, w, b, m, v: F.batch_norm(x, m, v, w, b, training=True), x, w, b, mean, var)
    case_bytes = 2 * x.numel() * 4  # its input and its output
    # the statistics read the input, the normalize pass reads it again and writes the output
    assert 3 * x.numel() * 4 <= plan_bytes(plan) < 3.05 * x.numel() * 4
    assert moved_by_plan({"bytes": case_bytes, "plan_bytes": plan_bytes(plan)}) == plan_bytes(plan)

    wide = torch.randn(4096, 300)
    sliced = plan_bytes(plan_of(lambda t: t[:, :100] * 2, wide))
    assert sliced == 2 * 4096 * 100 * 4  # a third of the input read, the product written
    assert moved_by_plan({"bytes": 10**9, "plan_bytes": sliced}) == 10**9  # never below the case's own

    # a kernel that reads an ATen call's result (a contraction's bmm, copied back in the sum's order)
    a, c = torch.randn(4, 32, 64), torch.randn(4, 64, 32)
    contraction = plan_of(lambda a, c: (a.unsqueeze(-1) * c.unsqueeze(1)).sum(2).transpose(1, 2) + 1, a, c)
    assert plan_bytes(contraction) >= 2 * 4 * 32 * 32 * 4  # at least the product read and its copy written


# ---------------------------------------------------------------------------------
# (c) the fx module rebuilt from a wire graph
# ---------------------------------------------------------------------------------


def assert_same(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, atol=0, rtol=0, equal_nan=True)


def test_rebuilt_fx_module_matches_run_eager(case_set):
    for case in case_set.cases:
        inputs = case_inputs(case, seed=2)
        assert_same(to_fx(case.graph)(*inputs), run_eager(case.graph, inputs))


def test_rebuilt_fx_module_with_constants_and_in_place_ops():
    table = torch.tensor([1.0, 2.0, 3.0])

    def fn(x):
        return (x * table).softmax(-1)

    x = torch.randn(4, 3)
    graph = from_fx(torch.fx.experimental.proxy_tensor.make_fx(fn)(x), [x])
    assert graph.constants
    assert_same(to_fx(graph)(x), run_eager(graph, [x]))
    adam = load_graph("adam_step_inplace_fp32")
    inputs = corpus_inputs("adam_step_inplace_fp32")
    before = [t.clone() for t in inputs]
    assert_same(to_fx(adam)(*inputs), run_eager(adam, inputs))
    assert_same(inputs, before)  # in-place ops work on copies, as in run_eager


def test_rebuilt_fx_module_compiles_with_torch_compile(case_set):
    case = next(c for c in case_set.cases if "native_layer_norm_backward" in c.name)
    inputs = case_inputs(case)
    module = to_fx(case.graph)
    backend = "inductor" if shutil.which("g++") or shutil.which("c++") else "eager"  # Inductor's CPU code is C++
    torch._dynamo.reset()
    try:
        got, want = torch.compile(module, backend=backend)(*inputs), module(*inputs)
    finally:
        torch._dynamo.reset()
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and relative_error([a], [b]) <= tolerance(a.dtype, b.dtype)


# ---------------------------------------------------------------------------------
# cutting one group
# ---------------------------------------------------------------------------------


def test_an_input_whose_shape_alone_is_used_moves_no_bytes():
    """A pool's backward takes the pool's input for its size: the case need not read it. Read by
    anything else too (here an add), it counts again."""
    grad = TensorSpec(name="g", dtype="float32", shape=[1, 2, 4, 4])
    x = TensorSpec(name="x", dtype="float32", shape=[1, 2, 8, 8])
    indices = TensorSpec(name="i", dtype="int64", shape=[1, 2, 4, 4])
    backward = Node(name="b", target="aten.max_pool2d_with_indices_backward.default",
                    args=[Ref(ref="g"), Ref(ref="x"), [2, 2], [2, 2], [0, 0], [1, 1], False, Ref(ref="i")])
    graph = Graph(version=1, inputs=[grad, x, indices], nodes=[backward], outputs=[Ref(ref="b")])
    assert moved_bytes(graph, value_layouts(graph)) == 32 * 4 + 32 * 8 + 128 * 4
    also_read = Graph(version=1, inputs=[grad, x, indices],
                      nodes=[backward, Node(name="s", target="aten.add.Tensor", args=[Ref(ref="b"), Ref(ref="x")])],
                      outputs=[Ref(ref="s")])
    assert moved_bytes(also_read, value_layouts(also_read)) == 32 * 4 + 32 * 8 + 128 * 4 + 128 * 4


def test_cut_keeps_views_between_members_and_exposes_what_others_read():
    graph = Graph(version=1, inputs=[TensorSpec(name="x", dtype="float32", shape=[4, 8]),
                                     TensorSpec(name="y", dtype="float32", shape=[8])],
                  nodes=[Node(name="a", target="aten.add.Tensor", args=[Ref(ref="x"), Ref(ref="y")]),
                         Node(name="v", target="aten.view.default", args=[Ref(ref="a"), [32]]),
                         Node(name="m", target="aten.mul.Tensor", args=[Ref(ref="v"), 2.0]),
                         Node(name="s", target="aten.sum.default", args=[Ref(ref="m")])],
                  outputs=[Ref(ref="s"), Ref(ref="a")])
    included = with_views_between(graph, {"a", "m"}, lowered={"a", "m", "s"})
    assert included == {"a", "v", "m"}
    piece = cut(graph, included, value_layouts(graph))
    assert [s.name for s in piece.inputs] == ["x", "y"] and [r.ref for r in piece.outputs] == ["a", "m"]
    x, y = torch.randn(4, 8), torch.randn(8)
    assert_same(run_eager(piece, [x, y]), [x + y, ((x + y) * 2).view(32)])
    assert moved_bytes(piece, value_layouts(piece)) == (32 + 8 + 32 + 32) * 4
    tail = cut(graph, {"s"}, value_layouts(graph))
    assert [s.name for s in tail.inputs] == ["m"] and tail.inputs[0].shape == [32]


def test_slices_of_one_buffer_read_one_input_and_stay_one_kernel():
    """DenseNet's backward adds: each reads a channel slice of one concatenated gradient, so the
    scheduler fuses them. Their case reads that gradient as one input (the slices inside the case,
    never outputs), counts only the channels the slices reach, and compiles to one kernel again."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from bench.case_cutting import group_cases
    from compiler.codegen import generate
    from compiler.lowering import lower
    from compiler.scheduler import schedule

    def grads(g, a, b, c):  # g: 4 x 20 channels; the adds read channels 0-15
        return a + g[:, 0:5], b + g[:, 5:10].relu(), c * g[:, 10:15] + g[:, 15:16]

    g = torch.randn(2, 20, 3, 3)
    others = [torch.randn(2, 5, 3, 3) for _ in range(3)]
    graph = from_fx(make_fx(grads)(g, *others), [g, *others])
    (case,) = group_cases(graph, "densenet", "bw0")
    assert len(case.graph.inputs) == 4 and case.graph.inputs[0].shape == [2, 20, 3, 3]
    assert {n.target for n in case.graph.nodes} >= {"aten.slice.Tensor"}
    assert not {r.ref for r in case.graph.outputs} & {n.name for n in case.graph.nodes if n.target == "aten.slice.Tensor"}
    reached = 2 * 16 * 3 * 3 * 4  # channels 0-15 of g
    assert case.moved_bytes == reached + 3 * 2 * 5 * 3 * 3 * 4 * 2  # the three others read, three results written
    assert len(generate(schedule(lower(case.graph), compiler.CompileOptions()), "cpu").kernels) == 1
    assert_same(run_eager(case.graph, [g, *others]), list(grads(g, *others)))


def test_case_files_round_trip(case_set, tmp_path):
    gpt2 = [c for c in case_set.cases if c.source == "gpt2"]
    cnn = [c for c in case_set.cases if c.source == "cnn_norm"]
    write_cases(gpt2[:3] + cnn, tmp_path)
    (tmp_path / "notes.json").write_text("{}")  # not a case file: left alone
    write_cases(gpt2[3:5], tmp_path, sources={"gpt2"})  # gpt2's earlier files go, cnn_norm's stay
    kept = gpt2[3:5] + cnn
    assert {p.name for p in tmp_path.glob("*.json")} == {f"{c.name}.json" for c in kept} | {"notes.json"}
    summary = lambda cases: sorted((c.name, c.key, c.moved_bytes, c.input_ranges, c.group) for c in cases)  # noqa: E731
    assert summary(load_cases(tmp_path)) == summary(kept)


# ---------------------------------------------------------------------------------
# (d) the checked-in set
# ---------------------------------------------------------------------------------


def test_checked_in_cases_load_and_validate():
    paths = sorted(CASES_DIR.glob("*.json"))
    assert len(paths) >= 40
    cases = [case_from_json(json.loads(path.read_text())) for path in paths]  # parse_graph validates
    assert [c.name for c in cases] == [p.stem for p in paths]
    assert len({c.key for c in cases}) == len(cases), "the checked-in set holds structural duplicates"
    for case in cases:
        assert case.source in SOURCES and NAME.match(case.name), case.name
        assert set(case.input_ranges) <= {spec.name for spec in case.graph.inputs}
        assert all(spec.dtype in DTYPES for spec in case.graph.inputs)
        assert case.moved_bytes == moved_bytes(case.graph, value_layouts(case.graph)), case.name


def test_the_held_out_set_is_one_case_per_family_none_of_them_in_the_main_set():
    """bench/held_out: cases of the held-out models that bench/cases lacks, the largest of each
    family (ops in order and input dtypes) that moves 1 MiB or more."""
    from bench.model_cases import HELD_OUT_DIR, family_key, one_per_family

    held_out = load_cases(HELD_OUT_DIR)
    assert len(held_out) >= 40
    assert all(case.source in HELD_OUT_SOURCES and NAME.match(case.name) for case in held_out)
    assert not {case.key for case in held_out} & {case.key for case in load_cases(CASES_DIR)}
    assert len({family_key(case) for case in held_out}) == len(held_out)
    assert min(case.moved_bytes for case in held_out) >= 1 << 20
    assert one_per_family(held_out, 1 << 20) == held_out


LATER_HELD_OUT_SETS = {  # folder: (its sources, its fewest cases)
    "held_out_2": ({"gemma", "phi"}, 40),
    "held_out_2_channels_last": ({"mobilenetv3", "densenet"}, 40),
    "held_out_3": ({"qwen2", "bigcode"}, 20),
    "held_out_3_images": ({"levit", "convmixer", "poolformer", "mixer", "beit", "cait", "xcit", "swinv2",
                           "convnextv2", "mobilevit"}, 150),
    "held_out_4_images": ({"nfresnet", "hrnet", "rexnet", "edgenext", "pvt_v2", "resnest"}, 130),
    "held_out_5": ({"nemotron", "olmo"}, 25),
    "held_out_5_images": ({"volo", "ghostnet", "tresnet", "maxvit", "inception", "coat"}, 130),
    "held_out_6": ({"cohere", "persimmon", "albert"}, 60),
    "held_out_6_images": ({"eva02", "skresnet", "res2net", "focalnet", "cspdarknet"}, 85),
    "held_out_7": ({"qwen3", "diffllama", "modernbert", "lfm2"}, 60),
    "held_out_7_images": ({"mvitv2", "efficientvit", "hiera", "eca_resnet"}, 85),
    "held_out_8": ({"deepseek_v3", "mamba2", "glm4", "convbert", "mobilebert"}, 140),
    "held_out_8_images": ({"fastvit", "gcvit", "dpn"}, 90),
    "held_out_9": ({"xlnet", "funnel", "stablelm", "qwen2_moe", "pegasus_x"}, 90),
    "held_out_9_images": ({"botnet", "mixnet", "twins", "bit", "samvit", "mambaout"}, 110),
    "held_out_10": ({"phi3", "olmo2", "esm", "gpt_oss"}, 80),
    "held_out_10_images": ({"halonet", "davit", "tiny_vit", "repvit", "inception_next", "crossvit"}, 110),
    "held_out_11": ({"granite", "starcoder2", "bitnet", "roformer"}, 50),
    "held_out_11_images": ({"tnt", "starnet", "vovnet", "efficientformerv2", "hgnetv2", "mobilenetv4"}, 110),
    "held_out_12": ({"qwen3_next", "recurrent_gemma", "xlstm", "apertus"}, 180),
    "held_out_12_images": ({"convit", "nest", "lambda_resnet", "ghostnetv2", "dla"}, 90),
}
# the sets each later set was deduplicated against (--exclude-dir), the first few of EARLIER_SETS
EARLIER_SETS = ("held_out", "held_out_2", "channels_last", "held_out_channels_last", "held_out_2_channels_last",
                "held_out_3", "held_out_3_images", "held_out_4_images", "held_out_5", "held_out_5_images", "held_out_6",
                "held_out_6_images", "held_out_7", "held_out_7_images", "held_out_autocast", "held_out_8",
                "held_out_8_images", "held_out_9", "held_out_9_images", "held_out_10", "held_out_10_images",
                "held_out_11", "held_out_11_images")
EARLIER_COUNT = {"held_out_3": 5, "held_out_3_images": 5, "held_out_4_images": 7, "held_out_5": 8,
                 "held_out_5_images": 8, "held_out_6": 10, "held_out_6_images": 10, "held_out_7": 12,
                 "held_out_7_images": 12, "held_out_8": 15, "held_out_8_images": 15,
                 "held_out_9": 17, "held_out_9_images": 17, "held_out_10": 19, "held_out_10_images": 19,
                 "held_out_11": 21, "held_out_11_images": 21, "held_out_12": 23, "held_out_12_images": 23}
# the zoo group each later set was captured from
SET_GROUP = {"held_out_4_images": "HELD_OUT_3", "held_out_5": "HELD_OUT_4", "held_out_5_images": "HELD_OUT_4",
             "held_out_6": "HELD_OUT_5", "held_out_6_images": "HELD_OUT_5", "held_out_7": "HELD_OUT_6",
             "held_out_7_images": "HELD_OUT_6", "held_out_8": "HELD_OUT_7", "held_out_8_images": "HELD_OUT_7",
             "held_out_9": "HELD_OUT_8", "held_out_9_images": "HELD_OUT_8", "held_out_10": "HELD_OUT_9",
             "held_out_10_images": "HELD_OUT_9", "held_out_11": "HELD_OUT_10", "held_out_11_images": "HELD_OUT_10",
             "held_out_12": "HELD_OUT_11", "held_out_12_images": "HELD_OUT_11"}


@pytest.mark.parametrize("folder", sorted(LATER_HELD_OUT_SETS))
def test_the_later_held_out_sets_hold_only_their_models_one_case_per_family(folder):
    """bench/held_out_2 (Gemma, Phi) and bench/held_out_2_channels_last (MobileNetV3, DenseNet, as the
    backend compiles them on a GPU): models added after the first held-out group had been worked on;
    bench/held_out_3 and held_out_3_images the same for the models after those, and held_out_4_images
    for the third group (zoo.HELD_OUT_3), held_out_5 and held_out_5_images for the fourth (Gemma-2's
    capture failed), held_out_6 and held_out_6_images for the fifth (Mixtral's capture failed), held_out_7
    and held_out_7_images for the sixth (FNet's FFT has no bf16 kernel: no cases), held_out_8 and
    held_out_8_images for the seventh (Switch Transformers' and Sequencer2D's captures failed), held_out_9
    and held_out_9_images for the eighth (Funnel's and PEGASUS-X's cases captured on the CPU), held_out_10
    and held_out_10_images for the ninth (Longformer's capture failed), held_out_11 and held_out_11_images for
    the tenth (M2M100's capture failed), held_out_12 and held_out_12_images for the eleventh (DBRX's capture
    failed), none of their cases in an earlier set."""
    import zoo
    from bench.model_cases import family_key, one_per_family

    sources, fewest = LATER_HELD_OUT_SETS[folder]
    cases = load_cases(CASES_DIR.parent / folder)
    assert len(cases) >= fewest and {case.source for case in cases} == sources
    assert sources <= set(getattr(zoo, SET_GROUP.get(folder, "HELD_OUT_2")))
    assert all(NAME.match(case.name) for case in cases)
    assert not {case.key for case in cases} & {case.key for case in load_cases(CASES_DIR)}
    earlier = EARLIER_SETS[:EARLIER_COUNT.get(folder, 0)]
    if earlier:
        assert not {case.key for case in cases} & {c.key for f in earlier for c in load_cases(CASES_DIR.parent / f)}
    assert len({family_key(case) for case in cases}) == len(cases)
    assert one_per_family(cases, 1 << 20) == cases
    for case in cases:
        assert case.moved_bytes == moved_bytes(case.graph, value_layouts(case.graph)), case.name


def test_the_mixed_precision_set_holds_new_kernels_of_autocast_steps_only():
    """bench/held_out_autocast: zoo models (and two held-out ones) trained with float32 weights under
    autocast to bf16, captured on the GPU (channels-last as "auto") after none of their kernels had been
    looked at, deduplicated against every other set: none of its cases is in one. Its cases hold what
    autocast adds: float32 weights cast to bf16 in the forward, gradients cast back to float32."""
    import zoo
    from bench.model_cases import family_key, one_per_family

    cases = load_cases(CASES_DIR.parent / "held_out_autocast")
    sources = {case.source for case in cases}
    assert len(cases) >= 120 and len(sources) == 8
    assert all(s.endswith("_autocast") and s.removesuffix("_autocast") in {*zoo.ZOO, *zoo.HELD_OUT} for s in sources)
    assert all(NAME.match(case.name) for case in cases)
    others = [f for f in (*EARLIER_SETS, *LATER_HELD_OUT_SETS, "cases") if f != "held_out_autocast"]
    assert not {case.key for case in cases} & {c.key for f in set(others) for c in load_cases(CASES_DIR.parent / f)}
    assert len({family_key(case) for case in cases}) == len(cases) and one_per_family(cases, 1 << 20) == cases
    casts = [case for case in cases if any(
        node.target == "aten._to_copy.default" and getattr(node.kwargs.get("dtype"), "dtype", None) in ("bfloat16", "float32")
        for node in case.graph.nodes)]
    assert len(casts) >= len(cases) // 2
    for case in cases:
        assert case.moved_bytes == moved_bytes(case.graph, value_layouts(case.graph)), case.name


def test_the_channels_last_set_holds_the_cnns_as_the_backend_compiles_them_on_a_gpu():
    """bench/channels_last: ResNet's and the CNN block's cases captured with convolutions rewritten
    channels-last (--channels-last auto on the GPU), none of them in bench/cases; every
    normalization reads a channels-last image."""
    from bench.model_cases import CHANNELS_LAST_DIR

    cases = load_cases(CHANNELS_LAST_DIR)
    assert len(cases) >= 40 and {case.source for case in cases} == {"resnet", "cnn_norm"}
    assert all(NAME.match(case.name) for case in cases)
    assert not {case.key for case in cases} & {case.key for case in load_cases(CASES_DIR)}
    norms = [case for case in cases if any("batch_norm" in node.target for node in case.graph.nodes)]
    assert len(norms) >= 20
    for case in norms:
        assert any(len(spec.shape) == 4 and spec.shape[1] > 1 and torch.empty_strided(
            spec.shape, spec.strides(), device="meta").is_contiguous(memory_format=torch.channels_last)
            and not torch.empty_strided(spec.shape, spec.strides(), device="meta").is_contiguous()
            for spec in case.graph.inputs), case.name


def test_one_per_family_keeps_the_case_moving_the_most_bytes_of_each_family():
    from bench.model_cases import family_key, one_per_family

    cases = load_cases(CASES_DIR)
    kept = one_per_family(cases, 1 << 20)
    families = {family_key(case) for case in cases if case.moved_bytes >= 1 << 20}
    assert len(kept) == len(families) < len(cases)
    for case in kept:
        same = [c for c in cases if family_key(c) == family_key(case)]
        assert case.moved_bytes == max(c.moved_bytes for c in same)
    assert [c.name for c in kept] == [c.name for c in cases if c in kept]  # in the order met


def test_known_cases_are_left_out_and_a_failed_capture_is_reported_not_raised(captured, case_set):
    """--exclude-dir: a case that duplicates a known one is not kept; a source whose capture
    failed (given as its exception) is reported as not cut, and the other sources still count."""
    gpt2 = [c for c in case_set.cases if c.source == "gpt2"]
    result = cases_from_graphs([("gpt2", captured["gpt2"]), ("broken", RuntimeError("no capture"))],
                               known=gpt2[:3])
    assert {c.key for c in result.cases} == {c.key for c in gpt2[3:]}
    assert result.reports["gpt2"].kept == len(gpt2) - 3
    assert result.reports["broken"].failed == ["capture: RuntimeError: no capture"]


def test_a_capture_past_its_time_limit_is_reported_and_the_next_source_still_runs(monkeypatch, captured):
    """Mamba's bench-size capture ran one Python step per token and held up every source after it:
    each capture has a time limit, past which it is reported as not cut."""
    import time as clock

    from bench import model_capture
    from bench.model_cases import extract_cases

    def capture_source(source, size, channels_last):
        if source == "slow":
            clock.sleep(5)
        return captured["gpt2"]

    monkeypatch.setattr(model_capture, "capture_source", capture_source)
    started = clock.perf_counter()
    result = extract_cases("tiny", ["slow", "gpt2"], capture_limit_s=0.5)
    assert clock.perf_counter() - started < 4
    assert result.reports["slow"].failed == ["capture: TimeoutError: took over 0.5 s"]
    assert result.reports["gpt2"].kept > 0


def test_captures_in_several_processes_keep_the_cases_of_one_process(case_set):
    """--jobs: sources captured in parallel processes are deduplicated in the order given, so the
    set is the one a single process cuts; an unknown source is reported, not raised."""
    from bench.model_cases import extract_cases

    result = extract_cases("tiny", ["gpt2", "cnn_norm", "no_such_model"], jobs=2)
    assert [(c.name, c.key) for c in result.cases] == [(c.name, c.key) for c in case_set.cases]
    assert result.reports["no_such_model"].failed[0].startswith("capture: KeyError")


def test_census_lists_the_cases_whose_sources_a_switch_changes_and_puts_the_switch_back():
    from bench.census import changed_cases
    from compiler import split_reductions

    folder = CASES_DIR.parent / "held_out_channels_last"
    changed = changed_cases("compiler.split_reductions.EXACT_CHUNKS", folder,
                            wanted=["convnext_bw_sum_25088x768", "convnext_fw_gelu_32x28x28x768"])
    assert changed == ["convnext_bw_sum_25088x768_bf16"]  # its rows are 196 x 128; a GELU has no split
    assert split_reductions.EXACT_CHUNKS is True


def test_a_census_of_several_switches_lists_each_ones_cases():
    from bench.census import changed_by_each
    from compiler import split_reductions, tiling

    folder = CASES_DIR.parent / "held_out_channels_last"
    switches = ["compiler.split_reductions.EXACT_CHUNKS", "compiler.tiling.STRIDED_WINDOWS_VOTE"]
    changed = changed_by_each(switches, folder, wanted=["convnext_bw_sum_25088x768", "convnext_fw_gelu_32x28x28x768"])
    assert changed == {switches[0]: ["convnext_bw_sum_25088x768_bf16"], switches[1]: []}
    assert split_reductions.EXACT_CHUNKS is True and tiling.STRIDED_WINDOWS_VOTE is True


def test_shards_split_a_case_set_into_disjoint_parts_that_cover_it():
    from bench.kernels import parse_shard, selected_runs

    folder = CASES_DIR.parent / "held_out_channels_last"
    everything = [name for name, _ in selected_runs("models", [], folder, 1 << 20)]
    parts = [[name for name, _ in selected_runs("models", [], folder, 1 << 20, (i, 3))] for i in range(3)]
    assert sorted(sum(parts, [])) == sorted(everything) and all(parts)
    assert parse_shard("2/3") == (2, 3)
    with pytest.raises(Exception, match="below n"):
        parse_shard("3/3")


def test_report_lines_name_the_cases_below_the_floor_and_count_large_cases_at_copy_speed():
    from bench.kernels import target_lines

    def row(name: str, ind_ms: float, fw_ms: float, mib: int, fw_copy: float, ind_copy: float) -> dict:
        return {"case": name, "bytes": mib << 20, "fusewire": {"ms": fw_ms, "%same_bytes_copy": fw_copy},
                "inductor": {"ms": ind_ms, "%same_bytes_copy": ind_copy}}

    lines = target_lines([row("fast", 1.2, 1.0, 100, 90.0, 80.0), row("slow", 0.9, 1.0, 100, 70.0, 86.0),
                          row("tiny", 1.0, 1.0, 1, 99.0, 99.0)])
    assert lines[0] == "below 0.97x inductor: 1 (slow 0.900)"
    assert lines[1] == "cases of 64 MiB+ at 85 % of a same-bytes copy: fusewire 1 of 2, inductor 1"
    assert len(lines) == 2  # no plan bytes measured: no third count

    slow_copy = row("slow", 0.9, 1.0, 100, 70.0, 86.0) | {"same_bytes_copy_ms": 0.7}
    reread = slow_copy | {"plan_bytes": (100 << 20) * 3 // 2}  # 1.5x its bytes at 70 % of a copy: 105 %
    lines = target_lines([reread, slow_copy | {"case": "plain", "plan_bytes": 100 << 20}])
    assert lines[2] == "...at 85 % of a copy's speed over the bytes their plan moves (plan_bytes): fusewire 1 of 2"


def test_where_it_loses_reads_its_case_specs_and_finds_no_inductor_kernels_it_was_told_of():
    import argparse

    from bench.where_it_loses import inductor_autotuners, inductor_kernels, parse_spec

    assert parse_spec("bench/held_out:convnext_bw") == (Path("bench/held_out"), "convnext_bw")
    with pytest.raises(argparse.ArgumentTypeError, match="FOLDER:NAME"):
        parse_spec("convnext_bw")
    assert inductor_kernels({id(t) for t in inductor_autotuners()}) == []


def test_a_model_whose_graph_breaks_compile_a_frame_again_is_captured_with_static_shapes():
    """Sequencer2D's LSTMs break dynamo's graph, and its blocks between them are compiled again:
    with automatic dynamic shapes their graphs took SymInt inputs, which no case can hold."""
    graphs = capture_source("sequencer", "tiny")
    assert len(graphs) > 2 and all(spec.dtype in DTYPES for g in graphs for spec in g.graph.inputs)
    report = cases_from_graphs([("sequencer", graphs)]).reports["sequencer"]
    assert report.kept > 0 and not report.failed, report.line("sequencer")


def test_a_benchmarked_fusion_is_reported_with_its_times():
    from bench.kernels import _benchmark_verdict

    decision = {"why_benchmarked": "looped reduction fused with work over the whole row", "fused": True,
                "fused_ms": 0.0386, "unfused_ms": [0.0150, 0.0108]}
    assert _benchmark_verdict(decision) == ("looped reduction fused with work over the whole row: kept "
                                            "(fused 0.0386 ms, parts 0.0258 ms)")
