"""The MTP (draft) layers of the `synth --family` replicas, as each family's releases ship them.

Facts and their public sources:
- DeepSeek-R1 / R1-0528 / V3-0324 FP4 (nvidia, made by ModelOpt's examples/deepseek): the MTP layer is
  `model.layers.<num_hidden_layers>.*` (`num_nextn_predict_layers: 1`, layer 61 of the releases), in the
  index beside the decoder layers. ModelOpt calibrates DeepSeek's own inference model, which has no MTP
  layer, and ptq.py appends `layers.<n_layers>*` to `exclude_modules` ("the mtp is not loaded in the quantized
  model"); quantize_to_nvfp4.py renames it `model.layers.61*` and dequantises every FP8 weight without an
  amax to BF16, so the whole MTP layer, its 256 routed experts included, is BF16 (NVIDIA/TensorRT-Model-
  Optimizer examples/deepseek/ptq.py save_amax_and_quant_config, quantize_to_nvfp4.py
  convert_fp8_ckpt_to_nvfp4). Its tensors besides a full decoder layer (MLA attention, router with
  `e_score_correction_bias`, shared experts, routed experts): `embed_tokens`, `enorm`, `hnorm`, `eh_proj`
  [H, 2H], `shared_head.norm`, `shared_head.head` (vLLM 0.33/0.34 deepseek_mtp.py DeepSeekMultiTokenPredictorLayer,
  _rewrite_spec_layer_name; SGLang 0.5.23 deepseek_nextn.py). The engines build that draft unquantised:
  SGLang's DeepseekModelNextN sets quant_config None for a `modelopt_fp4` target, vLLM's DeepSeekMTP uses the
  target's config, whose `model.layers.61*` exclude keeps every module of the layer BF16.
  DeepSeek-V3.2's NVFP4 release is assumed to follow the same recipe (not confirmed from its file list).
  Kimi-K2 has `num_nextn_predict_layers: 0`: no MTP layer.
- MiniMax-M2 / M2.5 / M2.7: config.json declares `use_mtp: true`, `num_mtp_modules: 3`,
  `mtp_transformer_layers: 1`, but the releases ship no MTP weights (MiniMax-AI/MiniMax-M2 issue #47,
  MiniMax-M2.5 issue #8, MiniMax-M2.7 issue #16); vLLM 0.33/0.34 minimax_m2.py maps `layers.<N + i>.` to
  nothing and SGLang 0.5.23 minimax_m2.py skips them; neither engine has a MiniMax-M2 draft model. The replica
  writes the config keys and no MTP tensor.
- Qwen3.5 / 3.6 and Qwen3-Next: `mtp.fc`, `mtp.pre_fc_norm_{embedding,hidden}`, `mtp.layers.0.*` (a
  full-attention MoE layer), `mtp.norm`, all BF16 and excluded (`mtp*`) in the NVFP4 releases (vLLM 0.33
  qwen3_5_mtp.py, qwen3_next_mtp.py; SGLang 0.5.23 qwen3_5_mtp.py _mtp_quant_config: "Serialized Qwen3.5
  ModelOpt checkpoints keep embedded MTP weights in BF16").
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .hybrid import gated_attention
from .layouts import Dims
from .mla import mla_tensors, ones_weight
from .seeded import dense

__all__ = ["MINIMAX_MTP_CONFIG", "deepseek_mtp_layer", "qwen_mtp_block"]

MINIMAX_MTP_CONFIG = {"use_mtp": True, "num_mtp_modules": 3, "mtp_transformer_layers": 1}

Mlp = Callable[..., None]     # family_layers._mlp(out, seed, base, h, inter, kind, dtype)
Linear = Callable[..., None]  # family_layers._linear(out, seed, name, n, k, kind, dtype)


def deepseek_mtp_layer(out: dict, seed: int, prefix: str, d: Dims, mlp: Mlp, dtype: torch.dtype, *,
                       indexer: bool, dims: dict | None = None) -> None:
    """`<prefix>.<num_hidden_layers>.*`: DeepSeek's MTP layer as ModelOpt's FP4 releases hold it, all BF16."""
    p, h = f"{prefix}.{d.layers}", d.hidden
    out[f"{p}.embed_tokens.weight"] = dense(seed, f"{p}.embed_tokens", (d.vocab, h), dtype=dtype)
    ones_weight(out, f"{p}.enorm.weight", h, dtype)
    ones_weight(out, f"{p}.hnorm.weight", h, dtype)
    out[f"{p}.eh_proj.weight"] = dense(seed, f"{p}.eh_proj", (h, 2 * h), dtype=dtype)
    ones_weight(out, f"{p}.input_layernorm.weight", h, dtype)
    mla_tensors(out, seed, p, h, d.heads, d.q_lora_rank, dtype, indexer=indexer, dims=dims)
    ones_weight(out, f"{p}.post_attention_layernorm.weight", h, dtype)
    out[f"{p}.mlp.gate.weight"] = dense(seed, f"{p}.mlp.gate", (d.experts, h), dtype=dtype)
    out[f"{p}.mlp.gate.e_score_correction_bias"] = torch.zeros(d.experts, dtype=torch.float32)
    mlp(out, seed, f"{p}.mlp.shared_experts", h, d.intermediate, "bf16", dtype)
    for e in range(d.experts):
        mlp(out, seed, f"{p}.mlp.experts.{e}", h, d.intermediate, "bf16", dtype)
    ones_weight(out, f"{p}.shared_head.norm.weight", h, dtype)
    out[f"{p}.shared_head.head.weight"] = dense(seed, f"{p}.shared_head.head", (d.vocab, h), dtype=dtype)


def qwen_mtp_block(out: dict, seed: int, d: Dims, mlp: Mlp, linear: Linear, dtype: torch.dtype) -> None:
    """`mtp.fc`, the two pre-fc norms, one full-attention MoE layer `mtp.layers.0.*` and `mtp.norm`, all BF16."""
    h = d.hidden
    out["mtp.fc.weight"] = dense(seed, "mtp.fc", (h, 2 * h), dtype=dtype)
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden"):
        ones_weight(out, f"mtp.{norm}.weight", h, dtype)
    p = "mtp.layers.0"
    ones_weight(out, f"{p}.input_layernorm.weight", h, dtype)
    gated_attention(out, seed, p, d, linear, kind="bf16", dtype=dtype)
    ones_weight(out, f"{p}.post_attention_layernorm.weight", h, dtype)
    out[f"{p}.mlp.gate.weight"] = dense(seed, f"{p}.mlp.gate", (d.experts, h), dtype=dtype)
    mlp(out, seed, f"{p}.mlp.shared_expert", h, d.intermediate, "bf16", dtype)
    out[f"{p}.mlp.shared_expert_gate.weight"] = dense(seed, f"{p}.mlp.shared_expert_gate", (1, h), dtype=dtype)
    for e in range(d.experts):
        mlp(out, seed, f"{p}.mlp.experts.{e}", h, d.intermediate, "bf16", dtype)
    ones_weight(out, "mtp.norm.weight", h, dtype)
