"""GLM-5.3-Flash replicas (`synth --family glm5-next`, `glm5-next-vl`): the hybrid text model's non-expert tensors
and its config.json, at shrunk sizes; the routed experts are written by synth/experts.py like every family's.

Facts and their public sources (the engines' own model code; no GLM-5.3-Flash file list was available):
- Layer schedule: `layer_types` "linear_attention" (KDA) or "indexed_attention" (MLA with the sparse indexer),
  `mlp_layer_types` "dense" or "sparse"; the releases put KDA on layers i % 4 != 3 and three dense layers first
  (transformers 5 configuration_glm5_next.py Glm5NextTextConfig.__post_init__). The replica alternates KDA and
  MLA (one of each in two layers) and keeps one dense layer, so its two layers hold every kind of module.
- KDA (`self_attn.` of a linear layer): `q_proj`, `k_proj`, `v_proj` [heads x head_dim, H], `b_proj` [heads, H],
  `f_a_proj` / `g_a_proj` [head_dim, H], `f_b_proj` / `g_b_proj` [heads x head_dim, head_dim], separate short
  convolutions `q_conv1d` / `k_conv1d` / `v_conv1d` [heads x head_dim, 1, kernel], `dt_bias` [heads x head_dim]
  F32, `A_log` [heads] F32 (1-D), `o_norm` [head_dim], `o_proj` [H, heads x head_dim] (vLLM 0.34
  models/glm5next/common/model.py Glm5NextModel.load_weights stacked_params_mapping `in_proj_qkvbfg_a` <- q, k, v,
  b, f_a, g_a and `conv1d` <- q/k/v_conv1d, common/kda.py Glm5NextLinearAttention ("Checkpoints store A_log as
  1-D"); SGLang 0.5.23 glm5_next.py Glm5NextLinearAttention, load_weights; transformers conversion_mapping.py
  "glm5_next" renames `self_attn.f_a_proj` ... `self_attn.A_log`). Kept BF16: vLLM builds KDA with no quantisation
  ("KDA projections remain BF16 because fp8 checkpoints omit their scales").
- MLA (`self_attn.` of an indexed layer): DeepSeek-V3's projections (synth/mla.py) with NoPE (`qk_rope_head_dim` 0,
  `mla_use_nope`: "GLM-5.3-Flash NoPE checkpoints omit the RoPE rows from kv_a_proj_with_mqa"), head sizes
  kv_lora_rank 512, qk_nope_head_dim 256, v_head_dim 256 (transformers 5 Glm5NextTextConfig defaults), and the
  kpool indexer: V3.2's `indexer.{wq_b, wk, k_norm, weights_proj}` plus `index_kpool_compress_ape` [kpool,
  index_head_dim] F32 and `index_kpool_compress_gate` [index_head_dim, H] BF16 (vLLM 0.34 common/attention.py
  Indexer; SGLang 0.5.23 layers/attention/dsa/dsa_indexer_kpool.py IndexerKPool), index_head_dim 128, index_n_heads
  32, index_kpool 16. BF16: vLLM builds the MLA projections with no quantisation ("MLA projections are BF16 in
  checkpoint"). `index_topk_pattern` names every indexed layer "F" (its own indexer; both engines then build one).
- mHC per decoder layer: `hc_attn_{fn [(2 + hc_mult) x hc_mult, hc_mult x H], base, scale [3]}` and `hc_ffn_*`, F32
  (vLLM 0.34 Glm5NextDecoderLayer, SGLang 0.5.23 "Keep mHC params directly on the decoder layer so their names
  match the checkpoint verbatim"), hc_mult 4. No `hc_head` tensors: SGLang skips them but vLLM 0.34 has no
  parameter for them (its load_weights would fail on one), so a release both engines load has none.
- MoE: DeepSeek-V3's block (`mlp.gate` with `e_score_correction_bias`, one `mlp.shared_experts`, HF expert names);
  the dense MLPs, shared and routed experts run a SwiGLU clamped at `swiglu_limit` (10.0: transformers 5 default;
  vLLM 0.34 Glm5NextMoE passes it to FusedMoEFactory, SGLang 0.5.23 Glm5NextMLP(swiglu_limit=...)).
- MTP: one layer `<layers>.<num_hidden_layers>` (an MLA layer with the kpool indexer and MoE, no mHC: vLLM 0.34
  common/mtp.py Glm5NextMTP "build an MLA (DSA) layer rather than KDA for the MTP path", SGLang 0.5.23
  glm5_next_nextn.py), BF16 and excluded as GLM-5.x's (synth/mtp.py; the NVFP4 releases' precision split is this
  generator's assumption, as for GLM-5.x), without `shared_head.head`: vLLM 0.34 builds the MTP's SharedHead with
  `defer_lm_head=True` (the target's lm_head; a `shared_head.head` tensor has no parameter there) and SGLang 0.5.23
  skips the name.
- Text releases (Glm5NextForCausalLM, vLLM 0.34 only): a flat config.json, model_type `glm5_next` ("Flat
  (text-only) GLM-5.3-Flash checkpoints store the text fields at the top level": transformers 5
  Glm5NextConfig.__post_init__), names `model.layers.*`. Multimodal (Glm5NextForConditionalGeneration): the text
  config under `text_config` (model_type `glm5_next_text`) beside a `vision_config`, names
  `model.language_model.*` and `lm_head` (vLLM's mapper `model.language_model.` -> `language_model.model.`, SGLang's
  `model.language_model.` -> `model.`); the replica holds no vision tensors (served text-only).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .layouts import Dims
from .mla import mla_tensors, ones_weight
from .seeded import dense

__all__ = ["GLM5_NEXT", "glm5next_text_config", "glm5next_layer", "glm5next_vision_config", "is_kda_layer"]

# GLM-5.3-Flash's head sizes and indexer (transformers 5 Glm5NextTextConfig defaults), kept at full size: the
# indexer kernels take index_head_dim 128 only (vLLM 0.34 common/attention.py Indexer.forward asserts it)
GLM5_NEXT = {"kv_lora_rank": 512, "qk_nope_head_dim": 256, "qk_rope_head_dim": 0, "v_head_dim": 256,
             "index_n_heads": 32, "index_head_dim": 128, "index_topk": 2048, "index_kpool": 16}
HC_MULT = 4
SWIGLU_LIMIT = 10.0
Linear = Callable[..., None]  # family_layers._linear(out, seed, name, n, k, kind, dtype)


def is_kda_layer(layer: int, d: Dims) -> bool:
    """The replica's schedule: KDA on even layers, MLA with the indexer on odd ones (the MTP layer is MLA)."""
    return layer < d.layers and layer % 2 == 0


def glm5next_text_config(d: Dims, dense_layers: int) -> dict:
    """The text fields of a GLM-5.3-Flash config.json (flat for Glm5NextForCausalLM, `text_config` for the VL)."""
    kinds = ["linear_attention" if is_kda_layer(i, d) else "indexed_attention" for i in range(d.layers)]
    return {
        "hidden_size": d.hidden, "num_hidden_layers": d.layers, "num_attention_heads": d.heads,
        "num_key_value_heads": d.heads, "intermediate_size": 2 * d.intermediate,
        "moe_intermediate_size": d.intermediate, "vocab_size": d.vocab, "n_routed_experts": d.experts,
        "num_experts_per_tok": d.top_k, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
        "routed_scaling_factor": 2.5, "norm_topk_prob": True, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
        "hidden_act": "silu", "first_k_dense_replace": dense_layers, "moe_layer_freq": 1,
        "mlp_layer_types": ["dense"] * dense_layers + ["sparse"] * (d.layers - dense_layers),
        "layer_types": kinds, "q_lora_rank": d.q_lora_rank, **GLM5_NEXT, "mla_use_nope": True,
        "index_kpool_always_select_tail": True, "index_kpool_compress": True, "indexer_rope_interleave": True,
        "index_topk_pattern": "".join("F" for _ in range(d.layers)),
        "linear_head_dim": d.head_dim, "linear_num_heads": d.heads, "linear_conv_kernel_dim": 4,
        "linear_lower_bound": -5.0, "swiglu_limit": SWIGLU_LIMIT, "mhc": True, "hc_mult": HC_MULT,
        "hc_eps": 1e-6, "hc_sinkhorn_iters": 20, "num_nextn_predict_layers": 1, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 8192, "rope_parameters": {"rope_type": "default", "rope_theta": 800000.0},
        "pad_token_id": d.vocab - 1, "tie_word_embeddings": False, "attention_bias": False,
        "torch_dtype": "bfloat16",
    }


def glm5next_vision_config(d: Dims) -> dict:
    """A tiny vision tower's config (no tensors: the replica is served text-only) with the fields both engines'
    config classes read (transformers 5 Glm5NextVisionConfig; SGLang 0.5.23 configs/glm5_next.py
    Glm5NextVisionConfig(GlmOcrVisionConfig), which requires swiglu_limit)."""
    return {"model_type": "glm5_next_vision", "depth": 1, "hidden_size": 64, "num_heads": 2, "intermediate_size": 128,
            "out_hidden_size": d.hidden, "projection_intermediate_size": 128, "patch_size": 14,
            "spatial_merge_size": 2, "temporal_patch_size": 2, "in_channels": 3, "image_size": 56,
            "rms_norm_eps": 1e-5, "hidden_act": "silu", "attention_bias": True, "swiglu_limit": SWIGLU_LIMIT}


def _kda(out: dict, seed: int, a: str, d: Dims, dtype: torch.dtype) -> None:
    """`a` (`model.layers.0.self_attn`): one KDA layer's tensors, BF16 (F32 gate parameters)."""
    h, nh, hd = d.hidden, d.heads, d.head_dim
    p = nh * hd
    shapes = {"q_proj": (p, h), "k_proj": (p, h), "v_proj": (p, h), "b_proj": (nh, h), "f_a_proj": (hd, h),
              "g_a_proj": (hd, h), "f_b_proj": (p, hd), "g_b_proj": (p, hd), "o_proj": (h, p)}
    for proj, shape in shapes.items():
        out[f"{a}.{proj}.weight"] = dense(seed, f"{a}.{proj}", shape, dtype=dtype)
    for conv in ("q_conv1d", "k_conv1d", "v_conv1d"):
        out[f"{a}.{conv}.weight"] = dense(seed, f"{a}.{conv}", (p, 1, 4), dtype=dtype)
    out[f"{a}.dt_bias"] = dense(seed, f"{a}.dt_bias", (p,), dtype=torch.float32)
    out[f"{a}.A_log"] = dense(seed, f"{a}.A_log", (nh,), dtype=torch.float32)
    ones_weight(out, f"{a}.o_norm.weight", hd, dtype)


def kpool_indexer(out: dict, seed: int, a: str, hidden: int, dtype: torch.dtype) -> None:
    """The kpool indexer's own tensors beside V3.2's (synth/mla.py writes those)."""
    i, d = f"{a}.indexer", GLM5_NEXT["index_head_dim"]
    out[f"{i}.index_kpool_compress_ape"] = dense(seed, f"{i}.ape", (GLM5_NEXT["index_kpool"], d), dtype=torch.float32)
    out[f"{i}.index_kpool_compress_gate"] = dense(seed, f"{i}.gate", (d, hidden), dtype=dtype)


def _hyper_connections(out: dict, seed: int, p: str, h: int) -> None:
    mix = (2 + HC_MULT) * HC_MULT
    for part in ("attn", "ffn"):
        for suffix, shape in (("fn", (mix, HC_MULT * h)), ("base", (mix,)), ("scale", (3,))):
            name = f"{p}.hc_{part}_{suffix}"
            out[name] = dense(seed, name, shape, dtype=torch.float32)


def glm5next_layer(out: dict, seed: int, p: str, layer: int, d: Dims, dtype: torch.dtype) -> None:
    """Decoder layer `p`'s attention (KDA or MLA + kpool indexer) and its mHC parameters (not in the MTP layer);
    the caller writes the norms and the MLP / MoE."""
    if is_kda_layer(layer, d):
        _kda(out, seed, f"{p}.self_attn", d, dtype)
    else:
        mla_tensors(out, seed, p, d.hidden, d.heads, d.q_lora_rank, dtype, indexer=True, dims=GLM5_NEXT)
        kpool_indexer(out, seed, f"{p}.self_attn", d.hidden, dtype)
    if layer < d.layers:
        _hyper_connections(out, seed, p, d.hidden)
