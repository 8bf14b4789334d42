"""The zoo's tenth held-out group (2026-11-29), added before any of its kernels were timed:
multipliers on the embeddings, the residual branches, the attention scores and the logits (Granite),
LayerNorms with biases and a tanh-GELU MLP with biases beside sliding-window attention (StarCoder2),
ternary weights and 8-bit activations quantized on the fly with straight-through gradients (BitNet),
rotary positions in a BERT-style encoder (RoFormer), an encoder-decoder with sinusoidal positions
made from the token ids and pre-LayerNorm blocks (M2M100); a transformer of pixel-level transformers
inside each patch (TNT), the "star" operation: two branches multiplied elementwise (StarNet),
one-shot aggregation: each block's layers concatenated once, with an effective squeeze-and-excitation
(VoVNet), attention with talking heads and a strided attention downsampling (EfficientFormerV2),
learnable affine scales after activations and a stem of pads and pools (HGNetV2), and universal
inverted bottlenecks beside mobile multi-query attention (MobileNetV4).

Its own module so that tests/models/zoo.py stays readable; zoo.py adds it to HELD_OUT. The builders
use zoo's helpers, looked up when a model is built."""

from __future__ import annotations

from torch import nn

import zoo


def _granite(size: str) -> nn.Module:
    """Granite: the embeddings scaled up, each residual branch scaled down, the attention scores by a
    set multiplier instead of 1/sqrt(d), the logits divided by a constant."""
    from transformers import GraniteConfig, GraniteForCausalLM

    dims = zoo._lm_dims(size, hidden_size=2048, intermediate_size=8192, num_attention_heads=32)
    return GraniteForCausalLM(GraniteConfig(vocab_size=HELD_OUT_10["granite"].vocab[size], num_hidden_layers=2,
                                            num_key_value_heads=dims["num_attention_heads"] // 4,
                                            embedding_multiplier=12.0, residual_multiplier=0.22,
                                            attention_multiplier=0.0078125, logits_scaling=8.0,
                                            attention_dropout=0.1, bos_token_id=0, eos_token_id=0, pad_token_id=0,
                                            **dims))


def _starcoder2(size: str) -> nn.Module:
    """StarCoder2: LayerNorms and linears with biases, a tanh-approximated GELU MLP, grouped-query
    attention over a sliding window, dropout on the residual branches."""
    from transformers import Starcoder2Config, Starcoder2ForCausalLM

    dims = zoo._lm_dims(size, hidden_size=3072, intermediate_size=12288, num_attention_heads=24)
    window = 4 if size == "tiny" else 512
    return Starcoder2ForCausalLM(Starcoder2Config(vocab_size=HELD_OUT_10["starcoder2"].vocab[size], num_hidden_layers=2,
                                                  num_key_value_heads=dims["num_attention_heads"] // 4,
                                                  sliding_window=window, residual_dropout=0.1, embedding_dropout=0.1,
                                                  bos_token_id=0, eos_token_id=0, **dims))


def _bitnet(size: str) -> nn.Module:
    """BitNet b1.58: every linear's weight quantized to -1, 0, 1 times its mean magnitude and its input
    to 8 bits per token, both with straight-through gradients (round, clamp, detach); squared-ReLU
    gated MLP and RMSNorms before the projections."""
    from transformers import BitNetConfig, BitNetForCausalLM

    dims = zoo._lm_dims(size, hidden_size=2560, intermediate_size=6912, num_attention_heads=20)
    return BitNetForCausalLM(BitNetConfig(vocab_size=HELD_OUT_10["bitnet"].vocab[size], num_hidden_layers=2,
                                          num_key_value_heads=dims["num_attention_heads"] // 4,
                                          bos_token_id=0, eos_token_id=0, pad_token_id=0, **dims))


def _roformer(size: str) -> nn.Module:
    """RoFormer: a BERT-style masked language model whose self-attention rotates queries and keys
    by position (sinusoids built in the graph) instead of adding position embeddings."""
    from transformers import RoFormerConfig, RoFormerForMaskedLM

    dims = dict(hidden_size=32, num_attention_heads=4, intermediate_size=64, embedding_size=32) if size == "tiny" \
        else dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072, embedding_size=768)
    return RoFormerForMaskedLM(RoFormerConfig(vocab_size=HELD_OUT_10["roformer"].vocab[size], num_hidden_layers=2,
                                              max_position_embeddings=1536, hidden_dropout_prob=0.1,
                                              attention_probs_dropout_prob=0.1, pad_token_id=0, **dims))


def _m2m100(size: str) -> nn.Module:
    """M2M100: a translation encoder-decoder, pre-LayerNorm blocks, sinusoidal positions gathered by
    position ids made from the token ids (padding skipped by a cumulative sum), scaled embeddings,
    dropout and layer drop off."""
    from transformers import M2M100Config, M2M100ForConditionalGeneration

    dims = dict(d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, encoder_attention_heads=4,
                decoder_attention_heads=4) if size == "tiny" else \
        dict(d_model=1024, encoder_ffn_dim=4096, decoder_ffn_dim=4096, encoder_attention_heads=16,
             decoder_attention_heads=16)
    return M2M100ForConditionalGeneration(M2M100Config(
        vocab_size=HELD_OUT_10["m2m100"].vocab[size], encoder_layers=1, decoder_layers=1, dropout=0.1,
        attention_dropout=0.1, encoder_layerdrop=0.0, decoder_layerdrop=0.0, scale_embedding=True,
        pad_token_id=0, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, max_position_embeddings=1024,
        **dims))


HELD_OUT_10: dict[str, zoo.Spec] = {
    "granite": zoo.Spec(_granite, "causal_lm", {"tiny": (2, 8), "bench": (4, 1024)}, {"tiny": 64, "bench": 49155}),
    "starcoder2": zoo.Spec(_starcoder2, "causal_lm", {"tiny": (2, 8), "bench": (2, 1024)},
                           {"tiny": 64, "bench": 49152}),
    "bitnet": zoo.Spec(_bitnet, "causal_lm", {"tiny": (2, 8), "bench": (4, 1024)}, {"tiny": 64, "bench": 128256}),
    "roformer": zoo.Spec(_roformer, "masked_lm", {"tiny": (2, 8), "bench": (8, 512)}, {"tiny": 64, "bench": 50000}),
    "m2m100": zoo.Spec(_m2m100, "seq2seq", {"tiny": (2, 8), "bench": (8, 512)}, {"tiny": 64, "bench": 128112}),
    "tnt": zoo.Spec(zoo._timm_model("tnt_s_patch16_224", dict(img_size=64, depth=2, embed_dim=48, inner_dim=12,
                                                               num_heads_outer=2, num_heads_inner=2)),
                    "image", zoo.IMAGE_64, zoo.CLASSES),
    "starnet": zoo.Spec(zoo._timm_model("starnet_s050", {}), "image", zoo.IMAGE_64, zoo.CLASSES),
    "vovnet": zoo.Spec(zoo._timm_model("ese_vovnet19b_dw", {}), "image", zoo.IMAGE_64, zoo.CLASSES),
    "efficientformerv2": zoo.Spec(zoo._timm_model("efficientformerv2_s0", dict(img_size=64)), "image",
                                  zoo.IMAGE_64, zoo.CLASSES),
    "hgnetv2": zoo.Spec(zoo._timm_model("hgnetv2_b0", {}), "image", zoo.IMAGE_64, zoo.CLASSES),
    "mobilenetv4": zoo.Spec(zoo._timm_model("mobilenetv4_hybrid_medium", {}), "image", zoo.IMAGE_64, zoo.CLASSES),
}
