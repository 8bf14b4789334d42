"""The zoo's eleventh held-out group (2026-11-29), added before any of its kernels were timed:
gated DeltaNet linear attention beside gated softmax attention and a mixture of experts (Qwen3-Next),
a real-gated linear recurrence with a short convolution beside local attention (RecurrentGemma),
a matrix memory with exponential gates run chunk by chunk (xLSTM), a learned
piecewise activation (xIELU) with query and key norms (Apertus), a mixture of experts with clipped
q/k/v (DBRX); attention gated between content and learned positions (ConViT), transformers over
nested blocks joined by convolution and pooling (NesT), lambda layers: attention through a summary of
the keys and a relative-position convolution (LambdaResNet), attention from decoupled fully-connected
pooled features multiplied into ghost modules (GhostNetV2), and trees of aggregation nodes (DLA).

Its own module so that tests/models/zoo.py stays readable; zoo.py adds it to HELD_OUT. The builders
use zoo's helpers, looked up when a model is built."""

from __future__ import annotations

from torch import nn

import zoo


def _qwen3_next(size: str) -> nn.Module:
    """Qwen3-Next: layers of gated DeltaNet (a causal short convolution, L2-normed queries and keys, the
    delta rule run chunk by chunk in PyTorch) alternating with gated full attention; a mixture of
    experts with a shared expert; zero-centred RMSNorms."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    dims = zoo._lm_dims(size, hidden_size=2048, intermediate_size=5120, num_attention_heads=16)
    heads = dims["num_attention_heads"]
    linear = dict(linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
                  moe_intermediate_size=16, shared_expert_intermediate_size=16, num_experts=4,
                  num_experts_per_tok=2) if size == "tiny" else \
        dict(linear_num_value_heads=32, linear_num_key_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
             moe_intermediate_size=512, shared_expert_intermediate_size=512, num_experts=16, num_experts_per_tok=4)
    return Qwen3NextForCausalLM(Qwen3NextConfig(
        vocab_size=HELD_OUT_11["qwen3_next"].vocab[size], num_hidden_layers=2, num_key_value_heads=heads // 4,
        head_dim=dims["hidden_size"] // heads, layer_types=["linear_attention", "full_attention"],
        decoder_sparse_step=1, bos_token_id=0, eos_token_id=0, pad_token_id=0, **linear, **dims))


def _recurrent_gemma(size: str) -> nn.Module:
    """RecurrentGemma (Griffin): residual blocks of a real-gated linear recurrent unit after a causal
    short convolution, and of local multi-query attention; tanh soft-capped logits."""
    from transformers import RecurrentGemmaConfig, RecurrentGemmaForCausalLM

    dims = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, lru_width=32, attention_window_size=4) \
        if size == "tiny" else dict(hidden_size=2560, intermediate_size=15360, num_attention_heads=10,
                                    lru_width=2560, attention_window_size=512)
    return RecurrentGemmaForCausalLM(RecurrentGemmaConfig(
        vocab_size=HELD_OUT_11["recurrent_gemma"].vocab[size], num_hidden_layers=2,
        block_types=["recurrent", "attention"], num_key_value_heads=1, bos_token_id=0, eos_token_id=0,
        pad_token_id=0, **dims))


def _xlstm(size: str) -> nn.Module:
    """xLSTM: mLSTM blocks (a matrix memory with exponential input and sigmoid forget gates in log
    space, run chunk by chunk in PyTorch), soft-capped gates and logits, float32 norms, a gated MLP."""
    from transformers import xLSTMConfig, xLSTMForCausalLM

    dims = dict(hidden_size=32, embedding_dim=32, num_heads=4, chunk_size=4) if size == "tiny" else \
        dict(hidden_size=2048, embedding_dim=2048, num_heads=4, chunk_size=64)
    return xLSTMForCausalLM(xLSTMConfig(vocab_size=HELD_OUT_11["xlstm"].vocab[size], num_blocks=2, mode="train",
                                        chunkwise_kernel="chunkwise--native_autograd", use_cache=False,
                                        bos_token_id=0, eos_token_id=0, pad_token_id=0,
                                        **dims))


def _apertus(size: str) -> nn.Module:
    """Apertus: an ungated MLP with xIELU (a learned piecewise activation: quadratic above zero,
    expm1 below), RMSNorms on queries and keys, grouped-query attention with rotary positions."""
    from transformers import ApertusConfig, ApertusForCausalLM

    dims = zoo._lm_dims(size, hidden_size=4096, intermediate_size=16384, num_attention_heads=32)
    return ApertusForCausalLM(ApertusConfig(vocab_size=HELD_OUT_11["apertus"].vocab[size], num_hidden_layers=2,
                                            num_key_value_heads=dims["num_attention_heads"] // 4,
                                            bos_token_id=0, eos_token_id=0, pad_token_id=0, **dims))


def _dbrx(size: str) -> nn.Module:
    """DBRX: a fine-grained mixture of experts (top-k of 16, GLU experts), q/k/v from one projection
    clipped to a bound, LayerNorms without bias."""
    from transformers import DbrxConfig, DbrxForCausalLM

    if size == "tiny":
        dims = dict(d_model=32, n_heads=4, max_seq_len=64,
                    attn_config=dict(kv_n_heads=2, clip_qkv=8.0, rope_theta=10000.0),
                    ffn_config=dict(ffn_hidden_size=16, moe_num_experts=4, moe_top_k=2))
    else:
        dims = dict(d_model=2048, n_heads=16, max_seq_len=2048,
                    attn_config=dict(kv_n_heads=4, clip_qkv=8.0, rope_theta=500000.0),
                    ffn_config=dict(ffn_hidden_size=1408, moe_num_experts=16, moe_top_k=4))
    return DbrxForCausalLM(DbrxConfig(vocab_size=HELD_OUT_11["dbrx"].vocab[size], n_layers=2, emb_pdrop=0.1,
                                      resid_pdrop=0.1, bos_token_id=0, eos_token_id=0, pad_token_id=0, **dims))


def _nest(size: str) -> nn.Module:
    """NesT: transformer blocks inside non-overlapping blocks of the image, neighbouring blocks joined
    between levels by a convolution, a LayerNorm and a 3x3 max pool."""
    import timm

    if size == "tiny":
        from timm.models.nest import Nest

        return Nest(img_size=32, patch_size=4, num_levels=3, embed_dims=(16, 32, 64), num_heads=(1, 2, 4),
                    depths=(1, 1, 1), num_classes=zoo.CLASSES[size])
    return timm.create_model("nest_tiny", num_classes=zoo.CLASSES[size])


def _causal_lm(build, bench_batch: int, bench_vocab: int) -> zoo.Spec:
    """A causal language model's entry: batches of 8 tokens (tiny) or 1024 (bench), the real vocabulary."""
    return zoo.Spec(build, "causal_lm", {"tiny": (2, 8), "bench": (bench_batch, 1024)}, {"tiny": 64, "bench": bench_vocab})


HELD_OUT_11: dict[str, zoo.Spec] = {
    "qwen3_next": _causal_lm(_qwen3_next, 4, 151936),
    "recurrent_gemma": _causal_lm(_recurrent_gemma, 2, 256000),
    "xlstm": _causal_lm(_xlstm, 4, 50304),
    "apertus": _causal_lm(_apertus, 2, 131072),
    "dbrx": _causal_lm(_dbrx, 4, 100352),
    "convit": zoo.Spec(zoo._timm_model("convit_tiny", dict(img_size=32, patch_size=8, embed_dim=32, depth=2,
                                                          num_heads=4, local_up_to_layer=1)),
                       "image", zoo.IMAGE, zoo.CLASSES),
    "nest": zoo.Spec(_nest, "image", zoo.IMAGE, zoo.CLASSES),
    "lambda_resnet": zoo.Spec(zoo._timm_model("lambda_resnet26t", {}), "image", zoo.IMAGE_64, zoo.CLASSES),
    "ghostnetv2": zoo.Spec(zoo._timm_model("ghostnetv2_100", {}), "image", zoo.IMAGE_64, zoo.CLASSES),
    "dla": zoo.Spec(zoo._timm_model("dla34", {}, tiny_variant="dla46_c"), "image", zoo.IMAGE_64, zoo.CLASSES),
}
