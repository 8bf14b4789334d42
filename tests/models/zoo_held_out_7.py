"""The zoo's seventh held-out group (2026-11-28), added before any of its kernels were timed:
multi-head latent attention with a sigmoid-scored, group-limited mixture of experts (DeepSeek-V3),
chunked state-space duality scans (Mamba-2), interleaved partial rotary and sandwich norms (GLM-4),
span-based dynamic convolutions beside attention (ConvBERT), bottlenecks with NoNorm (MobileBERT), a
top-1 routed mixture of experts in an encoder-decoder (Switch Transformers), bidirectional LSTMs over
an image's rows and columns (Sequencer2D), train-time overparameterized convolutions (FastViT), global
context attention (GC ViT), dual-path blocks that add one part of their channels and concatenate the
rest (DPN).

Its own module so that tests/models/zoo.py stays readable; zoo.py adds it to HELD_OUT. The builders
use zoo's helpers, looked up when a model is built."""

from __future__ import annotations

from torch import nn

import zoo


def _deepseek_v3(size: str) -> nn.Module:
    """DeepSeek-V3: queries and keys/values through low-rank latents with their RMSNorms, rotary on
    a part of each head, the first layer dense and the second a mixture of 4 routed experts (sigmoid
    scores, each token's top 2 taken from the better of 2 groups of experts) beside a shared one."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    dims = zoo._lm_dims(size, hidden_size=1024, intermediate_size=2048, num_attention_heads=16)
    head = dict(q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8,
                moe_intermediate_size=32) if size == "tiny" else \
        dict(q_lora_rank=384, kv_lora_rank=256, qk_rope_head_dim=32, qk_nope_head_dim=64, v_head_dim=64,
             moe_intermediate_size=512)
    return DeepseekV3ForCausalLM(DeepseekV3Config(
        vocab_size=HELD_OUT_7["deepseek_v3"].vocab[size], num_hidden_layers=2, first_k_dense_replace=1,
        n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=1,
        num_key_value_heads=dims["num_attention_heads"], bos_token_id=0, eos_token_id=0, pad_token_id=0,
        **head, **dims))


def _mamba2(size: str) -> nn.Module:
    """Mamba-2: the state-space duality scan in chunks (cumulative sums, segment sums under a
    triangular mask, exponentials), grouped heads, a gated RMSNorm; no attention."""
    from transformers import Mamba2Config, Mamba2ForCausalLM

    dims = dict(hidden_size=32, state_size=8, num_heads=4, head_dim=16, n_groups=1, chunk_size=4) if size == "tiny" \
        else dict(hidden_size=1024, state_size=64, num_heads=32, head_dim=64, n_groups=1, chunk_size=256)
    return Mamba2ForCausalLM(Mamba2Config(vocab_size=HELD_OUT_7["mamba2"].vocab[size], num_hidden_layers=2,
                                          expand=2, conv_kernel=4, bos_token_id=0, eos_token_id=0,
                                          pad_token_id=0, **dims))


def _glm4(size: str) -> nn.Module:
    """GLM-4: rotary on half of each head with interleaved pairs, RMSNorms after attention and
    after the MLP as well as before (sandwich norms), a fused gate/up projection split in two."""
    from transformers import Glm4Config, Glm4ForCausalLM

    dims = zoo._lm_dims(size, hidden_size=1024, intermediate_size=3072, num_attention_heads=16)
    return Glm4ForCausalLM(Glm4Config(vocab_size=HELD_OUT_7["glm4"].vocab[size], num_hidden_layers=2,
                                      num_key_value_heads=dims["num_attention_heads"] // 4,
                                      head_dim=dims["hidden_size"] // dims["num_attention_heads"],
                                      bos_token_id=0, eos_token_id=0, pad_token_id=0, **dims))


def _convbert(size: str) -> nn.Module:
    """ConvBERT: half the heads are span-based dynamic convolutions (a depthwise-separable conv1d
    predicts per-position kernels, applied to unfolded windows), grouped linear feed-forwards."""
    from transformers import ConvBertConfig, ConvBertForMaskedLM

    dims = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, embedding_size=32,
                max_position_embeddings=64) if size == "tiny" else \
        dict(hidden_size=768, intermediate_size=3072, num_attention_heads=12, embedding_size=768,
             max_position_embeddings=512)
    return ConvBertForMaskedLM(ConvBertConfig(vocab_size=HELD_OUT_7["convbert"].vocab[size], num_hidden_layers=2,
                                              head_ratio=2, conv_kernel_size=9, num_groups=2, pad_token_id=0,
                                              **dims))


def _mobilebert(size: str) -> nn.Module:
    """MobileBERT: bottleneck blocks (a narrow attention inside a wide residual), stacked
    feed-forwards, NoNorm (an elementwise scale and shift instead of LayerNorm), embeddings built
    from a token's neighbours concatenated (trigram input)."""
    from transformers import MobileBertConfig, MobileBertForMaskedLM

    dims = dict(hidden_size=64, intermediate_size=32, num_attention_heads=4, embedding_size=16,
                intra_bottleneck_size=32, true_hidden_size=32, num_feedforward_networks=2,
                max_position_embeddings=64) if size == "tiny" else \
        dict(hidden_size=512, intermediate_size=512, num_attention_heads=4, embedding_size=128,
             intra_bottleneck_size=128, true_hidden_size=128, num_feedforward_networks=4,
             max_position_embeddings=512)
    return MobileBertForMaskedLM(MobileBertConfig(vocab_size=HELD_OUT_7["mobilebert"].vocab[size],
                                                  num_hidden_layers=2, pad_token_id=0, **dims))


def _switch(size: str) -> nn.Module:
    """Switch Transformers: T5 with every other feed-forward a mixture of 4 experts, each token
    routed to its top-1 expert (a softmax router, a capacity limit, a router z-loss)."""
    from transformers import SwitchTransformersConfig, SwitchTransformersForConditionalGeneration

    dims = dict(d_model=32, d_ff=64, num_heads=2, d_kv=16) if size == "tiny" else \
        dict(d_model=768, d_ff=2048, num_heads=12, d_kv=64)
    return SwitchTransformersForConditionalGeneration(SwitchTransformersConfig(
        vocab_size=HELD_OUT_7["switch"].vocab[size], num_layers=2, num_decoder_layers=2, num_sparse_encoder_layers=2,
        num_sparse_decoder_layers=2, num_experts=4, expert_capacity=64 if size == "tiny" else 1024,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, **dims))


def _sequencer(size: str) -> nn.Module:
    """Sequencer2D: bidirectional LSTMs along an image's rows and along its columns, their outputs
    concatenated and fused by a linear, instead of attention. timm zeroes its classifier, which would
    leave the trunk without gradients: it is drawn at random here."""
    tiny = dict(layers=(1, 1, 1, 1), embed_dims=(16, 32, 32, 32), hidden_sizes=(8, 16, 16, 16))
    model = zoo._timm_model("sequencer2d_s", tiny)(size)
    nn.init.normal_(model.head.fc.weight, std=0.02)
    return model


def _gcvit(size: str) -> nn.Module:
    """GC ViT: window attention alternating with global context attention (queries made once per
    image by fused inverted-residual downsampling, shared by every window)."""
    if size == "tiny":
        from timm.models.gcvit import GlobalContextVit

        return GlobalContextVit(num_classes=zoo.CLASSES[size], img_size=64, depths=(1, 1, 1, 1), embed_dim=16,
                                num_heads=(1, 2, 2, 4))
    return zoo._timm_model("gcvit_xxtiny", {})(size)


HELD_OUT_7: dict[str, zoo.Spec] = {
    "deepseek_v3": zoo.Spec(_deepseek_v3, "causal_lm", {"tiny": (2, 8), "bench": (4, 1024)},
                            {"tiny": 64, "bench": 32000}),
    "mamba2": zoo.Spec(_mamba2, "causal_lm", {"tiny": (2, 8), "bench": (4, 1024)}, {"tiny": 64, "bench": 50288}),
    "glm4": zoo.Spec(_glm4, "causal_lm", {"tiny": (2, 8), "bench": (2, 1024)}, {"tiny": 64, "bench": 151552}),
    "convbert": zoo.Spec(_convbert, "masked_lm", {"tiny": (2, 8), "bench": (8, 512)}, {"tiny": 64, "bench": 30522}),
    "mobilebert": zoo.Spec(_mobilebert, "masked_lm", {"tiny": (2, 8), "bench": (8, 512)},
                           {"tiny": 64, "bench": 30522}),
    "switch": zoo.Spec(_switch, "seq2seq", {"tiny": (2, 8), "bench": (8, 512)}, {"tiny": 64, "bench": 32128}),
    "sequencer": zoo.Spec(_sequencer, "image", zoo.IMAGE_64, zoo.CLASSES),
    "fastvit": zoo.Spec(zoo._timm_model("fastvit_t8", dict(layers=(1, 1, 1, 1), embed_dims=(16, 32, 64, 128))),
                        "image", zoo.IMAGE_64, zoo.CLASSES),
    "gcvit": zoo.Spec(_gcvit, "image", zoo.IMAGE_64, zoo.CLASSES),
    "dpn": zoo.Spec(zoo._timm_model("dpn68", dict(k_sec=(1, 1, 1, 1), inc_sec=(4, 8, 8, 16), num_init_features=8,
                                        k_r=16, groups=4)), "image", zoo.IMAGE_64, zoo.CLASSES),
}
