"""The zoo's eighth held-out group (2026-11-29), added before any of its kernels were timed:
relative attention over a shifted score matrix (XLNet), a sequence pooled between blocks and
upsampled back (Funnel Transformer), per-head LayerNorms over queries and keys (StableLM), a
mixture of experts beside a sigmoid-gated shared expert (Qwen2-MoE), block-local attention staggered
every other layer beside global tokens (PEGASUS-X); self-attention over a whole feature map
with relative position logits (BoTNet), depthwise convolutions of several kernel sizes over channel
splits (MixNet), locally-grouped and global sub-sampled attention (Twins-SVT), weight-standardized
convolutions with GroupNorm (BiT ResNet-v2), windowed attention with decomposed relative positions
over padded windows (SAM's ViT), gated convolutions over part of the channels (MambaOut).

Its own module so that tests/models/zoo.py stays readable; zoo.py adds it to HELD_OUT. The builders
use zoo's helpers, looked up when a model is built."""

from __future__ import annotations

from torch import nn

import zoo


def _xlnet(size: str) -> nn.Module:
    """XLNet: relative positional attention (content and position scores; the position scores
    shifted by one row per query through a reshape), segment biases, GELU, dropout."""
    from transformers import XLNetConfig, XLNetLMHeadModel

    dims = dict(d_model=32, n_head=4, d_inner=64) if size == "tiny" else dict(d_model=768, n_head=12, d_inner=3072)
    return XLNetLMHeadModel(XLNetConfig(vocab_size=HELD_OUT_8["xlnet"].vocab[size], n_layer=2, dropout=0.1,
                                        pad_token_id=0, bos_token_id=0, eos_token_id=0, **dims))


def _funnel(size: str) -> nn.Module:
    """Funnel Transformer: the sequence mean-pooled by 2 between blocks (queries pooled, keys and
    values not), relative position scores gathered by shifts, the pooled sequence repeated back
    to full length for the decoder's layers."""
    from transformers import FunnelConfig, FunnelForMaskedLM

    dims = dict(d_model=32, n_head=4, d_head=8, d_inner=64) if size == "tiny" else \
        dict(d_model=768, n_head=12, d_head=64, d_inner=3072)
    return FunnelForMaskedLM(FunnelConfig(vocab_size=HELD_OUT_8["funnel"].vocab[size], block_sizes=[1, 1, 1],
                                          num_decoder_layers=1, pad_token_id=0, **dims))


def _stablelm(size: str) -> nn.Module:
    """StableLM-2: a LayerNorm over each head's queries and keys (one LayerNorm per head), rotary on
    a quarter of each head, attention and MLP in parallel off one LayerNorm."""
    from transformers import StableLmConfig, StableLmForCausalLM

    dims = zoo._lm_dims(size, hidden_size=1024, intermediate_size=2816, num_attention_heads=16)
    return StableLmForCausalLM(StableLmConfig(vocab_size=HELD_OUT_8["stablelm"].vocab[size], num_hidden_layers=2,
                                              qk_layernorm=True, use_parallel_residual=True,
                                              partial_rotary_factor=0.25, bos_token_id=0,
                                              num_key_value_heads=dims["num_attention_heads"], eos_token_id=0,
                                              pad_token_id=0, **dims))


def _qwen2_moe(size: str) -> nn.Module:
    """Qwen2-MoE: a softmax router over 4 experts (each token's top 2, not renormalized) beside a
    shared expert scaled by its own sigmoid gate."""
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    dims = zoo._lm_dims(size, hidden_size=1024, intermediate_size=2816, num_attention_heads=16)
    expert = 32 if size == "tiny" else 704
    return Qwen2MoeForCausalLM(Qwen2MoeConfig(vocab_size=HELD_OUT_8["qwen2_moe"].vocab[size], num_hidden_layers=2,
                                              num_experts=4, num_experts_per_tok=2, moe_intermediate_size=expert,
                                              shared_expert_intermediate_size=2 * expert, bos_token_id=0,
                                              num_key_value_heads=dims["num_attention_heads"],
                                              eos_token_id=0, pad_token_id=0, **dims))


def _pegasus_x(size: str) -> nn.Module:
    """PEGASUS-X: an encoder of block-local attention, every other layer's blocks staggered by half a
    block (the sequence padded and shifted), beside global tokens that attend to everything; sinusoidal
    positions; a full-attention decoder. No dropout: the last encoder layer's global-token branch is
    dead code, which torch.compile removes with its dropout draws (aot_eager does too), so no compiled
    run can draw eager's masks after it and the accuracy rule could not compare the two."""
    from transformers import PegasusXConfig, PegasusXForConditionalGeneration

    dims = dict(d_model=32, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                decoder_ffn_dim=64, block_size=4, num_global_tokens=4, max_position_embeddings=64) \
        if size == "tiny" else \
        dict(d_model=768, encoder_attention_heads=12, decoder_attention_heads=12, encoder_ffn_dim=3072,
             decoder_ffn_dim=3072, block_size=512, num_global_tokens=128, max_position_embeddings=2048)
    return PegasusXForConditionalGeneration(PegasusXConfig(
        vocab_size=HELD_OUT_8["pegasus_x"].vocab[size], encoder_layers=2, decoder_layers=1, dropout=0.0,
        stagger_local_blocks=True, pad_token_id=0, decoder_start_token_id=0, eos_token_id=1, **dims))


def _botnet(size: str) -> nn.Module:
    """BoTNet-26t: a ResNet whose last stages replace their 3 x 3 convolutions by multi-head
    self-attention over the whole feature map, with relative position logits (each axis's logits
    made by padding and reshaping a [.., W, 2W-1] matrix into absolute positions)."""
    import timm

    return timm.create_model("botnet26t_256", num_classes=zoo.CLASSES[size],
                             img_size=HELD_OUT_8["botnet"].batch[size][-1])


def _bit(size: str) -> nn.Module:
    """BiT (ResNet-v2): pre-activation bottlenecks, every convolution standardizing its weights
    (StdConv2d, each filter's mean and variance taken in the forward), GroupNorm instead of BatchNorm."""
    import timm

    if size == "bench":
        return timm.create_model("resnetv2_50x1_bit", num_classes=zoo.CLASSES[size])
    from functools import partial

    from timm.layers import GroupNormAct, StdConv2d
    from timm.models.resnetv2 import ResNetV2

    return ResNetV2(layers=(1, 1, 1, 1), channels=(64, 128, 256, 512), stem_chs=16, stem_type="fixed",
                    num_classes=zoo.CLASSES[size], conv_layer=partial(StdConv2d, eps=1e-8),
                    norm_layer=partial(GroupNormAct, num_groups=8))


HELD_OUT_8: dict[str, zoo.Spec] = {
    "xlnet": zoo.Spec(_xlnet, "causal_lm", {"tiny": (2, 8), "bench": (8, 512)}, {"tiny": 64, "bench": 32000}),
    "funnel": zoo.Spec(_funnel, "masked_lm", {"tiny": (2, 8), "bench": (8, 512)}, {"tiny": 64, "bench": 30522}),
    "stablelm": zoo.Spec(_stablelm, "causal_lm", {"tiny": (2, 8), "bench": (4, 1024)}, {"tiny": 64, "bench": 100352}),
    "qwen2_moe": zoo.Spec(_qwen2_moe, "causal_lm", {"tiny": (2, 8), "bench": (4, 1024)},
                          {"tiny": 64, "bench": 151936}),
    "pegasus_x": zoo.Spec(_pegasus_x, "seq2seq", {"tiny": (2, 8), "bench": (4, 2048)}, {"tiny": 64, "bench": 96103}),
    "botnet": zoo.Spec(_botnet, "image", zoo.IMAGE_64, zoo.CLASSES),
    "mixnet": zoo.Spec(zoo._timm_model("mixnet_s", {}), "image", zoo.IMAGE_64, zoo.CLASSES),
    # 32 x 32 images in CI: its windows of 7 pad every stage, and the interpreter's time grows with them
    "twins": zoo.Spec(zoo._timm_model("twins_svt_small", dict(depths=(1, 1, 1, 1), embed_dims=(16, 32, 64, 128),
                                                              num_heads=(1, 2, 4, 8))), "image", zoo.IMAGE,
                      zoo.CLASSES),
    "bit": zoo.Spec(_bit, "image", zoo.IMAGE_64, zoo.CLASSES),
    "samvit": zoo.Spec(zoo._timm_model("samvit_base_patch16", dict(img_size=64, depth=2, embed_dim=32, num_heads=2,
                                                                   window_size=3, global_attn_indexes=(1,),
                                                                   neck_chans=16)), "image", zoo.IMAGE_64,
                       zoo.CLASSES),
    "mambaout": zoo.Spec(zoo._timm_model("mambaout_femto", dict(depths=(1, 1, 1, 1))), "image", zoo.IMAGE_64,
                         zoo.CLASSES),
}
