"""The zoo's ninth held-out group (2026-11-29), added before any of its kernels were timed:
fused q/k/v and gate/up projections split by slices (Phi-3), RMSNorms over the whole query and key
projections and after each sublayer (OLMo-2), a protein language model with rotary and token dropout
rescaled by each sequence's mask ratio (ESM-2), a mixture of experts with attention sinks, clamped
SwiGLU and alternating sliding windows (gpt-oss), sliding-window attention over overlapping
chunks (Longformer); attention over blocks with halos (HaloNet), channel attention beside
window attention (DaViT), a distilled hybrid of MBConv and window attention with attention biases
(TinyViT), re-parameterizable mobile blocks with BatchNorm in train mode (RepViT), depthwise
convolutions split into square and band kernels (InceptionNeXt), and two branches of different patch
sizes joined by cross-attention on their class tokens, one of them resized bicubically (CrossViT).

Its own module so that tests/models/zoo.py stays readable; zoo.py adds it to HELD_OUT. The builders
use zoo's helpers, looked up when a model is built."""

from __future__ import annotations

from torch import nn

import zoo


def _phi3(size: str) -> nn.Module:
    """Phi-3: one projection for q, k and v and one for gate and up, each split by slices; rotary on
    every head; RMSNorm; dropout on the residual branches."""
    from transformers import Phi3Config, Phi3ForCausalLM

    dims = zoo._lm_dims(size, hidden_size=3072, intermediate_size=8192, num_attention_heads=32)
    return Phi3ForCausalLM(Phi3Config(vocab_size=HELD_OUT_9["phi3"].vocab[size], num_hidden_layers=2,
                                      num_key_value_heads=dims["num_attention_heads"], resid_pdrop=0.1,
                                      bos_token_id=0, eos_token_id=0, pad_token_id=0, **dims))


def _olmo2(size: str) -> nn.Module:
    """OLMo-2: an RMSNorm over the whole query projection and another over the keys (not per head),
    RMSNorms after attention and after the MLP instead of before them."""
    from transformers import Olmo2Config, Olmo2ForCausalLM

    dims = zoo._lm_dims(size, hidden_size=2048, intermediate_size=8192, num_attention_heads=16)
    return Olmo2ForCausalLM(Olmo2Config(vocab_size=HELD_OUT_9["olmo2"].vocab[size], num_hidden_layers=2,
                                        num_key_value_heads=dims["num_attention_heads"], bos_token_id=0,
                                        eos_token_id=0, pad_token_id=0, **dims))


def _esm(size: str) -> nn.Module:
    """ESM-2: a protein masked language model; rotary attention, pre-LayerNorm blocks, token dropout
    (mask tokens' embeddings zeroed, the rest rescaled by each sequence's observed mask ratio)."""
    from transformers import EsmConfig, EsmForMaskedLM

    dims = dict(hidden_size=32, num_attention_heads=4, intermediate_size=64) if size == "tiny" else \
        dict(hidden_size=640, num_attention_heads=20, intermediate_size=2560)
    return EsmForMaskedLM(EsmConfig(vocab_size=HELD_OUT_9["esm"].vocab[size], num_hidden_layers=2,
                                    position_embedding_type="rotary", token_dropout=True, mask_token_id=3,
                                    pad_token_id=0, max_position_embeddings=1026, hidden_dropout_prob=0.1,
                                    attention_probs_dropout_prob=0.1, **dims))


def _gpt_oss(size: str) -> nn.Module:
    """gpt-oss: top-2 of 4 experts (the softmax taken over the chosen two), SwiGLU clamped and scaled,
    attention with a learned sink logit per head, sliding-window and full layers alternating, YaRN
    rotary."""
    from transformers import GptOssConfig, GptOssForCausalLM

    dims = dict(hidden_size=32, intermediate_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                sliding_window=4) if size == "tiny" else \
        dict(hidden_size=1024, intermediate_size=1024, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
             sliding_window=128)
    return GptOssForCausalLM(GptOssConfig(vocab_size=HELD_OUT_9["gpt_oss"].vocab[size], num_hidden_layers=2,
                                          num_local_experts=4, num_experts_per_tok=2,
                                          layer_types=["sliding_attention", "full_attention"],
                                          bos_token_id=0, eos_token_id=0, pad_token_id=0, **dims))


def _longformer(size: str) -> nn.Module:
    """Longformer: sliding-window attention computed over overlapping chunks (the scores' diagonals
    moved into place by pads and strided views, the window's two edges masked), plus a global-attention
    path taken only when some token is global (none here, so its test is a graph break)."""
    from transformers import LongformerConfig, LongformerForMaskedLM

    dims = dict(hidden_size=32, num_attention_heads=4, intermediate_size=64, attention_window=4) if size == "tiny" \
        else dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072, attention_window=512)
    tokens = HELD_OUT_9["longformer"].batch[size][1]
    return LongformerForMaskedLM(LongformerConfig(
        vocab_size=HELD_OUT_9["longformer"].vocab[size], num_hidden_layers=2, max_position_embeddings=tokens + 2,
        hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, pad_token_id=0, **dims))


def _halonet(size: str) -> nn.Module:
    """HaloNet-26t: a ResNet whose later stages attend within blocks of the feature map, each block's
    keys and values taken from the block widened by a halo (unfolded windows). Its blocks of 8 need
    256 x 256 images; the tiny size attends over blocks of 2 with a halo of 1 at 64 x 64."""
    import timm

    if size == "bench":
        return timm.create_model("halonet26t", num_classes=zoo.CLASSES[size])
    from dataclasses import replace

    from timm.models.byoanet import model_cfgs
    from timm.models.byobnet import ByobNet, ByoBlockCfg, interleave_blocks

    blocks = (ByoBlockCfg(type="bottle", d=1, c=32, s=1, gs=0, br=0.25),
              ByoBlockCfg(type="bottle", d=1, c=64, s=2, gs=0, br=0.25),
              interleave_blocks(types=("bottle", "self_attn"), d=2, c=128, s=2, gs=0, br=0.25),
              ByoBlockCfg(type="self_attn", d=1, c=256, s=2, gs=0, br=0.25))
    cfg = replace(model_cfgs["halonet26t"], blocks=blocks, stem_chs=16,
                  self_attn_kwargs=dict(block_size=2, halo_size=1))
    return ByobNet(cfg, num_classes=zoo.CLASSES[size])


HELD_OUT_9: dict[str, zoo.Spec] = {
    "phi3": zoo.Spec(_phi3, "causal_lm", {"tiny": (2, 8), "bench": (2, 1024)}, {"tiny": 64, "bench": 32064}),
    "olmo2": zoo.Spec(_olmo2, "causal_lm", {"tiny": (2, 8), "bench": (4, 1024)}, {"tiny": 64, "bench": 100352}),
    "esm": zoo.Spec(_esm, "masked_lm", {"tiny": (2, 8), "bench": (8, 1024)}, {"tiny": 33, "bench": 33}),
    "gpt_oss": zoo.Spec(_gpt_oss, "causal_lm", {"tiny": (2, 8), "bench": (4, 1024)}, {"tiny": 64, "bench": 201088}),
    "longformer": zoo.Spec(_longformer, "masked_lm", {"tiny": (2, 8), "bench": (2, 4096)},
                           {"tiny": 64, "bench": 50265}),
    "halonet": zoo.Spec(_halonet, "image",
                        {"tiny": (2, 3, 64, 64), "bench": (32, 3, 256, 256)}, zoo.CLASSES),
    "davit": zoo.Spec(zoo._timm_model("davit_tiny", dict(depths=(1, 1, 1, 1), embed_dims=(16, 32, 64, 128),
                                                         num_heads=(1, 2, 4, 8))), "image", zoo.IMAGE_64,
                      zoo.CLASSES),
    "tiny_vit": zoo.Spec(zoo._timm_model("tiny_vit_5m_224", dict(depths=(1, 1, 1, 1))), "image",
                         zoo.IMAGE_64, zoo.CLASSES),
    # a batch of 4 in CI: over a batch of 2 its classifier's BatchNorm1d normalizes pairs x0 = -x1 (the
    # BatchNorms before it leave them so), where the result moves with x0 - x1's rounding alone and
    # Inductor misses the accuracy rule too (3x eager's error on 124 gradients)
    "repvit": zoo.Spec(zoo._timm_model("repvit_m0_9", {}), "image", {"tiny": (4, 3, 32, 32), "bench": (32, 3, 224, 224)},
                       zoo.CLASSES),
    "inception_next": zoo.Spec(zoo._timm_model("inception_next_atto", {}), "image", zoo.IMAGE_64, zoo.CLASSES),
    "crossvit": zoo.Spec(zoo._timm_model("crossvit_9_240", dict(img_size=120, depth=([1, 1, 0],), embed_dim=[16, 32],
                                                                num_heads=[2, 2], patch_size=[12, 16])), "image",
                         {"tiny": (2, 3, 120, 120), "bench": (32, 3, 240, 240)}, zoo.CLASSES),
}
