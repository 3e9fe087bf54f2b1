"""The non-expert layers of the hybrid families' replicas (synth/families.py): Gated-DeltaNet linear attention
and gated full attention (Qwen3-Next, Qwen3.5 / 3.6), and Nemotron-H's Mamba-2 mixer. Shapes are the ones
the engines' modules create from the config keys written beside them (`linear_config`, `mamba_config`).

Facts and sources:
- Qwen3-Next (`Qwen3NextForCausalLM`, transformers configuration_qwen3_next.py, vLLM 0.33 qwen3_next.py):
  `layer_types` from `full_attention_interval` ("linear_attention" unless (i + 1) % interval == 0), linear layers
  `linear_attn.in_proj_qkvz` [2*Kd + 2*Vd, H] and `in_proj_ba` [2*Hv, H], `conv1d.weight` [2*Kd + Vd, 1, kernel],
  `A_log` / `dt_bias` [Hv], `norm.weight` [Dv], `out_proj` [H, Vd] (Kd = key heads x key head dim, Vd = value
  heads x value head dim, Hv = value heads: vLLM qwen_gdn_linear_attn.py QwenGatedDeltaNetAttention); full
  layers `self_attn.{q,k,v,o}_proj` with the output gate in q_proj (2 x heads x head_dim rows) and
  `q_norm` / `k_norm` [head_dim] (vLLM Qwen3NextAttention, attn_output_gate).
- Qwen3.5 / 3.6 split the linear projections: `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a` (vLLM 0.33
  qwen3_5.py Qwen3_5Model.hf_to_vllm_mapper orig_to_new_stacked; transformers configuration_qwen3_5_moe.py
  base_model_tp_plan). nvidia/Qwen3.6-35B-A3B-NVFP4 (ModelOpt MIXED_PRECISION) stores `self_attn` and the
  large `linear_attn` projections as FP8 with a per-tensor scale (Avarok-Cybersecurity/atlas PR #121) and
  keeps `linear_attn.in_proj_a/b` unquantised (the qwen3_5_moe ModelOpt recipe disables them:
  NVIDIA/Model-Optimizer PR #2302 review); llm-compressor's Qwen3.6 NVFP4 example skips the linear-attention
  layers (vllm-project/llm-compressor PR #2740).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .layouts import Dims
from .seeded import dense

__all__ = ["LINEAR", "FULL", "layer_types", "linear_config", "gdn_layer", "gated_attention"]

LINEAR, FULL = "linear_attention", "full_attention"
Linear = Callable[..., None]  # family_layers._linear(out, seed, name, n, k, kind, dtype)


def layer_types(d: Dims, interval: int = 2) -> list[str]:
    """Qwen3-Next's rule; the replicas use interval 2 (one linear and one full layer in two), the releases 4."""
    return [LINEAR if (i + 1) % interval else FULL for i in range(d.layers)]


def _gdn_dims(d: Dims) -> tuple[int, int, int]:
    """(key heads, value heads, head dim) of the replica's linear attention."""
    return d.heads, 2 * d.heads, d.head_dim


def linear_config(d: Dims) -> dict:
    kh, vh, hd = _gdn_dims(d)
    return {"layer_types": layer_types(d), "full_attention_interval": 2, "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": hd, "linear_value_head_dim": hd, "linear_num_key_heads": kh,
            "linear_num_value_heads": vh, "partial_rotary_factor": 0.25}


def gdn_layer(out: dict, seed: int, p: str, d: Dims, linear: Linear, *, split: bool, big: str,
              dtype: torch.dtype) -> None:
    """`p.linear_attn.*`: Qwen3.5's split projections (`split`) or Qwen3-Next's fused ones; `big` is the
    quantisation of in_proj_qkv(z) / in_proj_z / out_proj ("bf16", "fp8", "nvfp4", "ct-nvfp4")."""
    kh, vh, hd = _gdn_dims(d)
    kd, vd, h, a = kh * hd, vh * hd, d.hidden, f"{p}.linear_attn"
    if split:
        linear(out, seed, f"{a}.in_proj_qkv", 2 * kd + vd, h, big, dtype)
        linear(out, seed, f"{a}.in_proj_z", vd, h, big, dtype)
        linear(out, seed, f"{a}.in_proj_b", vh, h, "bf16", dtype)
        linear(out, seed, f"{a}.in_proj_a", vh, h, "bf16", dtype)
    else:
        linear(out, seed, f"{a}.in_proj_qkvz", 2 * kd + 2 * vd, h, big, dtype)
        linear(out, seed, f"{a}.in_proj_ba", 2 * vh, h, "bf16", dtype)
    out[f"{a}.conv1d.weight"] = dense(seed, f"{a}.conv1d", (2 * kd + vd, 1, 4), dtype=dtype)
    out[f"{a}.dt_bias"] = torch.ones(vh, dtype=dtype)
    out[f"{a}.A_log"] = dense(seed, f"{a}.A_log", (vh,), dtype=torch.float32)
    out[f"{a}.norm.weight"] = torch.ones(hd, dtype=dtype)
    linear(out, seed, f"{a}.out_proj", h, vd, big, dtype)


def gated_attention(out: dict, seed: int, p: str, d: Dims, linear: Linear, *, kind: str, dtype: torch.dtype) -> None:
    """`p.self_attn.*` of a full-attention layer: q_proj holds the query and the output gate."""
    hd, h, s = d.heads * d.head_dim, d.hidden, f"{p}.self_attn"
    projs = (("q_proj", (2 * hd, h)), ("k_proj", (d.head_dim, h)), ("v_proj", (d.head_dim, h)), ("o_proj", (h, hd)))
    # q/k/v share one NVFP4 global (the engines fuse them into qkv_proj)
    qkv = max(dense(seed, f"{s}.{proj}", shape, dtype=torch.float32).abs().max().item() for proj, shape in projs[:3])
    for proj, (n, k) in projs:
        linear(out, seed, f"{s}.{proj}", n, k, kind, dtype, qkv if proj != "o_proj" else None)
    out[f"{s}.q_norm.weight"] = torch.ones(d.head_dim, dtype=dtype)
    out[f"{s}.k_norm.weight"] = torch.ones(d.head_dim, dtype=dtype)
