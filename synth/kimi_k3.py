"""The Kimi-K3 replica (`synth --family kimi-k3`): KimiK3ForConditionalGeneration, a Kimi-Linear text model (KDA linear
attention and NoPE MLA layers, latent MoE with SiTU experts) under `language_model.*` beside a Kimi-K2.5-style vision
tower, its routed experts compressed-tensors MXFP4 or NVFP4.

Facts and sources (vLLM 0.34.0 `vllm/models/kimi_k3/nvidia/model.py`, `transformers_utils/configs/kimi_k3.py` and
`kimi_linear.py`, `model_executor/layers/mamba/gdn/kimi_gdn_linear_attn.py`; SGLang 0.5.23 `srt/models/kimi_k3.py`,
`srt/configs/kimi_k3.py`, `kimi_linear.py`):
- config.json: `architectures [KimiK3ForConditionalGeneration]`, model_type `kimi_k3`, `text_config` of model_type
  `kimi_linear` (KimiLinearConfig), `vision_config` of model_type `kimi_k3_vision` (KimiK3VisionConfig: the vt_*
  fields); the quantisation block sits in config.json (KimiK3Config lifts a text_config one to the top).
- Layer kinds: layer i is KDA when i + 1 is in `linear_attn_config.kda_layers`, else MLA (KimiLinearConfig
  is_kda_layer). K3's KDA has the full-rank gate (`use_full_rank_gate`: vLLM "Only Kimi-K3's full-rank gate uses the
  private KDA path"; SGLang "Fused layout (K3): [q, k, v, g]"): `self_attn.{q,k,v,g}_proj` [heads*head_dim, H],
  `f_a_proj` [head_dim, H], `b_proj` [heads, H], `f_b_proj` [heads*head_dim, head_dim], `{q,k,v}_conv1d` [heads*head_dim,
  1, short_conv_kernel_size], `A_log` [heads] and `dt_bias` [heads*head_dim] fp32, `o_norm` [head_dim], `o_proj`
  [H, heads*head_dim] (vLLM KimiGDN in_proj_qkvgfab / conv1d / A_log loaders; SGLang's fused_qkvg_proj mapping). MLA is
  NoPE-only (vLLM: "Kimi-K3 MLA (MultiHeadLatentAttention) is NoPE-only", `mla_use_nope`, qk_rope_head_dim 0) with
  DeepSeek's projection names (synth/mla.py).
- MoE layers (layer >= first_k_dense_replace): `block_sparse_moe.gate.weight` [E, H] and `gate.e_score_correction_bias`
  fp32 (sigmoid router, grouped top-k), one shared expert `block_sparse_moe.shared_experts.{gate,up,down}_proj` of
  moe_intermediate_size at hidden_size, and the latent MoE: `routed_expert_down_proj` [latent, H], `routed_expert_norm`
  [latent] (`latent_moe_use_norm`), `routed_expert_up_proj` [H, latent], the routed experts
  `block_sparse_moe.experts.E.w{1,3,2}` at the latent width `routed_expert_hidden_size` (vLLM KimiMoE: FusedMoE
  hidden_size = routed_expert_hidden_size; checkpoint w1 / w3 / w2). Dense layers: `mlp.{gate,up,down}_proj`.
- Activation SiTU with `activation_situ_beta` 4.0 and `activation_situ_linear_beta` 25.0 (SGLang kimi_k3.py MegaMoE:
  "MegaMoE SiTU kernel bakes beta=4.0/linear_beta=25.0"); hidden 7168 and latent 3584 in the release (SGLang
  k3_ar_fusion NORM_DIM 3584, "latent == NORM_DIM and shared == 2*NORM_DIM (3584 / 7168)"), 896 experts, top-16 (vLLM
  specialized_decode/cutedsl/moe/ep/comm.py `LATENT, TOPK, EXPERTS = 3584, 16, 896`); the replica's latent is H / 2.
- Names: the text layers `language_model.layers.L.*` (the issue's and vLLM's hf_to_vllm_mapper `language_model.layers.`
  -> `language_model.model.layers.`), the embedding, final norm and head `language_model.model.embed_tokens`,
  `language_model.model.norm`, `language_model.lm_head` (the names both loaders reach without a mapping).
- Quantisation: compressed-tensors on the routed experts only; every other Linear is BF16 (vLLM 0.34 models/config.py
  KimiK3ForConditionalGenerationConfig rewrites an `mxfp4-pack-quantized` block to `mxfp4`, whose config keeps every
  linear unquantised, so the release's non-expert layers must be BF16).
Not modelled (assumptions): the vision tower's tensors (the replica is served text-only), attention residuals
(`attn_res_block_size`), the MLA output gate, K3.1's DSA indexer, the MTP draft layers; the layer pattern (KDA but
the last layer) and which layers are dense are this generator's choice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from ..core.sources.families import family_named
from .experts import Tweaks, encode_layer_experts
from .layouts import Dims
from .mla import mla_tensors, ones_weight
from .seeded import dense

__all__ = ["PREFIX", "kimi_k3_config", "kimi_k3_ignore", "kimi_k3_tensors", "latent_width"]

PREFIX = "language_model.layers"
ROOT = "language_model.model"
SITU = {"hidden_act": "situ", "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0}
_CONV = 4  # short_conv_kernel_size
_DENSE = 1  # first_k_dense_replace
_MLA = {"kv_lora_rank": 64, "qk_nope_head_dim": 64, "qk_rope_head_dim": 0, "v_head_dim": 64}
Linear = Callable[..., None]  # family_layers._linear(out, seed, name, n, k, kind, dtype)


def latent_width(d: Dims) -> int:
    return d.hidden // 2


def _kda_layers(d: Dims) -> list[int]:
    """1-based KDA layer numbers: every layer but the last, which is MLA."""
    return [i + 1 for i in range(d.layers - 1)]


def kimi_k3_config(d: Dims) -> dict:
    text = {
        "model_type": "kimi_linear", "architectures": ["KimiLinearForCausalLM"], "hidden_size": d.hidden,
        "num_hidden_layers": d.layers, "num_attention_heads": d.heads, "num_key_value_heads": d.heads,
        "head_dim": d.head_dim, "intermediate_size": 2 * d.intermediate, "vocab_size": d.vocab, **SITU,
        "moe_intermediate_size": d.intermediate, "num_experts": d.experts, "num_experts_per_token": d.top_k,
        "num_shared_experts": 1, "first_k_dense_replace": _DENSE, "moe_layer_freq": 1, "use_grouped_topk": True,
        "num_expert_group": 1, "topk_group": 1, "moe_router_activation_func": "sigmoid", "moe_renormalize": True,
        "routed_scaling_factor": 2.5, "routed_expert_hidden_size": latent_width(d), "latent_moe_use_norm": True,
        "q_lora_rank": d.q_lora_rank, **_MLA, "mla_use_nope": True, "rms_norm_eps": 1e-5,
        "linear_attn_config": {"kda_layers": _kda_layers(d),
                               "full_attn_layers": [i + 1 for i in range(d.layers) if i + 1 not in _kda_layers(d)],
                               "num_heads": d.heads, "head_dim": d.head_dim, "short_conv_kernel_size": _CONV,
                               "use_full_rank_gate": True},
        "max_position_embeddings": 4096, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }
    vision = {"model_type": "kimi_k3_vision", "patch_size": 14, "vt_hidden_size": 64, "vt_num_attention_heads": 2,
              "vt_num_hidden_layers": 1, "vt_intermediate_size": 128, "qkv_hidden_size": 64,
              "text_hidden_size": d.hidden}
    return {"architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3", "torch_dtype": "bfloat16",
            "text_config": text, "vision_config": vision, "tie_word_embeddings": False}


def kimi_k3_ignore() -> list[str]:
    """compressed-tensors' ignore list: every Linear but the routed experts (the module docstring says why). The dense
    layers' MLP by layer number: SGLang names the MoE block `mlp` too (its hf_to_sglang_mapper `block_sparse_moe` ->
    `mlp`), so an `.mlp.` pattern would exclude the routed experts there."""
    return ["re:.*lm_head", "re:.*self_attn.*", *(f"re:.*layers\\.{i}\\.mlp\\..*" for i in range(_DENSE)),
            "re:.*shared_experts.*",
            "re:.*block_sparse_moe\\.gate$", "re:.*routed_expert_(down|up)_proj", "re:.*vision_tower.*",
            "re:.*mm_projector.*"]


def _kda(out: dict, seed: int, p: str, d: Dims, dtype: torch.dtype) -> None:
    a, h, hd, nh = f"{p}.self_attn", d.hidden, d.head_dim, d.heads
    proj = nh * hd
    shapes = {"q_proj": (proj, h), "k_proj": (proj, h), "v_proj": (proj, h), "g_proj": (proj, h),
              "f_a_proj": (hd, h), "b_proj": (nh, h), "f_b_proj": (proj, hd), "o_proj": (h, proj)}
    for name, shape in shapes.items():
        out[f"{a}.{name}.weight"] = dense(seed, f"{a}.{name}", shape, dtype=dtype)
    for name in ("q_conv1d", "k_conv1d", "v_conv1d"):
        out[f"{a}.{name}.weight"] = dense(seed, f"{a}.{name}", (proj, 1, _CONV), dtype=dtype)
    out[f"{a}.A_log"] = dense(seed, f"{a}.A_log", (nh,), dtype=torch.float32)
    out[f"{a}.dt_bias"] = dense(seed, f"{a}.dt_bias", (proj,), dtype=torch.float32)
    ones_weight(out, f"{a}.o_norm.weight", hd, dtype)


def _mlp(out: dict, seed: int, base: str, h: int, inter: int, dtype: torch.dtype) -> None:
    for name, shape in (("gate_proj", (inter, h)), ("up_proj", (inter, h)), ("down_proj", (h, inter))):
        out[f"{base}.{name}.weight"] = dense(seed, f"{base}.{name}", shape, dtype=dtype)


def kimi_k3_tensors(fmt: str, seed: int, d: Dims, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    h, latent = d.hidden, latent_width(d)
    out[f"{ROOT}.embed_tokens.weight"] = dense(seed, "embed", (d.vocab, h), dtype=dtype)
    scheme = replace(family_named("kimi-k3").source_scheme, layer_prefixes=(PREFIX,))
    for i in range(d.layers):
        p = f"{PREFIX}.{i}"
        ones_weight(out, f"{p}.input_layernorm.weight", h, dtype)
        if i + 1 in _kda_layers(d):
            _kda(out, seed, p, d, dtype)
        else:
            mla_tensors(out, seed, p, h, d.heads, d.q_lora_rank, dtype, indexer=False, dims=_MLA)
        ones_weight(out, f"{p}.post_attention_layernorm.weight", h, dtype)
        if i < _DENSE:
            _mlp(out, seed, f"{p}.mlp", h, 2 * d.intermediate, dtype)
            continue
        moe = f"{p}.block_sparse_moe"
        out[f"{moe}.gate.weight"] = dense(seed, f"{moe}.gate", (d.experts, h), dtype=dtype)
        out[f"{moe}.gate.e_score_correction_bias"] = torch.zeros(d.experts, dtype=torch.float32)
        _mlp(out, seed, f"{moe}.shared_experts", h, d.intermediate, dtype)
        out[f"{moe}.routed_expert_down_proj.weight"] = dense(seed, f"{moe}.routed_expert_down_proj", (latent, h),
                                                             dtype=dtype)
        ones_weight(out, f"{moe}.routed_expert_norm.weight", latent, dtype)
        out[f"{moe}.routed_expert_up_proj.weight"] = dense(seed, f"{moe}.routed_expert_up_proj", (h, latent),
                                                           dtype=dtype)
        out.update(encode_layer_experts(fmt, seed, str(i), experts=d.experts, hidden=latent, inter=d.intermediate,
                                        tweaks=Tweaks(), dtype=dtype, scheme=scheme))
    out[f"{ROOT}.norm.weight"] = torch.ones(h, dtype=dtype)
    out["language_model.lm_head.weight"] = dense(seed, "lm_head", (d.vocab, h), dtype=dtype)
    return out
