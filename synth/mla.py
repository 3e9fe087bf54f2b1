"""DeepSeek-V3-style attention for `synth --family` replicas: MLA (DeepSeek-R1 / V3 / V3.1, Kimi-K2) and MLA
with the V3.2 sparse-attention indexer, in Hugging Face names, BF16, at shrunk head counts.

Facts and their public sources:
- MLA projections per layer `model.layers.L.self_attn.`: `q_a_proj` [q_lora_rank, H], `q_a_layernorm`,
  `q_b_proj` [heads * (qk_nope + qk_rope), q_lora_rank], `kv_a_proj_with_mqa` [kv_lora_rank + qk_rope, H],
  `kv_a_layernorm`, `kv_b_proj` [heads * (qk_nope + v_head), kv_lora_rank], `o_proj` [H, heads * v_head]
  (transformers modeling_deepseek_v3.py DeepseekV3Attention; vLLM 0.33 deepseek_v2.py DeepseekV2MLAAttention
  and its load_weights `fused_qkv_a_proj` <- q_a_proj, kv_a_proj_with_mqa).
- Head sizes kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128, YaRN rope scaling
  (factor 40, original_max_position_embeddings 4096, mscale 1.0): deepseek-ai/DeepSeek-V3 config.json (also
  R1, R1-0528, V3-0324, V3.1); Kimi-K2 keeps the heads sizes with 64 heads, rope_theta 50000, one dense layer,
  `model_type: kimi_k2` under `architectures: [DeepseekV3ForCausalLM]` (moonshotai/Kimi-K2-Instruct
  config.json; vLLM 0.33 transformers_utils/config.py maps kimi_k2 to DeepseekV3Config, SGLang 0.5.23
  utils/hf_transformers/common.py registers the same alias).
- V3.2's indexer `self_attn.indexer.{wq_b [index_n_heads * index_head_dim, q_lora_rank], wk [index_head_dim, H],
  k_norm (LayerNorm weight and bias), weights_proj [index_n_heads, H]}` with index_n_heads 64, index_head_dim 128,
  index_topk 2048 (deepseek-ai/DeepSeek-V3.2-Exp config.json and inference/model.py Indexer; vLLM 0.33
  deepseek_v2.py Indexer, which loads wk and weights_proj fused as `wk_weights_proj`).
"""

from __future__ import annotations

import torch

from .seeded import dense

__all__ = ["MLA", "INDEXER", "mla_config", "mla_dims", "mla_tensors", "ones_weight"]

MLA = {"kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}
INDEXER = {"index_n_heads": 64, "index_head_dim": 128, "index_topk": 2048}
_YARN = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1,
         "mscale": 1.0, "mscale_all_dim": 1.0}


def mla_config(heads: int, q_lora_rank: int, *, indexer: bool) -> dict:
    """The attention fields of a DeepSeek-V3-style config.json."""
    return {"num_attention_heads": heads, "num_key_value_heads": heads, "q_lora_rank": q_lora_rank, **MLA,
            "rope_theta": 10000, "rope_scaling": dict(_YARN), "max_position_embeddings": 163840,
            "rms_norm_eps": 1e-6, "attention_bias": False, **(INDEXER if indexer else {})}


def mla_dims(config: dict) -> dict:
    """The attention's head sizes of a replica's config (its own where it names them: GLM-5), else DeepSeek-V3's."""
    return {k: config.get(k, v) for k, v in {**MLA, **INDEXER}.items()}


def ones_weight(out: dict, name: str, size: int, dtype: torch.dtype) -> None:
    """A norm's weight as the replicas write it: ones."""
    out[name] = torch.ones(size, dtype=dtype)


def mla_tensors(out: dict, seed: int, p: str, hidden: int, heads: int, q_lora_rank: int, dtype: torch.dtype,
                *, indexer: bool, dims: dict | None = None) -> None:
    """The BF16 attention tensors of decoder layer `p` (`model.layers.3`); `dims`: mla_dims of the config."""
    a, m = f"{p}.self_attn", dims or mla_dims({})
    qk = m["qk_nope_head_dim"] + m["qk_rope_head_dim"]
    shapes = {
        "q_a_proj": (q_lora_rank, hidden),
        "q_b_proj": (heads * qk, q_lora_rank),
        "kv_a_proj_with_mqa": (m["kv_lora_rank"] + m["qk_rope_head_dim"], hidden),
        "kv_b_proj": (heads * (m["qk_nope_head_dim"] + m["v_head_dim"]), m["kv_lora_rank"]),
        "o_proj": (hidden, heads * m["v_head_dim"]),
    }
    for proj, shape in shapes.items():
        out[f"{a}.{proj}.weight"] = dense(seed, f"{a}.{proj}", shape, dtype=dtype)
    ones_weight(out, f"{a}.q_a_layernorm.weight", q_lora_rank, dtype)
    ones_weight(out, f"{a}.kv_a_layernorm.weight", m["kv_lora_rank"], dtype)
    if indexer:
        i, n, d = f"{a}.indexer", m["index_n_heads"], m["index_head_dim"]
        out[f"{i}.wq_b.weight"] = dense(seed, f"{i}.wq_b", (n * d, q_lora_rank), dtype=dtype)
        out[f"{i}.wk.weight"] = dense(seed, f"{i}.wk", (d, hidden), dtype=dtype)
        ones_weight(out, f"{i}.k_norm.weight", d, dtype)
        out[f"{i}.k_norm.bias"] = torch.zeros(d, dtype=dtype)
        out[f"{i}.weights_proj.weight"] = dense(seed, f"{i}.weights_proj", (n, hidden), dtype=dtype)
