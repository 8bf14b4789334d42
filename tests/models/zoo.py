"""The model zoo: real model code from `transformers` and `timm`, built from configs with random
weights (no downloads), at two sizes: "tiny" for CI under Triton's interpreter and "bench"
for bench/models.py on a GPU.

    model = build("llama", "tiny")                 # an nn.Module in train mode
    batch = make_batch("llama", "tiny", seed=0)    # inputs for one step (on CPU)
    loss = step_loss(model, "llama", batch)        # forward and loss; the caller runs backward

Every model trains with dropout > 0 where its family has dropout (GPT-2, BERT, T5, ViT), and the
ResNet's BatchNorm runs in train mode (running statistics are updated in place).
"""

from __future__ import annotations

import copy

import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

SIZES = ("tiny", "bench")


def ensure_torchvision_importable() -> None:
    """timm needs torchvision, and PyPI's torchvision wheels are built against CUDA torch: with the
    CPU torch of CI their C extension does not load, and `import torchvision` then fails on the two
    ops it registers fake kernels for unconditionally. Defining those two op schemas (no kernels;
    nothing here calls them) lets the pure-Python parts that timm uses import. A torchvision whose
    extension loads (the GPU machine's) is left alone."""
    try:
        import torchvision  # noqa: F401
        return
    except RuntimeError as exc:
        if "torchvision::nms" not in str(exc):
            raise
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    library = torch.library.Library("torchvision", "DEF")
    library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    library.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _KEEP_ALIVE.append(library)
    import torchvision  # noqa: F401


_KEEP_ALIVE: list[Any] = []


@dataclass(frozen=True)
class Spec:
    """One zoo entry: how to build it at each size, and what a batch is."""

    build: Callable[[str], nn.Module]
    kind: str  # "causal_lm" | "masked_lm" | "seq2seq" | "image"
    batch: dict[str, tuple[int, ...]]  # size -> (batch, tokens) or (batch, channels, height, width)
    vocab: dict[str, int]  # size -> vocabulary (language models) or classes (image models)


ensure_torchvision_importable()  # transformers imports torchvision too, when it is installed


def _gpt2(size: str) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    dims = dict(n_layer=2, n_embd=32, n_head=2, n_positions=64) if size == "tiny" else \
        dict(n_layer=2, n_embd=768, n_head=12, n_positions=1024)
    return GPT2LMHeadModel(GPT2Config(vocab_size=ZOO["gpt2"].vocab[size], bos_token_id=0, eos_token_id=0, **dims))


def _llama(size: str) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    dims = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=64) if size == "tiny" else \
        dict(hidden_size=1024, intermediate_size=2816, num_attention_heads=16, num_key_value_heads=16,
             max_position_embeddings=1024)
    return LlamaForCausalLM(LlamaConfig(vocab_size=ZOO["llama"].vocab[size], num_hidden_layers=2, bos_token_id=0,
                                        eos_token_id=0, pad_token_id=0, **dims))


def _bert(size: str) -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    dims = dict(hidden_size=32, num_attention_heads=2, intermediate_size=64, max_position_embeddings=64) \
        if size == "tiny" else dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                                    max_position_embeddings=512)
    return BertForMaskedLM(BertConfig(vocab_size=ZOO["bert"].vocab[size], num_hidden_layers=2, pad_token_id=0, **dims))


def _t5(size: str) -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    dims = dict(d_model=32, d_ff=64, num_heads=2, d_kv=16) if size == "tiny" else \
        dict(d_model=512, d_ff=2048, num_heads=8, d_kv=64)
    return T5ForConditionalGeneration(T5Config(vocab_size=ZOO["t5"].vocab[size], num_layers=2, decoder_start_token_id=0,
                                               pad_token_id=0, eos_token_id=1, **dims))


def _resnet(size: str) -> nn.Module:
    from timm.models.resnet import BasicBlock, ResNet

    channels = (8, 16, 32, 64) if size == "tiny" else (64, 128, 256, 512)
    return ResNet(BasicBlock, [1, 1, 1, 1] if size == "tiny" else [2, 2, 2, 2], num_classes=CLASSES[size],
                  channels=channels, stem_width=channels[0])


def _vit(size: str) -> nn.Module:
    from timm.models.vision_transformer import VisionTransformer

    dims = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2) if size == "tiny" else \
        dict(img_size=224, patch_size=16, embed_dim=768, depth=2, num_heads=12)
    return VisionTransformer(num_classes=CLASSES[size], drop_rate=0.1, proj_drop_rate=0.1, **dims)


# ---------------------------------------------------------------------------------
# held-out models: never tuned on, never in bench/cases; bench/models.py and bench/model_cases.py
# (`--sources`) take them by name, to check that what the zoo taught generalizes
# ---------------------------------------------------------------------------------


def _lm_dims(size: str, **bench: Any) -> dict[str, Any]:
    """A 2-layer decoder: tiny for CI, or the given bench widths."""
    if size == "tiny":
        return dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, max_position_embeddings=64)
    return dict(max_position_embeddings=2048, **bench)


def _mistral(size: str) -> nn.Module:
    """Grouped-query attention (4 query heads per key/value head), RMSNorm, SiLU-gated MLP."""
    from transformers import MistralConfig, MistralForCausalLM

    dims = _lm_dims(size, hidden_size=1024, intermediate_size=3584, num_attention_heads=16)
    heads = dims["num_attention_heads"]
    return MistralForCausalLM(MistralConfig(vocab_size=HELD_OUT["mistral"].vocab[size], num_hidden_layers=2,
                                            num_key_value_heads=heads // 4, bos_token_id=0, eos_token_id=0,
                                            pad_token_id=0, **dims))


def _gpt_neox(size: str) -> nn.Module:
    """Pythia-style: rotary on a quarter of each head, attention and MLP in parallel, GELU, dropout."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    dims = _lm_dims(size, hidden_size=1024, intermediate_size=4096, num_attention_heads=16)
    return GPTNeoXForCausalLM(GPTNeoXConfig(vocab_size=HELD_OUT["gpt_neox"].vocab[size], num_hidden_layers=2,
                                            rotary_pct=0.25, use_parallel_residual=True, attention_dropout=0.1,
                                            hidden_dropout=0.1, bos_token_id=0, eos_token_id=0, **dims))


def _bloom(size: str) -> nn.Module:
    """ALiBi position biases, a LayerNorm on the embeddings, tanh-GELU, dropout."""
    from transformers import BloomConfig, BloomForCausalLM

    dims = dict(hidden_size=32, n_head=4) if size == "tiny" else dict(hidden_size=1024, n_head=16)
    return BloomForCausalLM(BloomConfig(vocab_size=HELD_OUT["bloom"].vocab[size], n_layer=2, hidden_dropout=0.1,
                                        attention_dropout=0.1, bos_token_id=0, eos_token_id=0, pad_token_id=0, **dims))


def _opt(size: str) -> nn.Module:
    """Learned positions (offset by 2), pre-LayerNorm, ReLU MLP, dropout."""
    from transformers import OPTConfig, OPTForCausalLM

    dims = dict(hidden_size=32, ffn_dim=64, num_attention_heads=4, word_embed_proj_dim=32,
                max_position_embeddings=64) if size == "tiny" else \
        dict(hidden_size=1024, ffn_dim=4096, num_attention_heads=16, word_embed_proj_dim=1024,
             max_position_embeddings=2048)
    return OPTForCausalLM(OPTConfig(vocab_size=HELD_OUT["opt"].vocab[size], num_hidden_layers=2, dropout=0.1,
                                    attention_dropout=0.1, bos_token_id=0, eos_token_id=0, pad_token_id=0, **dims))


def _convnext(size: str) -> nn.Module:
    """Depthwise 7x7 convolutions, LayerNorm over channels, GELU, layer scale, stochastic depth."""
    from timm.models.convnext import ConvNeXt

    dims = (8, 16, 32, 64) if size == "tiny" else (96, 192, 384, 768)
    return ConvNeXt(depths=(1, 1, 2, 1), dims=dims, num_classes=CLASSES[size], drop_path_rate=0.1)


def _efficientnet(size: str) -> nn.Module:
    """MBConv blocks: BatchNorm in train mode, SiLU, squeeze-and-excitation, dropout."""
    import timm

    variant = "tinynet_e" if size == "tiny" else "efficientnet_b0"  # tinynet_e: the same blocks, narrower
    return timm.create_model(variant, num_classes=CLASSES[size], drop_rate=0.2, drop_path_rate=0.1)


def _swin(size: str) -> nn.Module:
    """Shifted windows (roll, window partition), relative position biases, stochastic depth."""
    from timm.models.swin_transformer import SwinTransformer

    dims = dict(img_size=32, patch_size=2, window_size=4, embed_dim=16, num_heads=(1, 2)) if size == "tiny" else \
        dict(img_size=224, patch_size=4, window_size=7, embed_dim=96, num_heads=(3, 6, 12, 24))
    depths = (2,) * len(dims["num_heads"])
    return SwinTransformer(num_classes=CLASSES[size], depths=depths, drop_path_rate=0.1, **dims)


def _gemma(size: str) -> nn.Module:
    """RMSNorm scaled by 1 + weight, embeddings scaled by sqrt(hidden), tanh-GELU-gated MLP, one
    key/value head (multi-query), a 256K vocabulary at bench size."""
    from transformers import GemmaConfig, GemmaForCausalLM

    dims = _lm_dims(size, hidden_size=1024, intermediate_size=4096, num_attention_heads=8)
    dims["head_dim"] = 8 if size == "tiny" else 128
    return GemmaForCausalLM(GemmaConfig(vocab_size=HELD_OUT_2["gemma"].vocab[size], num_hidden_layers=2,
                                        num_key_value_heads=1, hidden_activation="gelu_pytorch_tanh",
                                        bos_token_id=0, eos_token_id=0, pad_token_id=0, **dims))


def _phi(size: str) -> nn.Module:
    """Phi-1/2: rotary on half of each head, attention and MLP in parallel off one LayerNorm,
    tanh-GELU (gelu_new), dropout on embeddings, residuals and attention."""
    from transformers import PhiConfig, PhiForCausalLM

    dims = _lm_dims(size, hidden_size=1024, intermediate_size=4096, num_attention_heads=16)
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    return PhiForCausalLM(PhiConfig(vocab_size=HELD_OUT_2["phi"].vocab[size], num_hidden_layers=2, resid_pdrop=0.1,
                                    embd_pdrop=0.1, attention_dropout=0.1, rope_parameters=rope, bos_token_id=0,
                                    eos_token_id=0, pad_token_id=0, **dims))


def _mobilenetv3(size: str) -> nn.Module:
    """Depthwise-separable inverted residuals, hard-swish, squeeze-and-excitation with hard-sigmoid
    gates, BatchNorm in train mode, dropout."""
    import timm

    variant = "mobilenetv3_small_050" if size == "tiny" else "mobilenetv3_large_100"
    return timm.create_model(variant, num_classes=CLASSES[size], drop_rate=0.2)


def _densenet(size: str) -> nn.Module:
    """Dense blocks: every layer's input is the concatenation of all earlier outputs, each through
    BatchNorm + ReLU + convolution; average-pooled transitions."""
    from timm.models.densenet import DenseNet

    dims = dict(growth_rate=8, block_config=(2, 2), bn_size=2) if size == "tiny" else \
        dict(growth_rate=32, block_config=(6, 12, 24, 16), bn_size=4)  # DenseNet-121
    return DenseNet(num_classes=CLASSES[size], drop_rate=0.1, **dims)


def _qwen2(size: str) -> nn.Module:
    """Grouped-query attention with biased q/k/v projections, RMSNorm, SiLU-gated MLP."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    dims = _lm_dims(size, hidden_size=1024, intermediate_size=2816, num_attention_heads=16)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=HELD_OUT_2["qwen2"].vocab[size], num_hidden_layers=2,
                                        num_key_value_heads=dims["num_attention_heads"] // 2, bos_token_id=0,
                                        eos_token_id=0, pad_token_id=0, **dims))


def _gptj(size: str) -> nn.Module:
    """Rotary on a slice of each head with interleaved (every-two) pairs, attention and MLP in
    parallel off one LayerNorm, dropout."""
    from transformers import GPTJConfig, GPTJForCausalLM

    dims = dict(n_embd=32, n_head=4, rotary_dim=4, n_positions=64) if size == "tiny" else \
        dict(n_embd=1024, n_head=16, rotary_dim=32, n_positions=2048)
    return GPTJForCausalLM(GPTJConfig(vocab_size=HELD_OUT_2["gptj"].vocab[size], n_layer=2, resid_pdrop=0.1,
                                      embd_pdrop=0.1, attn_pdrop=0.1, bos_token_id=0, eos_token_id=0, pad_token_id=0,
                                      **dims))


def _falcon(size: str) -> nn.Module:
    """Multi-query attention, attention and MLP in parallel, dropout."""
    from transformers import FalconConfig, FalconForCausalLM

    dims = dict(hidden_size=32, num_attention_heads=4) if size == "tiny" else dict(hidden_size=1024, num_attention_heads=16)
    return FalconForCausalLM(FalconConfig(vocab_size=HELD_OUT_2["falcon"].vocab[size], num_hidden_layers=2,
                                          multi_query=True, parallel_attn=True, hidden_dropout=0.1,
                                          attention_dropout=0.1, bos_token_id=0, eos_token_id=0, pad_token_id=0, **dims))


def _deberta(size: str) -> nn.Module:
    """Disentangled attention: content-to-position and position-to-content scores gathered from
    bucketed relative positions (log buckets, clamps, gathers)."""
    from transformers import DebertaV2Config, DebertaV2ForMaskedLM

    dims = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, max_position_embeddings=64,
                position_buckets=16) if size == "tiny" else \
        dict(hidden_size=768, intermediate_size=3072, num_attention_heads=12, max_position_embeddings=512,
             position_buckets=256)
    return DebertaV2ForMaskedLM(DebertaV2Config(vocab_size=HELD_OUT_2["deberta"].vocab[size], num_hidden_layers=2,
                                                relative_attention=True, pos_att_type=["p2c", "c2p"],
                                                max_relative_positions=-1, pad_token_id=0, **dims))


def _levit(size: str) -> nn.Module:
    """Convolutional stem, attention with learned biases indexed by relative offset, hard-swish,
    BatchNorm after every linear."""
    from timm.models.levit import Levit

    dims = dict(img_size=32, embed_dim=(16, 32), key_dim=8, num_heads=(2, 2), depth=(1, 1)) if size == "tiny" else \
        dict(img_size=224, embed_dim=(128, 256, 384), key_dim=16, num_heads=(4, 6, 8), depth=(2, 3, 4))
    return Levit(num_classes=CLASSES[size], **dims)


def _convmixer(size: str) -> nn.Module:
    """Patch embedding, then depthwise and pointwise convolutions, each followed by GELU and BatchNorm."""
    from timm.models.convmixer import ConvMixer

    dims = dict(dim=32, depth=2, kernel_size=3, patch_size=4) if size == "tiny" else \
        dict(dim=768, depth=8, kernel_size=7, patch_size=7)
    return ConvMixer(num_classes=CLASSES[size], **dims)


def _poolformer(size: str) -> nn.Module:
    """Average pooling as the token mixer, GroupNorm over whole images, layer scale, stochastic depth."""
    from timm.models.metaformer import GroupNorm1, MetaFormer, Pooling

    dims = dict(depths=(1, 1, 1, 1), dims=(8, 16, 32, 64)) if size == "tiny" else \
        dict(depths=(2, 2, 6, 2), dims=(64, 128, 320, 512))  # PoolFormer-S12
    return MetaFormer(num_classes=CLASSES[size], token_mixers=Pooling, mlp_act=nn.GELU, mlp_bias=True,
                      norm_layers=GroupNorm1, downsample_norm=None, layer_scale_init_values=1e-5,
                      res_scale_init_values=None, use_mlp_head=False, drop_path_rate=0.1, **dims)


def _mixer(size: str) -> nn.Module:
    """MLP-Mixer: token-mixing MLPs over transposed patches, LayerNorm, GELU, stochastic depth."""
    from timm.models.mlp_mixer import MlpMixer

    dims = dict(img_size=32, patch_size=8, num_blocks=2, embed_dim=32) if size == "tiny" else \
        dict(img_size=224, patch_size=16, num_blocks=8, embed_dim=512)
    return MlpMixer(num_classes=CLASSES[size], drop_path_rate=0.1, **dims)


def _regnety(size: str) -> nn.Module:
    """RegNetY-200MF: grouped 3 x 3 convolutions, squeeze-and-excitation with sigmoid gates, BatchNorm
    in train mode. Its tiny images are 64 x 64: at 32 x 32 its last stage is 1 x 1, each BatchNorm
    there normalizes two values per channel, and the accuracy rule cannot judge that (docs/PERF.md)."""
    import timm

    return timm.create_model("regnety_002", num_classes=CLASSES[size])


def _mamba(size: str) -> nn.Module:
    """Selective state spaces: a causal depthwise convolution, a parallel scan over the sequence
    (strided slices and their backward's scatters), softplus, SiLU gates, RMSNorm; no attention."""
    from transformers import MambaConfig, MambaForCausalLM

    dims = dict(hidden_size=32, state_size=8) if size == "tiny" else dict(hidden_size=1024, state_size=16)
    return MambaForCausalLM(MambaConfig(vocab_size=HELD_OUT_2["mamba"].vocab[size], num_hidden_layers=2, expand=2,
                                        conv_kernel=4, bos_token_id=0, eos_token_id=0, pad_token_id=0, **dims))


def _bart(size: str) -> nn.Module:
    """Encoder-decoder with learned positions (offset by 2), post-LayerNorm, GELU, dropout."""
    from transformers import BartConfig, BartForConditionalGeneration

    dims = dict(d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, encoder_attention_heads=4,
                decoder_attention_heads=4, max_position_embeddings=64) if size == "tiny" else \
        dict(d_model=768, encoder_ffn_dim=3072, decoder_ffn_dim=3072, encoder_attention_heads=12,
             decoder_attention_heads=12, max_position_embeddings=1024)
    return BartForConditionalGeneration(BartConfig(vocab_size=HELD_OUT_2["bart"].vocab[size], encoder_layers=1,
                                                   decoder_layers=1, dropout=0.1, pad_token_id=0, bos_token_id=0,
                                                   eos_token_id=0, decoder_start_token_id=0, **dims))


def _mpt(size: str) -> nn.Module:
    """ALiBi biases, LayerNorm without bias, no bias in any linear."""
    from transformers import MptConfig, MptForCausalLM

    dims = dict(d_model=32, n_heads=4, max_seq_len=64) if size == "tiny" else dict(d_model=1024, n_heads=16, max_seq_len=2048)
    return MptForCausalLM(MptConfig(vocab_size=HELD_OUT_2["mpt"].vocab[size], n_layers=2, **dims))


def _bigcode(size: str) -> nn.Module:
    """StarCoder-style GPT-BigCode: multi-query attention from one fused q/k/v projection."""
    from transformers import GPTBigCodeConfig, GPTBigCodeForCausalLM

    dims = dict(n_embd=32, n_head=4, n_positions=64) if size == "tiny" else dict(n_embd=1024, n_head=16, n_positions=2048)
    return GPTBigCodeForCausalLM(GPTBigCodeConfig(vocab_size=HELD_OUT_2["bigcode"].vocab[size], n_layer=2,
                                                  multi_query=True, bos_token_id=0, eos_token_id=0, **dims))


def _nf_resnet(size: str) -> nn.Module:
    """NF-ResNet-26 (no normalization layers: every convolution standardizes its weights, and each
    residual branch is scaled); its tiny size one block per stage, narrower."""
    import dataclasses

    import timm
    from timm.models.nfnet import NormFreeNet, model_cfgs

    if size == "bench":
        return timm.create_model("nf_resnet26", num_classes=CLASSES[size])
    tiny = dataclasses.replace(model_cfgs["nf_resnet26"], depths=(1, 1, 1, 1), channels=(32, 64, 96, 128))
    return NormFreeNet(tiny, num_classes=CLASSES[size])


def _gemma2(size: str) -> nn.Module:
    """Gemma-2: attention logits and final logits soft-capped by tanh, RMSNorm before and after each
    block, sliding-window attention in every other layer (eager attention: the capping needs it)."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    dims = _lm_dims(size, hidden_size=1024, intermediate_size=4096, num_attention_heads=8)
    dims["head_dim"] = 8 if size == "tiny" else 128
    return Gemma2ForCausalLM(Gemma2Config(vocab_size=HELD_OUT_4["gemma2"].vocab[size], num_hidden_layers=2,
                                          num_key_value_heads=2, sliding_window=4 if size == "tiny" else 512,
                                          attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                                          attn_implementation="eager", bos_token_id=0, eos_token_id=0,
                                          pad_token_id=0, **dims))


def _nemotron(size: str) -> nn.Module:
    """Nemotron: squared-ReLU MLP without a gate, LayerNorm scaled by 1 + weight, rotary on half of
    each head."""
    from transformers import NemotronConfig, NemotronForCausalLM

    dims = _lm_dims(size, hidden_size=1024, intermediate_size=4096, num_attention_heads=16)
    return NemotronForCausalLM(NemotronConfig(vocab_size=HELD_OUT_4["nemotron"].vocab[size], num_hidden_layers=2,
                                              num_key_value_heads=dims["num_attention_heads"] // 2,
                                              partial_rotary_factor=0.5, bos_token_id=0, eos_token_id=0,
                                              pad_token_id=0, **dims))


def _olmo(size: str) -> nn.Module:
    """OLMo: LayerNorm without weight or bias, q/k/v clipped to +-8, SiLU-gated MLP."""
    from transformers import OlmoConfig, OlmoForCausalLM

    dims = _lm_dims(size, hidden_size=1024, intermediate_size=2816, num_attention_heads=16)
    return OlmoForCausalLM(OlmoConfig(vocab_size=HELD_OUT_4["olmo"].vocab[size], num_hidden_layers=2, clip_qkv=8.0,
                                      bos_token_id=0, eos_token_id=0, pad_token_id=0, **dims))


def _volo(size: str) -> nn.Module:
    """VOLO-D1: outlook attention (unfold, a softmax over each 3 x 3 window, fold), then class
    attention; its tiny size one block per stage, narrower."""
    import timm
    from timm.models.volo import VOLO

    if size == "bench":
        return timm.create_model("volo_d1_224", num_classes=CLASSES[size])
    return VOLO(layers=(1, 1, 1, 1), img_size=64, embed_dims=(64, 128, 128, 128), num_heads=(2, 4, 4, 4),
                num_classes=CLASSES[size])


def _mixtral(size: str) -> nn.Module:
    """Mixtral: a sparse mixture of experts (a softmax router, the top 2 of 4 experts a token, the
    experts' outputs weighted and added back), grouped-query attention, RMSNorm."""
    from transformers import MixtralConfig, MixtralForCausalLM

    dims = _lm_dims(size, hidden_size=1024, intermediate_size=2048, num_attention_heads=16)
    return MixtralForCausalLM(MixtralConfig(vocab_size=HELD_OUT_5["mixtral"].vocab[size], num_hidden_layers=2,
                                            num_key_value_heads=dims["num_attention_heads"] // 4, num_local_experts=4,
                                            num_experts_per_tok=2, router_aux_loss_coef=0.01,
                                            output_router_logits=True, bos_token_id=0, eos_token_id=0,
                                            pad_token_id=0, **dims))


def _cohere(size: str) -> nn.Module:
    """Cohere (Command-R): LayerNorm without bias, attention and MLP in parallel off one norm,
    rotary on interleaved pairs, logits scaled by a constant, tied embeddings."""
    from transformers import CohereConfig, CohereForCausalLM

    dims = _lm_dims(size, hidden_size=1024, intermediate_size=2816, num_attention_heads=16)
    return CohereForCausalLM(CohereConfig(vocab_size=HELD_OUT_5["cohere"].vocab[size], num_hidden_layers=2,
                                          num_key_value_heads=dims["num_attention_heads"] // 2, logit_scale=0.0625,
                                          bos_token_id=0, eos_token_id=0, pad_token_id=0, **dims))


def _persimmon(size: str) -> nn.Module:
    """Persimmon: LayerNorms over each head's queries and keys, squared-ReLU MLP, rotary on half
    of each head, one fused q/k/v projection, dropout."""
    from transformers import PersimmonConfig, PersimmonForCausalLM

    dims = _lm_dims(size, hidden_size=1024, intermediate_size=4096, num_attention_heads=16)
    rope = {"rope_type": "default", "rope_theta": 25000.0, "partial_rotary_factor": 0.5}
    return PersimmonForCausalLM(PersimmonConfig(vocab_size=HELD_OUT_5["persimmon"].vocab[size], num_hidden_layers=2,
                                                qk_layernorm=True, hidden_dropout=0.1, attention_dropout=0.1,
                                                rope_parameters=rope, bos_token_id=0, eos_token_id=0,
                                                pad_token_id=0, **dims))


def _albert(size: str) -> nn.Module:
    """ALBERT: factorized embeddings (a narrow embedding projected up), one layer's weights shared by
    every layer (their gradients add), GELU-new, dropout."""
    from transformers import AlbertConfig, AlbertForMaskedLM

    dims = dict(embedding_size=16, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                max_position_embeddings=64) if size == "tiny" else \
        dict(embedding_size=128, hidden_size=768, num_attention_heads=12, intermediate_size=3072,
             max_position_embeddings=512)
    return AlbertForMaskedLM(AlbertConfig(vocab_size=HELD_OUT_5["albert"].vocab[size], num_hidden_layers=3,
                                          hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                                          pad_token_id=0, **dims))


def _cspdarknet(size: str) -> nn.Module:
    """CSPDarknet-53: cross-stage partial stages (each splits its channels, runs dark blocks on one
    half and concatenates), leaky ReLU, BatchNorm; its tiny size one block per stage."""
    import dataclasses

    import timm
    from timm.models.cspnet import CspNet, model_cfgs

    if size == "bench":
        return timm.create_model("cspdarknet53", num_classes=CLASSES[size])
    config = model_cfgs["cspdarknet53"]
    tiny = dataclasses.replace(config, stages=dataclasses.replace(config.stages, depth=(1, 1, 1, 1, 1)))
    return CspNet(tiny, num_classes=CLASSES[size])


def _focalnet(size: str) -> nn.Module:
    """FocalNet-T (SRF): focal modulation, gated depthwise contexts at two levels summed into a
    modulator, LayerNorm over channels-first images; its tiny size one block per stage, narrower."""
    import timm
    from timm.models.focalnet import FocalNet

    if size == "bench":
        return timm.create_model("focalnet_tiny_srf", num_classes=CLASSES[size])
    return FocalNet(depths=(1, 1, 1, 1), embed_dim=32, num_classes=CLASSES[size])


def _qwen3(size: str) -> nn.Module:
    """Qwen3: RMSNorms over each head's queries and keys before rotary, grouped-query attention,
    SiLU-gated MLP, a 151,936-token vocabulary."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    dims = _lm_dims(size, hidden_size=1024, intermediate_size=3072, num_attention_heads=16)
    dims["head_dim"] = 8 if size == "tiny" else 64
    return Qwen3ForCausalLM(Qwen3Config(vocab_size=HELD_OUT_6["qwen3"].vocab[size], num_hidden_layers=2,
                                        num_key_value_heads=dims["num_attention_heads"] // 2, bos_token_id=0,
                                        eos_token_id=0, pad_token_id=0, **dims))


def _diffllama(size: str) -> nn.Module:
    """DiffLlama: differential attention, two softmax maps subtracted with a learned weight (lambda
    from exponentials of dot products), each head's output RMS-normalized and scaled."""
    from transformers import DiffLlamaConfig, DiffLlamaForCausalLM

    dims = _lm_dims(size, hidden_size=1024, intermediate_size=2816, num_attention_heads=16)
    return DiffLlamaForCausalLM(DiffLlamaConfig(vocab_size=HELD_OUT_6["diffllama"].vocab[size], num_hidden_layers=2,
                                                num_key_value_heads=dims["num_attention_heads"] // 2,
                                                bos_token_id=0, eos_token_id=0,
                                                pad_token_id=0, **dims))


def _modernbert(size: str) -> nn.Module:
    """ModernBERT: GeGLU MLP, LayerNorms without bias, rotary, global attention in the first layer
    and sliding-window attention in the second, a prediction head with its own norm, dropout."""
    from transformers import ModernBertConfig, ModernBertForMaskedLM

    dims = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, local_attention=4,
                max_position_embeddings=64) if size == "tiny" else \
        dict(hidden_size=768, intermediate_size=1152, num_attention_heads=12, local_attention=128,
             max_position_embeddings=512)
    return ModernBertForMaskedLM(ModernBertConfig(vocab_size=HELD_OUT_6["modernbert"].vocab[size], num_hidden_layers=2,
                                                  global_attn_every_n_layers=2, embedding_dropout=0.1,
                                                  mlp_dropout=0.1, attention_dropout=0.1, pad_token_id=0,
                                                  bos_token_id=0, eos_token_id=0, cls_token_id=0, sep_token_id=0,
                                                  **dims))


def _fnet(size: str) -> nn.Module:
    """FNet: token mixing by a 2D Fourier transform (the real part of an FFT over the hidden and the
    sequence dims) instead of attention, GELU-new, dropout."""
    from transformers import FNetConfig, FNetForMaskedLM

    dims = dict(hidden_size=32, intermediate_size=64, max_position_embeddings=64) if size == "tiny" else \
        dict(hidden_size=768, intermediate_size=3072, max_position_embeddings=512)
    return FNetForMaskedLM(FNetConfig(vocab_size=HELD_OUT_6["fnet"].vocab[size], num_hidden_layers=2,
                                      hidden_dropout_prob=0.1, pad_token_id=0, **dims))


def _lfm2(size: str) -> nn.Module:
    """LFM2: a hybrid of gated short convolutions (a causal depthwise conv1d of 3 taps between two
    gates) and grouped-query attention with per-head q/k RMSNorm; one layer of each."""
    from transformers import Lfm2Config, Lfm2ForCausalLM

    dims = _lm_dims(size, hidden_size=1024, intermediate_size=4096, num_attention_heads=16)
    return Lfm2ForCausalLM(Lfm2Config(vocab_size=HELD_OUT_6["lfm2"].vocab[size], num_hidden_layers=2,
                                      layer_types=["conv", "full_attention"],
                                      num_key_value_heads=dims["num_attention_heads"] // 2, bos_token_id=0,
                                      eos_token_id=0, pad_token_id=0, **dims))


def _mvitv2(size: str) -> nn.Module:
    """MViT-v2-T: pooling attention (queries, keys and values pooled by strided depthwise
    convolutions, each with its LayerNorm), residual pooling, decomposed relative positions; its
    tiny size one block per stage, narrower."""
    import dataclasses

    import timm
    from timm.models.mvitv2 import MultiScaleVit, model_cfgs

    if size == "bench":
        return timm.create_model("mvitv2_tiny", num_classes=CLASSES[size])
    tiny = dataclasses.replace(model_cfgs["mvitv2_tiny"], depths=(1, 1, 1, 1), embed_dim=16)
    return MultiScaleVit(tiny, img_size=(64, 64), num_classes=CLASSES[size])


def _timm_model(variant: str, tiny: dict[str, Any], tiny_variant: str | None = None) -> Callable[[str], nn.Module]:
    """A builder of timm's `variant`, its tiny size changed by the keyword arguments `tiny` (or another
    variant of the same model, `tiny_variant`). Tiny sizes are narrower than the real models where the
    model allows it: CI runs them under Triton's interpreter, whose time grows with the elements."""
    def build(size: str) -> nn.Module:
        import timm

        if size == "tiny":
            return timm.create_model(tiny_variant or variant, num_classes=CLASSES[size], **tiny)
        return timm.create_model(variant, num_classes=CLASSES[size])
    return build


_TINY_VIT = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4)
CLASSES = {"tiny": 10, "bench": 1000}
ZOO: dict[str, Spec] = {  # bench vocabularies are the real models'
    "gpt2": Spec(_gpt2, "causal_lm", {"tiny": (2, 8), "bench": (8, 1024)}, {"tiny": 64, "bench": 50257}),
    "llama": Spec(_llama, "causal_lm", {"tiny": (2, 8), "bench": (4, 1024)}, {"tiny": 64, "bench": 32000}),
    "bert": Spec(_bert, "masked_lm", {"tiny": (2, 8), "bench": (8, 512)}, {"tiny": 64, "bench": 30522}),
    "t5": Spec(_t5, "seq2seq", {"tiny": (2, 8), "bench": (8, 512)}, {"tiny": 64, "bench": 32128}),
    "resnet": Spec(_resnet, "image", {"tiny": (2, 3, 16, 16), "bench": (32, 3, 224, 224)}, CLASSES),
    "vit": Spec(_vit, "image", {"tiny": (2, 3, 32, 32), "bench": (32, 3, 224, 224)}, CLASSES),
}


HELD_OUT: dict[str, Spec] = {  # not the zoo's: see the section above; real vocabularies at bench size
    "mistral": Spec(_mistral, "causal_lm", {"tiny": (2, 8), "bench": (4, 1024)}, {"tiny": 64, "bench": 32000}),
    "gpt_neox": Spec(_gpt_neox, "causal_lm", {"tiny": (2, 8), "bench": (4, 1024)}, {"tiny": 64, "bench": 50304}),
    "bloom": Spec(_bloom, "causal_lm", {"tiny": (2, 8), "bench": (2, 1024)}, {"tiny": 64, "bench": 250880}),
    "opt": Spec(_opt, "causal_lm", {"tiny": (2, 8), "bench": (4, 1024)}, {"tiny": 64, "bench": 50272}),
    "convnext": Spec(_convnext, "image", {"tiny": (2, 3, 32, 32), "bench": (32, 3, 224, 224)}, CLASSES),
    "efficientnet": Spec(_efficientnet, "image", {"tiny": (2, 3, 32, 32), "bench": (32, 3, 224, 224)}, CLASSES),
    "swin": Spec(_swin, "image", {"tiny": (2, 3, 32, 32), "bench": (32, 3, 224, 224)}, CLASSES),
}


# A second group of held-out models (2026-11-27), added after the first group's kernels had been
# worked on: new families, new ops (hard-swish, dense concatenation, scaled RMSNorm, partial and
# interleaved rotary, disentangled relative attention, pooling as a token mixer, token-mixing MLPs).
# Only the first four have benchmark cases (bench/held_out_2*); all of them train in CI.
IMAGE = {"tiny": (2, 3, 32, 32), "bench": (32, 3, 224, 224)}
HELD_OUT_2: dict[str, Spec] = {
    "gemma": Spec(_gemma, "causal_lm", {"tiny": (2, 8), "bench": (2, 1024)}, {"tiny": 64, "bench": 256000}),
    "phi": Spec(_phi, "causal_lm", {"tiny": (2, 8), "bench": (4, 1024)}, {"tiny": 64, "bench": 51200}),
    "mobilenetv3": Spec(_mobilenetv3, "image", {"tiny": (2, 3, 32, 32), "bench": (32, 3, 224, 224)}, CLASSES),
    "densenet": Spec(_densenet, "image", {"tiny": (2, 3, 32, 32), "bench": (32, 3, 224, 224)}, CLASSES),
    "qwen2": Spec(_qwen2, "causal_lm", {"tiny": (2, 8), "bench": (4, 1024)}, {"tiny": 64, "bench": 151936}),
    "gptj": Spec(_gptj, "causal_lm", {"tiny": (2, 8), "bench": (4, 1024)}, {"tiny": 64, "bench": 50400}),
    "falcon": Spec(_falcon, "causal_lm", {"tiny": (2, 8), "bench": (4, 1024)}, {"tiny": 64, "bench": 65024}),
    "deberta": Spec(_deberta, "masked_lm", {"tiny": (2, 8), "bench": (8, 512)}, {"tiny": 64, "bench": 128100}),
    "levit": Spec(_levit, "image", IMAGE, CLASSES),
    "convmixer": Spec(_convmixer, "image", IMAGE, CLASSES),
    "poolformer": Spec(_poolformer, "image", IMAGE, CLASSES),
    "mixer": Spec(_mixer, "image", IMAGE, CLASSES),
    "regnety": Spec(_regnety, "image", {"tiny": (2, 3, 64, 64), "bench": (32, 3, 224, 224)}, CLASSES),
    "mamba": Spec(_mamba, "causal_lm", {"tiny": (2, 8), "bench": (4, 1024)}, {"tiny": 64, "bench": 50280}),
    "bart": Spec(_bart, "seq2seq", {"tiny": (2, 8), "bench": (8, 512)}, {"tiny": 64, "bench": 50265}),
    "mpt": Spec(_mpt, "causal_lm", {"tiny": (2, 8), "bench": (4, 1024)}, {"tiny": 64, "bench": 50432}),
    "bigcode": Spec(_bigcode, "causal_lm", {"tiny": (2, 8), "bench": (4, 1024)}, {"tiny": 64, "bench": 49152}),
    # relative position biases per layer (BEiT), class attention (CaiT), cross-covariance attention
    # with L2-normalized tokens (XCiT), scaled cosine attention with log-spaced position MLPs (Swin-v2)
    "beit": Spec(_timm_model("beit_base_patch16_224", _TINY_VIT), "image", IMAGE, CLASSES),
    "cait": Spec(_timm_model("cait_xxs24_224", _TINY_VIT | {"depth_token_only": 1}), "image", IMAGE, CLASSES),
    "xcit": Spec(_timm_model("xcit_nano_12_p16_224", _TINY_VIT), "image", IMAGE, CLASSES),
    "swinv2": Spec(_timm_model("swinv2_cr_tiny_ns_224", dict(img_size=32, window_size=4, embed_dim=16, depths=(1, 1),
                                                            num_heads=(1, 2))), "image", IMAGE, CLASSES),
    # global response normalization (ConvNeXt-V2), unfolded patches through transformers (MobileViT)
    "convnextv2": Spec(_timm_model("convnextv2_atto", dict(drop_path_rate=0.1)), "image", IMAGE, CLASSES),
    "mobilevit": Spec(_timm_model("mobilevit_xxs", {}), "image", {"tiny": (2, 3, 64, 64), "bench": (32, 3, 256, 256)},
                      CLASSES),
}
HELD_OUT.update(HELD_OUT_2)

# A third group (2026-11-27), added before any of its kernels were timed: weight standardization
# inside every convolution (NF-ResNet), multi-resolution branches joined by nearest upsampling
# (HRNet), residuals added to a channel slice (ReXNet), channels-first LayerNorm, cross-covariance
# attention and Fourier position encodings (EdgeNeXt), attention over spatially reduced keys
# (PVT-v2), split attention over radix groups (ResNeSt). Tiny images are 64 x 64: at 32 x 32 the
# last stage of a stride-32 network holds one pixel per image.
IMAGE_64 = {"tiny": (2, 3, 64, 64), "bench": (32, 3, 224, 224)}
HELD_OUT_3: dict[str, Spec] = {
    "nfresnet": Spec(_nf_resnet, "image", IMAGE_64, CLASSES),
    "hrnet": Spec(_timm_model("hrnet_w18_small", {}), "image", IMAGE_64, CLASSES),
    "rexnet": Spec(_timm_model("rexnet_100", dict(width_mult=0.5)), "image", IMAGE_64, CLASSES),
    "edgenext": Spec(_timm_model("edgenext_xx_small", dict(depths=(1, 1, 1, 1))), "image", IMAGE_64, CLASSES),
    "pvt_v2": Spec(_timm_model("pvt_v2_b0", dict(depths=(1, 1, 1, 1))), "image", IMAGE_64, CLASSES),
    "resnest": Spec(_timm_model("resnest14d", dict(stem_width=16, channels=(32, 64, 128, 256))), "image", IMAGE_64,
                     CLASSES),
}
HELD_OUT.update(HELD_OUT_3)

# A fourth group (2026-11-27), added before any of its kernels were timed: soft-capped attention
# logits and sliding windows (Gemma-2), squared ReLU and 1 + weight LayerNorms (Nemotron), LayerNorm
# without parameters and clipped q/k/v (OLMo), outlook attention through unfold and fold (VOLO),
# ghost modules that concatenate and slice channels (GhostNet), space-to-depth stems and leaky ReLU
# (TResNet), block and grid attention over window partitions (MaxViT), many-branch concatenations
# (Inception-v3), convolutional relative position encodings (CoaT).
HELD_OUT_4: dict[str, Spec] = {
    "gemma2": Spec(_gemma2, "causal_lm", {"tiny": (2, 8), "bench": (2, 1024)}, {"tiny": 64, "bench": 256000}),
    "nemotron": Spec(_nemotron, "causal_lm", {"tiny": (2, 8), "bench": (4, 1024)}, {"tiny": 64, "bench": 32000}),
    "olmo": Spec(_olmo, "causal_lm", {"tiny": (2, 8), "bench": (4, 1024)}, {"tiny": 64, "bench": 50304}),
    "volo": Spec(_volo, "image", IMAGE_64, CLASSES),
    "ghostnet": Spec(_timm_model("ghostnet_100", {}, tiny_variant="ghostnet_050"), "image", IMAGE_64, CLASSES),
    "tresnet": Spec(_timm_model("tresnet_m", dict(width_factor=0.5)), "image", IMAGE_64, CLASSES),
    "maxvit": Spec(_timm_model("maxvit_nano_rw_256", dict(img_size=64, depths=(1, 1, 1, 1),
                                                         embed_dim=(32, 64, 128, 256))), "image",
                   {"tiny": (2, 3, 64, 64), "bench": (32, 3, 256, 256)}, CLASSES),
    "inception": Spec(_timm_model("inception_v3", {}), "image", {"tiny": (2, 3, 80, 80), "bench": (32, 3, 299, 299)},
                      CLASSES),
    "coat": Spec(_timm_model("coat_lite_tiny", dict(img_size=64, serial_depths=(1, 1, 1, 1),
                                                     embed_dims=(32, 64, 128, 160))), "image", IMAGE_64,
                 CLASSES),
}
HELD_OUT.update(HELD_OUT_4)

# A fifth group (2026-11-28), added before any of its kernels were timed: a sparse mixture of
# experts with a top-2 router (Mixtral), bias-free LayerNorm and scaled logits (Cohere), LayerNorms
# over each head's queries and keys (Persimmon), factorized embeddings and one layer's weights used
# by every layer (ALBERT), rotary positions in a vision transformer with a SwiGLU MLP (EVA-02),
# selective kernels: a softmax over two convolution branches (SK-ResNet), hierarchical channel
# splits (Res2Net), focal modulation: gated depthwise context (FocalNet), cross-stage partial
# concatenations with leaky ReLU (CSPDarknet).
HELD_OUT_5: dict[str, Spec] = {
    "mixtral": Spec(_mixtral, "causal_lm", {"tiny": (2, 8), "bench": (4, 1024)}, {"tiny": 64, "bench": 32000}),
    "cohere": Spec(_cohere, "causal_lm", {"tiny": (2, 8), "bench": (2, 1024)}, {"tiny": 64, "bench": 256000}),
    "persimmon": Spec(_persimmon, "causal_lm", {"tiny": (2, 8), "bench": (4, 1024)}, {"tiny": 64, "bench": 262144}),
    "albert": Spec(_albert, "masked_lm", {"tiny": (2, 8), "bench": (8, 512)}, {"tiny": 64, "bench": 30000}),
    "eva02": Spec(_timm_model("eva02_tiny_patch14_224", dict(img_size=56, depth=2)), "image",
                  IMAGE_64 | {"tiny": (2, 3, 56, 56)}, CLASSES),
    "skresnet": Spec(_timm_model("skresnet18", dict(channels=(32, 64, 128, 256))), "image", IMAGE_64, CLASSES),
    "res2net": Spec(_timm_model("res2net50_14w_8s", dict(layers=(1, 1, 1, 1))), "image", IMAGE_64, CLASSES),
    "focalnet": Spec(_focalnet, "image", IMAGE_64, CLASSES),
    "cspdarknet": Spec(_cspdarknet, "image", IMAGE_64, CLASSES),
}
HELD_OUT.update(HELD_OUT_5)


# A sixth group (2026-11-28), added before any of its kernels were timed: RMSNorm over each head's
# queries and keys (Qwen3), differential attention (DiffLlama), GeGLU and sliding-window layers
# (ModernBERT), token mixing by a Fourier transform, complex tensors (FNet), gated short
# convolutions in a hybrid (LFM2), pooling attention with residual pooling (MViT-v2), ReLU linear
# attention (EfficientViT), mask-unit attention over unrolled windows (Hiera), channel attention by
# a 1D convolution over pooled channels (ECA-ResNet).
HELD_OUT_6: dict[str, Spec] = {
    "qwen3": Spec(_qwen3, "causal_lm", {"tiny": (2, 8), "bench": (2, 1024)}, {"tiny": 64, "bench": 151936}),
    "diffllama": Spec(_diffllama, "causal_lm", {"tiny": (2, 8), "bench": (4, 1024)}, {"tiny": 64, "bench": 32000}),
    "modernbert": Spec(_modernbert, "masked_lm", {"tiny": (2, 8), "bench": (8, 512)}, {"tiny": 64, "bench": 50368}),
    "fnet": Spec(_fnet, "masked_lm", {"tiny": (2, 8), "bench": (8, 512)}, {"tiny": 64, "bench": 32000}),
    "lfm2": Spec(_lfm2, "causal_lm", {"tiny": (2, 8), "bench": (4, 1024)}, {"tiny": 64, "bench": 65536}),
    "mvitv2": Spec(_mvitv2, "image", IMAGE_64, CLASSES),
    "efficientvit": Spec(_timm_model("efficientvit_b0", {}), "image", IMAGE_64, CLASSES),
    # its default init zeroes the classifier, which would leave the trunk without gradients
    "hiera": Spec(_timm_model("hiera_tiny_224", dict(img_size=64, stages=(1, 1, 1, 1), embed_dim=16,
                                                     weight_init="skip")), "image", IMAGE_64, CLASSES),
    "eca_resnet": Spec(_timm_model("eca_resnet33ts", {}), "image", IMAGE_64, CLASSES),
}
HELD_OUT.update(HELD_OUT_6)

from zoo_held_out_7 import HELD_OUT_7  # noqa: E402  (a seventh group, in its own module; it uses the helpers above)

HELD_OUT.update(HELD_OUT_7)

from zoo_held_out_8 import HELD_OUT_8  # noqa: E402  (the eighth group, likewise)

HELD_OUT.update(HELD_OUT_8)

from zoo_held_out_9 import HELD_OUT_9  # noqa: E402  (the ninth group, likewise)

HELD_OUT.update(HELD_OUT_9)

from zoo_held_out_10 import HELD_OUT_10  # noqa: E402  (the tenth group, likewise)

HELD_OUT.update(HELD_OUT_10)

from zoo_held_out_11 import HELD_OUT_11  # noqa: E402  (the eleventh group, likewise)

HELD_OUT.update(HELD_OUT_11)


def spec(name: str) -> Spec:
    """A zoo or held-out model's entry; a clear KeyError for any other name."""
    if name in ZOO:
        return ZOO[name]
    if name in HELD_OUT:
        return HELD_OUT[name]
    raise KeyError(f"unknown model {name!r}; zoo: {', '.join(ZOO)}; held out: {', '.join(HELD_OUT)}")


def build(name: str, size: str = "tiny", seed: int = 0) -> nn.Module:
    """The model with seeded random weights, in train mode."""
    torch.manual_seed(seed)
    model = spec(name).build(size)
    return model.train()


def float64_reference(model: nn.Module) -> nn.Module:
    """A float64 copy of `model` for the accuracy rule's reference. Mixture-of-experts layers run
    their experts one by one there ("eager"): `torch._grouped_mm`, transformers' default, has no
    float64 kernel; both compute the same sums."""
    reference = copy.deepcopy(model).double()
    config = getattr(reference, "config", None)
    if getattr(config, "_experts_implementation", None) == "grouped_mm":
        config._experts_implementation = "eager"
    return reference


def with_checkpointing(model: nn.Module) -> nn.Module:
    """`model` with activation checkpointing on, switched the way its library offers it
    (transformers' gradient_checkpointing_enable, non-reentrant; timm's set_grad_checkpointing)."""
    if hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif hasattr(model, "set_grad_checkpointing"):
        model.set_grad_checkpointing(True)
    else:
        raise TypeError(f"{type(model).__name__} offers no activation checkpointing switch")
    return model


def make_batch(name: str, size: str = "tiny", seed: int = 0) -> dict[str, torch.Tensor]:
    """Random token ids and labels (language models) or images and classes, on CPU."""
    entry = spec(name)
    generator = torch.Generator().manual_seed(seed)
    shape = entry.batch[size]
    if entry.kind == "image":
        return {"images": torch.randn(*shape, generator=generator),
                "labels": torch.randint(0, entry.vocab[size], shape[:1], generator=generator)}
    ids = torch.randint(1, entry.vocab[size], shape, generator=generator)
    return {"ids": ids, "labels": torch.randint(1, entry.vocab[size], shape, generator=generator)}


def step_loss(model: nn.Module, name: str, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Forward and loss of one training step (the caller calls backward)."""
    if spec(name).kind == "image":
        images = batch["images"].to(next(model.parameters()).dtype)
        return F.cross_entropy(model(images), batch["labels"])
    return model(input_ids=batch["ids"], labels=batch["labels"]).loss  # the models shift causal labels
