"""Real models train through fusewire: each zoo model (tests/models/zoo.py: GPT-2, LLaMA, BERT, T5
from transformers; a ResNet with BatchNorm in train mode and a ViT from timm; dropout > 0 where
the family has it) does one training step through the torch.compile backend against the real
stack (redis-server, a CPU Celery worker, the API), with on_error="raise".

Asserted: no graph falls back; the loss, every parameter gradient and every buffer (BatchNorm's
running statistics) pass Inductor's accuracy rule against a float64 run (tests/models/accuracy.py);
and a second process is served wholly from the service's cache (no compile, no fallback). The
zoo's held-out models (Mistral, GPT-NeoX, BLOOM, OPT, ConvNeXt, EfficientNet, Swin: nothing was
tuned on them) must train without fallback and pass the same rule."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from accuracy import StepResults, accuracy_failures, eager_steps, step_results
from client.backend import FusewireWarning
from svc_helpers import ROOT
from zoo import HELD_OUT, ZOO, build, float64_reference, make_batch
from zoo_step import compiled_step

MODELS = list(ZOO)
# never tuned on, never in bench/cases: Mistral, GPT-NeoX, BLOOM, OPT, ConvNeXt, EfficientNet, Swin,
# and a second group added later (zoo.HELD_OUT_2): Gemma, Phi, MobileNetV3, DenseNet, Qwen2, GPT-J,
# Falcon, DeBERTa-v2, LeViT, ConvMixer, PoolFormer, MLP-Mixer, RegNetY, Mamba, BART, MPT, GPT-BigCode,
# BEiT, CaiT, XCiT, Swin-v2, ConvNeXt-V2, MobileViT; and a third (zoo.HELD_OUT_3): NF-ResNet, HRNet,
# ReXNet, EdgeNeXt, PVT-v2, ResNeSt; and a fourth (zoo.HELD_OUT_4): Gemma-2, Nemotron, OLMo, VOLO, GhostNet,
# TResNet, MaxViT, Inception-v3, CoaT; and a fifth (zoo.HELD_OUT_5): Mixtral, Cohere, Persimmon, ALBERT,
# EVA-02, SK-ResNet, Res2Net, FocalNet, CSPDarknet; and a sixth (zoo.HELD_OUT_6): Qwen3, DiffLlama, ModernBERT,
# FNet (its Fourier transforms run as ATen calls on complex tensors), LFM2, MViT-v2, EfficientViT, Hiera,
# ECA-ResNet; and a seventh (tests/models/zoo_held_out_7.py): DeepSeek-V3, Mamba-2, GLM-4, ConvBERT, MobileBERT,
# Switch Transformers, Sequencer2D, FastViT, GC ViT, DPN; and an eighth (tests/models/zoo_held_out_8.py): XLNet,
# Funnel Transformer, StableLM, Qwen2-MoE, PEGASUS-X, BoTNet, MixNet, Twins-SVT, BiT, SAM's ViT, MambaOut; and a
# ninth (tests/models/zoo_held_out_9.py): Phi-3, OLMo-2, ESM-2, gpt-oss, Longformer, HaloNet, DaViT, TinyViT, RepViT,
# InceptionNeXt, CrossViT; and a tenth (tests/models/zoo_held_out_10.py): Granite, StarCoder2, BitNet, RoFormer, M2M100,
# TNT, StarNet, VoVNet, EfficientFormerV2, HGNetV2, MobileNetV4; and an eleventh (tests/models/zoo_held_out_11.py):
# Qwen3-Next, RecurrentGemma, xLSTM, Apertus, DBRX, ConViT, NesT, LambdaResNet, GhostNetV2, DLA
TRAINED_MODELS = MODELS + list(HELD_OUT)
# separate q/k/v linears (and LLaMA's gate/up): client/linear_groups.py groups them; GPT-2's and
# ViT's attention already project q/k/v with one weight. Longformer reads its grouped keys through a
# reshape and `as_strided` (the piece is made contiguous: client/linear_groups.py)
PROJECTS_ONE_INPUT_SEVERAL_TIMES = ("llama", "bert", "t5", "longformer")
# transformers' mixture of experts calls its custom op `grouped_mm_fallback` under torch.compile in
# float32 (client/local_ops.py)
CALLS_CUSTOM_OPS = ("mixtral",)
# convolutional models: on a GPU their half-precision convolutions run on channels-last tensors
# (client/channels_last.py, "auto"); CI's CPU runs the same rewrite with channels_last="on"
CONVOLUTIONAL = ("resnet", "efficientnet", "convnext", "mobilenetv3", "densenet", "convmixer", "poolformer")
HERE = Path(__file__).parent
# Values that sum a whole tensor whose terms cancel, so that which activations round across a ReLU's
# edge decides their last digits: HGNetV2's scalar affine parameters (y = a * x + b after each
# activation; b's gradient sums the next convolution's input gradient, which the BatchNorm after it
# makes cancel). Over four batches their errors moved from parameter to parameter, up to 3x the larger
# of eager's two runs', as eager on one thread against eager on two broke the plain rule on 3 of them;
# with the forward graph alone compiled and the backward eager they missed too, the backward alone
# compiled passed (CPU, 2026-11-29). Held to Inductor's floor for small tensors
# (torch._dynamo.utils.same: a tolerance of 1e-4, a tenth of it); every other value keeps the rule.
CHAOTIC_SUMS = {"hgnetv2": {".lab.": 1e-5}}
# DLA's last BatchNorm normalizes 8 values a channel (2 x 2 maps, 2 images) after some 30 BatchNorms in train
# mode. Eager on a CPU accumulates BatchNorm's statistics in float64 and rounds once (its saved means and
# inverse deviations err 0.3 float32 spacings, RMS); fusewire's kernels keep float32, two passes, one rsqrt,
# as Inductor and eager on a GPU do (0.6 spacings). Each of DLA's two graphs passes the rule output by output
# against a float64 run of the same graph (the worst, a saved mean, at 2.04x); over the whole step the
# statistics' extra rounding reaches the logits, and that BatchNorm's bias gradient erred 2.5x eager's in
# two of three batches (8.0e-6 against 3.3e-6 on values of RMS 0.2 in the first, which broke the rule; the
# rule's floor covered the second). Inductor (CPU) breaks the plain rule on 6 to 150 values of each of the same
# three batches (CPU, 2026-11-29). Held to Inductor's floor for small tensors, 1e-5, as HGNetV2's above.
BATCH_STATISTICS_IN_FLOAT64 = {"dla": {"level5.root.bn.bias": 1e-5}}


@pytest.fixture(scope="module")
def trained(api_server, tmp_path_factory):
    """name -> (float64 reference, float32 eager runs (accuracy.eager_steps), compiled, backend stats); each
    model trained once."""
    results: dict[str, tuple] = {}

    def train(name: str) -> tuple:
        if name not in results:
            model, batch = build(name, "tiny"), make_batch(name, "tiny")
            reference = step_results(float64_reference(model), name, batch)
            eager = eager_steps(model, name, batch)
            with warnings.catch_warnings():
                warnings.simplefilter("error", FusewireWarning)
                values, stats = compiled_step(name, api_server.url, tmp_path_factory.mktemp(f"cache-{name}"))
            results[name] = (reference, eager, StepResults(values), stats)
        return results[name]

    return train


@pytest.mark.parametrize("name", TRAINED_MODELS)
def test_training_step_compiles_without_fallback_and_passes_the_accuracy_rule(trained, name):
    reference, eager, compiled, stats = trained(name)
    assert stats.get("fallbacks", 0) == 0, stats
    assert stats["graphs"] >= 2, stats  # a forward and a backward graph at least
    # every graph was compiled or served; one seen earlier in the process (Sequencer's blocks between
    # the LSTMs dynamo leaves to eager repeat) comes from the local cache
    served = stats.get("compiles", 0) + stats.get("remote_hits", 0) + stats.get("local_hits", 0)
    assert served >= stats["graphs"], stats
    failures = accuracy_failures(reference, eager, compiled,
                                  CHAOTIC_SUMS.get(name) or BATCH_STATISTICS_IN_FLOAT64.get(name))
    assert not failures, "\n".join(failures)
    if name in PROJECTS_ONE_INPUT_SEVERAL_TIMES:  # their q/k/v (and gate/up) ran as one GEMM each
        assert stats.get("grouped_linears", 0) > 0, stats
    if name in CALLS_CUSTOM_OPS:  # those ran in the test's process, between compiled parts
        assert stats.get("local_ops", 0) > 0, stats


@pytest.mark.parametrize("name", CONVOLUTIONAL)
def test_convolutions_on_channels_last_tensors_train_and_pass_the_accuracy_rule(trained, api_server, tmp_path, name):
    reference, eager, _, _ = trained(name)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FusewireWarning)
        values, stats = compiled_step(name, api_server.url, tmp_path / "cache", channels_last="on")
    assert stats.get("channels_last_convs", 0) > 0, stats
    assert stats.get("fallbacks", 0) == 0 and stats.get("recompiles", 0) == 0, stats
    failures = accuracy_failures(reference, eager, StepResults(values))
    assert not failures, "\n".join(failures)


def test_batchnorm_running_statistics_are_updated_in_train_mode(trained):
    reference, _, compiled, _ = trained("resnet")
    fresh = dict(build("resnet", "tiny").named_buffers())
    running = [key for key in compiled.values if key.endswith("running_mean")]
    assert running
    for key in running:  # the step moved them (the rule above checks they moved as eager's did)
        assert not compiled.values[key].equal(fresh[key.removeprefix("buffer ")]), key
    assert compiled.values["buffer bn1.num_batches_tracked"].item() == 1


def test_dropout_drawn_in_kernels_trains_with_no_aten_dropout(trained, api_server, tmp_path):
    """The backend's default: dropout is drawn inside fusewire's kernels. BERT (dropout on its
    embeddings, attention probabilities and hidden states) trains with no fallback and no ATen
    random call but the one seed draw per graph; its masks differ from eager's, so the loss is
    held to eager's within what other masks move it, and every gradient is finite and of eager's size."""
    from client.backend import LocalCache
    from compiler.artifact import Artifact

    values, stats = compiled_step("bert", api_server.url, tmp_path, eager_random=False)
    assert stats.get("fallbacks", 0) == 0 and stats["graphs"] >= 2, stats
    targets = [step["target"] for blob in LocalCache(tmp_path).dir.glob("*.fwa")
               for step in Artifact.from_bytes(blob.read_bytes()).plan["steps"] if step["op"] == "extern"]
    assert "aten.randint.low" in targets
    assert not [t for t in targets if "dropout" in t or "bernoulli" in t], targets
    _, (eager, _), _, _ = trained("bert")
    assert values["loss"].item() == pytest.approx(eager.values["loss"].item(), rel=0.05)
    for key, grad in values.items():
        if not key.startswith("grad "):
            continue
        want = eager.values[key]
        assert grad.isfinite().all(), key
        assert grad.norm().item() == pytest.approx(want.norm().item(), rel=0.5, abs=1e-6), key


def test_a_second_process_is_served_wholly_from_the_service_cache(trained, api_server, compiles, tmp_path):
    first_losses = {name: trained(name)[2].values["loss"].item() for name in MODELS}
    before = compiles()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE)]), TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, str(HERE / "zoo_step.py"), api_server.url, str(tmp_path), *MODELS],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    for name in MODELS:
        stats = report[name]["stats"]
        assert stats.get("remote_hits", 0) == stats["graphs"] >= 2, (name, stats)
        assert "compiles" not in stats and "fallbacks" not in stats, (name, stats)
        assert report[name]["loss"] == pytest.approx(first_losses[name], rel=1e-6, abs=1e-7), name
    assert compiles() == before
