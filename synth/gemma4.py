"""The Gemma-4 MoE replica (`synth --family gemma4-moe`): Gemma-4 26B-A4B's text stack, whose every layer has a
dense MLP and, beside it, routed experts.

Facts and sources:
- `Gemma4ForConditionalGeneration`, model_type `gemma4`, the text config under `text_config` (model_type
  `gemma4_text`); the text stack `model.language_model.layers.L` (vLLM 0.33 gemma4_mm.py, gemma4.py
  hf_to_vllm_mapper `model.language_model.` -> `model.`; transformers configuration_gemma4.py).
- A layer: `self_attn.{q,k,v,o}_proj`, `q_norm`, `k_norm`; full-attention layers with `attention_k_eq_v` ship
  `k_proj` only (K loaded into both K and V: vLLM gemma4.py _gemma4_layer_weights_mapper); the dense
  `mlp.{gate,up,down}_proj`; the router `router.proj` [E, H], `router.scale` [H], `router.per_expert_scale` [E];
  the routed experts `experts.E.{gate,up,down}_proj` as a sibling of `mlp` (vLLM Gemma4DecoderLayer: experts
  at `{layer}.experts`, routed by `{layer}.router`; the per-expert names are the ones the naming table's
  `gemma4` scheme reads, not confirmed from a released NVFP4 tensor list); the norms `input_layernorm`,
  `post_attention_layernorm`, `pre_feedforward_layernorm`, `post_feedforward_layernorm` and, for the MoE
  branch, `pre_feedforward_layernorm_2`, `post_feedforward_layernorm_1`, `post_feedforward_layernorm_2`; the
  `layer_scalar` buffer.
- 26B-A4B: sliding-window and global layers 5:1, 128 experts top-8, K = V on global layers, tied embeddings
  (public model pages: apxml.com/models/gemma-4-26b-a4b, vast.ai/model/gemma-4-26b-a4b-it).
- The NVFP4 export's quantised set (experts and dense MLP NVFP4; attention, router BF16) is this generator's
  assumption: no public Gemma-4 NVFP4 tensor list was available.
The replica has two layers, one sliding and one global.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..core.sources.source_formats import source_format
from .experts import Tweaks, encode_layer_experts
from .layouts import Dims
from .seeded import dense

__all__ = ["gemma4_tensors", "gemma4_text_config"]

PREFIX = "model.language_model.layers"
_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm",
          "pre_feedforward_layernorm_2", "post_feedforward_layernorm_1", "post_feedforward_layernorm_2")
Linear = Callable[..., None]  # family_layers._linear(out, seed, name, n, k, kind, dtype)


def _layer_types(d: Dims) -> list[str]:
    return ["full_attention" if (i + 1) % 2 == 0 else "sliding_attention" for i in range(d.layers)]


def gemma4_tensors(fmt: str, seed: int, d: Dims, linear: Linear, scheme, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    quant = source_format(fmt).synth.linear
    h, hd, out = d.hidden, d.heads * d.head_dim, {}
    out["model.language_model.embed_tokens.weight"] = dense(seed, "embed", (d.vocab, h), dtype=dtype)
    for i, kind in enumerate(_layer_types(d)):
        p = f"{PREFIX}.{i}"
        for norm in _NORMS:
            out[f"{p}.{norm}.weight"] = torch.ones(h, dtype=dtype)
        projs = [("q_proj", (hd, h)), ("k_proj", (d.head_dim, h)), ("o_proj", (h, hd))]
        if kind == "sliding_attention":  # K = V on the global layers
            projs.insert(2, ("v_proj", (d.head_dim, h)))
        for proj, (n, k) in projs:
            linear(out, seed, f"{p}.self_attn.{proj}", n, k, "bf16", dtype)
        out[f"{p}.self_attn.q_norm.weight"] = torch.ones(d.head_dim, dtype=dtype)
        out[f"{p}.self_attn.k_norm.weight"] = torch.ones(d.head_dim, dtype=dtype)
        i2 = 2 * d.intermediate  # gate and up share one NVFP4 global (the engines fuse them into gate_up_proj)
        gu = max(dense(seed, f"{p}.mlp.{proj}", (i2, h), dtype=torch.float32).abs().max().item()
                 for proj in ("gate_proj", "up_proj"))
        for proj, (n, k) in (("gate_proj", (i2, h)), ("up_proj", (i2, h)), ("down_proj", (h, i2))):
            linear(out, seed, f"{p}.mlp.{proj}", n, k, quant, dtype, gu if proj != "down_proj" else None)
        out[f"{p}.router.proj.weight"] = dense(seed, f"{p}.router.proj", (d.experts, h), dtype=dtype)
        out[f"{p}.router.scale"] = torch.ones(h, dtype=dtype)
        out[f"{p}.router.per_expert_scale"] = torch.ones(d.experts, dtype=dtype)
        out.update(encode_layer_experts(fmt, seed, str(i), experts=d.experts, hidden=h, inter=d.intermediate,
                                        tweaks=Tweaks(), dtype=dtype, scheme=scheme))
        out[f"{p}.layer_scalar"] = torch.ones(1, dtype=dtype)
    out["model.language_model.norm.weight"] = torch.ones(h, dtype=dtype)
    return out


def gemma4_text_config(d: Dims) -> dict:
    return {
        "model_type": "gemma4_text", "hidden_size": d.hidden, "intermediate_size": 2 * d.intermediate,
        "num_hidden_layers": d.layers, "layer_types": _layer_types(d), "sliding_window": 512,
        "num_attention_heads": d.heads, "num_key_value_heads": 1, "head_dim": d.head_dim,
        "global_head_dim": d.head_dim, "num_global_key_value_heads": 1, "attention_k_eq_v": True,
        "hidden_size_per_layer_input": 0, "vocab_size": d.vocab, "vocab_size_per_layer_input": d.vocab,
        "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": 30.0, "tie_word_embeddings": True,
        "enable_moe_block": True, "num_experts": d.experts, "top_k_experts": d.top_k,
        "moe_intermediate_size": d.intermediate, "torch_dtype": "bfloat16",
    }
