"""The Nemotron-H replica (`synth --family nemotron-h`): NVIDIA Nemotron-H / Nemotron-3-Nano-30B-A3B, a hybrid of
Mamba-2 mixers, attention and MoE layers with non-gated ReLU-squared experts.

Facts and sources:
- `NemotronHForCausalLM`, model_type `nemotron_h`; the layer kinds come from `hybrid_override_pattern`, one
  character a layer: `M` Mamba-2, `*` attention, `E` MoE, `-` dense MLP (vLLM 0.33 nemotron_h.py
  NemotronHModel, ALL_DECODER_LAYER_TYPES; transformers configuration_nemotron_h.py).
- Names: `backbone.embeddings`, `backbone.layers.L.norm`, `backbone.layers.L.mixer.*`, `backbone.norm_f`,
  `lm_head` (vLLM hf_to_vllm_mapper `backbone` -> `model`, `embeddings` -> `embed_tokens`, `A_log` -> `A`).
- Mamba-2 mixer: `in_proj` [2*Di + 2*G*N + Hm, H], `conv1d.weight` [Di + 2*G*N, 1, kernel] and `.bias`,
  `dt_bias` / `A_log` / `D` [Hm], `norm.weight` [Di], `out_proj` [H, Di] (Di = mamba_num_heads x mamba_head_dim,
  G = n_groups, N = ssm_state_size: vLLM mamba_mixer2.py MambaMixer2).
- MoE: router `mixer.gate.weight` [E, H] with `gate.e_score_correction_bias` fp32 [E], routed experts
  `mixer.experts.E.{up_proj,down_proj}` (no gate_proj: `mlp_hidden_act: relu2`, non-gated), shared expert
  `mixer.shared_experts.{up_proj,down_proj}` (vLLM NemotronHMoE, NemotronHMLP; the release's names as issue #27
  quotes them for nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4).
- Which non-expert layers the NVFP4 release quantises is this generator's assumption (experts and shared
  experts NVFP4; attention, Mamba and the router BF16): no public tensor list was available to confirm it.
  The attention projections are excluded by their per-layer names (`backbone.layers.1.mixer.q_proj`, as
  ModelOpt lists modules one by one, e.g. nvidia/Qwen3-235B-A22B-Instruct-2507-NVFP4): both engines fuse
  q/k/v into `qkv_proj`, and vLLM's ModelOpt exclusion (modelopt.py is_layer_excluded -> is_layer_skipped
  with the packed-modules mapping) matches a fused layer only through its shards' exact names, so a
  `*.mixer.q_proj` glob would build `qkv_proj` as NVFP4 over BF16 tensors (vLLM's own load fails).
The replica always has four layers, `M*EE`.

Nemotron-3 Super / Ultra (`synth --family nemotron-3-super`): the same names with LatentMoE. `moe_latent_size` in
config.json; each MoE layer projects the hidden state down before its routed experts and back after them,
`mixer.fc1_latent_proj` [latent, H] and `mixer.fc2_latent_proj` [H, latent], and its routed experts run at the latent
width (`experts.E.up_proj` [I, latent], `down_proj` [latent, I]); the router and the shared expert stay at
hidden_size (vLLM 0.33 / 0.34 and SGLang 0.5.23 nemotron_h.py NemotronHMoE: `moe_hidden_size = config.moe_latent_size`
is the FusedMoE's hidden_size, the shared expert NemotronHMLP takes `config.hidden_size`). ModelOpt keeps the latent
projections unquantised (vLLM nemotron_h.py: "ModelOpt excludes the latent projections"). Super: hidden 4096, latent
1024, 512 experts, top-22 (arXiv 2604.12374, the Nemotron 3 Super report); the replica's latent is hidden / 2. Its
MTP layers are not modelled.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..core.sources.source_formats import source_format
from .layouts import Dims
from .seeded import dense

__all__ = ["BF16", "LATENT_BF16", "PATTERN", "latent_size", "nemotron_tensors", "nemotron_config"]

PATTERN = "M*EE"
# what the NVFP4 export keeps BF16 besides the router (synth.families FamilySpec.bf16): the Mamba projections
# (a glob over layers) and each attention layer's projections by name
BF16 = ("mixer.in_proj", "mixer.out_proj",
        *(f"{i}.mixer.{p}" for i, kind in enumerate(PATTERN) if kind == "*" for p in ("q_proj", "k_proj", "v_proj", "o_proj")))
LATENT_BF16 = ("mixer.fc1_latent_proj", "mixer.fc2_latent_proj")  # Nemotron-3 Super / Ultra's, also BF16
PREFIX = "backbone.layers"
# n_groups 8 as the release (nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B config.json: "n_groups": 8, mamba_num_heads
# 64, mamba_head_dim 64, ssm_state_size 128): SGLang 0.5.23's model reads `mamba_n_groups` (a key the release
# does not write; default 8) and vLLM reads `n_groups`, so only the release's value builds one model in both
_MAMBA = {"mamba_num_heads": 8, "mamba_head_dim": 16, "n_groups": 8, "ssm_state_size": 16, "conv_kernel": 4}
Linear = Callable[..., None]  # family_layers._linear(out, seed, name, n, k, kind, dtype)


def _mamba(out: dict, seed: int, m: str, d: Dims, linear: Linear, dtype: torch.dtype) -> None:
    heads, di = _MAMBA["mamba_num_heads"], _MAMBA["mamba_num_heads"] * _MAMBA["mamba_head_dim"]
    gn = 2 * _MAMBA["n_groups"] * _MAMBA["ssm_state_size"]
    linear(out, seed, f"{m}.in_proj", 2 * di + gn + heads, d.hidden, "bf16", dtype)
    out[f"{m}.conv1d.weight"] = dense(seed, f"{m}.conv1d", (di + gn, 1, _MAMBA["conv_kernel"]), dtype=dtype)
    out[f"{m}.conv1d.bias"] = torch.zeros(di + gn, dtype=dtype)
    out[f"{m}.dt_bias"] = torch.ones(heads, dtype=dtype)
    out[f"{m}.A_log"] = dense(seed, f"{m}.A_log", (heads,), dtype=torch.float32)
    out[f"{m}.D"] = torch.ones(heads, dtype=torch.float32)
    out[f"{m}.norm.weight"] = torch.ones(di, dtype=dtype)
    linear(out, seed, f"{m}.out_proj", d.hidden, di, "bf16", dtype)


def latent_size(d: Dims) -> int:
    """The replica's `moe_latent_size`: half the hidden size (Super's is a quarter: 1024 of 4096)."""
    return d.hidden // 2


def nemotron_tensors(fmt: str, seed: int, d: Dims, linear: Linear, dtype: torch.dtype,
                     *, latent: bool = False) -> dict[str, torch.Tensor]:
    quant = source_format(fmt).synth.linear
    h, hd, out = d.hidden, d.heads * d.head_dim, {}
    width = latent_size(d) if latent else h  # the routed experts' width
    out["backbone.embeddings.weight"] = dense(seed, "embed", (d.vocab, h), dtype=dtype)
    for i, kind in enumerate(PATTERN):
        p = f"{PREFIX}.{i}"
        out[f"{p}.norm.weight"] = torch.ones(h, dtype=dtype)
        m = f"{p}.mixer"
        if kind == "M":
            _mamba(out, seed, m, d, linear, dtype)
        elif kind == "*":
            for proj, (n, k) in (("q_proj", (hd, h)), ("k_proj", (d.head_dim, h)), ("v_proj", (d.head_dim, h)),
                                 ("o_proj", (h, hd))):
                linear(out, seed, f"{m}.{proj}", n, k, "bf16", dtype)
        else:
            out[f"{m}.gate.weight"] = dense(seed, f"{m}.gate", (d.experts, h), dtype=dtype)
            out[f"{m}.gate.e_score_correction_bias"] = torch.zeros(d.experts, dtype=torch.float32)
            if latent:
                linear(out, seed, f"{m}.fc1_latent_proj", width, h, "bf16", dtype)
                linear(out, seed, f"{m}.fc2_latent_proj", h, width, "bf16", dtype)
            for e in [*range(d.experts), None]:
                base, k = (f"{m}.experts.{e}", width) if e is not None else (f"{m}.shared_experts", h)
                linear(out, seed, f"{base}.up_proj", d.intermediate, k, quant, dtype)
                linear(out, seed, f"{base}.down_proj", k, d.intermediate, quant, dtype)
    out["backbone.norm_f.weight"] = torch.ones(h, dtype=dtype)
    out["lm_head.weight"] = dense(seed, "lm_head", (d.vocab, h), dtype=dtype)
    return out


def nemotron_config(d: Dims, *, latent: bool = False) -> dict:
    return {**({"moe_latent_size": latent_size(d)} if latent else {}),
        "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "torch_dtype": "bfloat16",
        "hidden_size": d.hidden, "num_hidden_layers": len(PATTERN), "hybrid_override_pattern": PATTERN,
        "num_attention_heads": d.heads, "num_key_value_heads": 1, "head_dim": d.head_dim,
        "intermediate_size": 2 * d.intermediate, "vocab_size": d.vocab, "tie_word_embeddings": False,
        "n_routed_experts": d.experts, "num_experts_per_tok": d.top_k, "moe_intermediate_size": d.intermediate,
        "n_shared_experts": 1, "moe_shared_expert_intermediate_size": d.intermediate, "n_group": 1,
        "topk_group": 1, "routed_scaling_factor": 1.0, "norm_topk_prob": True, "mlp_hidden_act": "relu2",
        "mamba_hidden_act": "silu", "expand": 2, "use_conv_bias": True, "use_bias": False,
        "layer_norm_epsilon": 1e-5, "residual_in_fp32": False, "rescale_prenorm_residual": True,
        "chunk_size": 128, **_MAMBA,
    }
