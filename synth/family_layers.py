"""The tensors of a family replica (synth/families.py names the families and the facts behind them): embeddings,
each layer's attention, MLP or experts in the family's precision split, the head and the MTP / draft layers."""

from __future__ import annotations

from dataclasses import replace

import torch

from ..core.sources.families import family_named
from ..core.sources.source_formats import source_format
from ..formats.nvfp4 import global_to_ct, nvfp4_global_for, quantize_nvfp4
from .experts import Tweaks, encode_layer_experts
from .families import FAMILY_SPECS, FamilySpec
from .gemma4 import gemma4_tensors
from .glm5next import glm5next_layer, kpool_indexer
from .hybrid import LINEAR, gated_attention, gdn_layer, layer_types
from .kimi_k3 import kimi_k3_tensors
from .layouts import Dims
from .minimax import quantize_mxfp8
from .mla import mla_dims, mla_tensors
from .mtp import deepseek_mtp_layer, qwen_mtp_block
from .nemotron import nemotron_tensors
from .qwen4_exp import qwen4_exp_layer_extras, qwen4_exp_mtp, qwen4_exp_top_extras
from .seeded import dense, expert_matrix

__all__ = ["family_tensors"]


def peak(seed: int, group: list[tuple[str, int, int]]) -> float:
    """The largest |value| over layers the engines fuse (q/k/v, gate/up): both producers give such a group one
    NVFP4 global (llm-compressor's fused global scales; SGLang's W4A16 NVFP4 linear refuses anything else)."""
    return max(dense(seed, name, (n, k), dtype=torch.float32).abs().max().item() for name, n, k in group)


def _linear(out: dict, seed: int, name: str, n: int, k: int, kind: str, dtype: torch.dtype,
            group_peak: float | None = None) -> None:
    """One linear layer's tensors: BF16, ModelOpt FP8 per-tensor, ModelOpt NVFP4 or compressed-tensors NVFP4."""
    w = dense(seed, name, (n, k), dtype=torch.float32)
    if kind == "bf16":
        out[f"{name}.weight"] = w.to(dtype)
    elif kind == "mxfp8":  # MiniMax-M3.1's linears: E4M3 codes, one E8M0 exponent (U8) per 32 along K (synth/minimax.py)
        out[f"{name}.weight"], out[f"{name}.weight_scale_inv"] = quantize_mxfp8(w)
    elif kind == "fp8":
        scale = (w.abs().max() / 448.0).float()
        out[f"{name}.weight"] = (w / scale).to(torch.float8_e4m3fn)
        out[f"{name}.weight_scale"], out[f"{name}.input_scale"] = scale.reshape(()), torch.tensor(0.01)
    else:
        packed, scale, g = quantize_nvfp4(w, nvfp4_global_for(group_peak or w.abs().max().item()))
        if kind == "ct-nvfp4":
            out[f"{name}.weight_packed"], out[f"{name}.weight_scale"] = packed, scale
            out[f"{name}.weight_global_scale"], out[f"{name}.input_global_scale"] = global_to_ct(g), torch.ones(1)
        else:
            out[f"{name}.weight"], out[f"{name}.weight_scale"] = packed, scale
            out[f"{name}.weight_scale_2"], out[f"{name}.input_scale"] = g.reshape(()), torch.tensor(0.01)


def _mlp(out: dict, seed: int, base: str, h: int, inter: int, kind: str, dtype: torch.dtype) -> None:
    fused = peak(seed, [(f"{base}.{proj}", inter, h) for proj in ("gate_proj", "up_proj")])
    for proj, (n, k) in (("gate_proj", (inter, h)), ("up_proj", (inter, h)), ("down_proj", (h, inter))):
        _linear(out, seed, f"{base}.{proj}", n, k, kind, dtype, fused if proj != "down_proj" else None)


def _ct(fmt: str) -> bool:
    """Whether `fmt` is written as llm-compressor writes it (compressed-tensors), not as ModelOpt does."""
    return source_format(fmt).synth.config == "ct"


def _attn_kind(spec: FamilySpec, fmt: str) -> str:
    """Attention's quantisation: FP8 in ModelOpt's MIXED_PRECISION, NVFP4 in llm-compressor's Qwen3.5 recipe, MXFP8
    where the format's linears are (MiniMax-M3.1)."""
    if source_format(fmt).synth.linear == "mxfp8":
        return "mxfp8"
    if spec.mixed:
        return source_format(fmt).synth.linear if _ct(fmt) else "fp8"
    return "bf16"


def _shared_kind(spec: FamilySpec, fmt: str) -> str:
    """ModelOpt quantises shared experts with the rest; the compressed-tensors recipes ignore them, except
    llm-compressor's Qwen3.5 / 3.6 one (it skips only the shared-expert gate)."""
    if _ct(fmt):
        return source_format(fmt).synth.linear if spec.mixed else "bf16"
    return source_format(fmt).synth.linear


def _layer(out: dict, seed: int, spec: FamilySpec, fmt: str, layer: int, d: Dims, dtype: torch.dtype,
           *, experts_layer: bool = True) -> None:
    p, h, hd = f"{spec.prefix}.{layer}", d.hidden, d.heads * d.head_dim
    out[f"{p}.input_layernorm.weight"] = torch.ones(h, dtype=dtype)
    attn = _attn_kind(spec, fmt)
    if spec.attention == "kda-mla":  # GLM-5.3-Flash: KDA or MLA + kpool indexer, and mHC (synth/glm5next.py)
        glm5next_layer(out, seed, p, layer, d, dtype)
    elif spec.attention.startswith("mla"):
        mla_tensors(out, seed, p, h, d.heads, d.q_lora_rank, dtype, indexer=spec.attention == "mla-indexer",
                    dims=mla_dims(spec.config))
    elif spec.linear is not None:  # hybrid: Gated-DeltaNet or gated full attention (synth/hybrid.py)
        if layer < d.layers and layer_types(d)[layer] == LINEAR:
            gdn_layer(out, seed, p, d, _linear, split=spec.linear == "split", dtype=dtype,
                      big="fp8" if spec.mixed and not _ct(fmt) else "bf16")
        else:
            gated_attention(out, seed, p, d, _linear, kind=attn, dtype=dtype)
    else:
        projs = (("q_proj", (hd, h)), ("k_proj", (d.head_dim, h)), ("v_proj", (d.head_dim, h)), ("o_proj", (h, hd)))
        qkv = peak(seed, [(f"{p}.self_attn.{proj}", n, k) for proj, (n, k) in projs[:3]])
        for proj, (n, k) in projs:
            _linear(out, seed, f"{p}.self_attn.{proj}", n, k, attn, dtype, qkv if proj != "o_proj" else None)
    if spec.config.get("use_qk_norm"):  # MiniMax-M2: one norm over all heads; M3: one per head (per_head)
        per_head = spec.config.get("qk_norm_type") == "per_head"
        out[f"{p}.self_attn.q_norm.weight"] = torch.ones(d.head_dim if per_head else hd, dtype=dtype)
        out[f"{p}.self_attn.k_norm.weight"] = torch.ones(d.head_dim, dtype=dtype)
    out[f"{p}.post_attention_layernorm.weight"] = torch.ones(h, dtype=dtype)
    _moe(out, seed, spec, fmt, layer, d, dtype, experts_layer=experts_layer)


def _moe(out: dict, seed: int, spec: FamilySpec, fmt: str, layer: int, d: Dims, dtype: torch.dtype,
         *, experts_layer: bool = True) -> None:
    """Layer `layer`'s MLP: a dense MLP, or the router, shared expert and routed experts."""
    p, h, quant = f"{spec.prefix}.{layer}", d.hidden, source_format(fmt).synth.linear
    if layer < spec.dense_layers or (layer + 1) % spec.moe_every:
        _mlp(out, seed, f"{p}.{spec.moe}", h, 2 * d.intermediate, "bf16" if spec.routed_only else quant, dtype)
        return
    moe = f"{p}.{spec.moe}"
    out[f"{moe}.{spec.router}.weight"] = dense(seed, f"{moe}.{spec.router}", (d.experts, h), dtype=dtype)
    if spec.family in ("deepseek-v3", "deepseek-v32", "glm4-moe", "glm5-moe", "kimi-k25", "glm5-next", "glm5-next-vl"):
        out[f"{moe}.gate.e_score_correction_bias"] = torch.zeros(d.experts, dtype=torch.float32)
    elif spec.config.get("use_routing_bias"):  # MiniMax-M2
        out[f"{moe}.e_score_correction_bias"] = torch.zeros(d.experts, dtype=torch.float32)
    if spec.shared is not None:
        # ModelOpt quantises shared experts with the rest; the compressed-tensors recipes ignore them (but Qwen3.5's)
        _mlp(out, seed, f"{moe}.{spec.shared}", h, d.intermediate,
             "bf16" if spec.routed_only else _shared_kind(spec, fmt), dtype)
        if spec.shared_gate:
            out[f"{moe}.shared_expert_gate.weight"] = dense(seed, f"{moe}.shared_expert_gate", (1, h), dtype=dtype)
    if spec.stacked:
        out.update(_k_major_stacks(seed, f"{moe}.experts", str(layer), d, dtype))
    elif experts_layer:
        scheme = family_named(spec.family).source_scheme
        if spec.prefix != scheme.layer_prefixes[0] and spec.prefix in scheme.layer_prefixes:  # the scheme's 2nd spelling
            scheme = replace(scheme, layer_prefixes=(spec.prefix,))  # (Kimi-K2.5: language_model.model.layers)
        out.update(encode_layer_experts(fmt, seed, str(layer), experts=d.experts, hidden=h, inter=d.intermediate,
                                        tweaks=Tweaks(), dtype=dtype, scheme=scheme))


def _k_major_stacks(seed: int, base: str, layer: str, d: Dims, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """ModelOpt's stacked NVFP4 experts: per expert [N, K] quantised as nn.Linear would be, then stored K-major,
    `gate_up_proj` [E, K/2, 2I] (gate rows, then up rows) and `down_proj` [E, I/2, H]; one global per stack."""
    h, i = d.hidden, d.intermediate
    mats = [{r: expert_matrix(seed, layer, e, r, *((h, i) if r == "down" else (i, h)), dtype=dtype)
             for r in ("gate", "up", "down")} for e in range(d.experts)]
    out: dict[str, torch.Tensor] = {}
    for name, roles in (("gate_up_proj", ("gate", "up")), ("down_proj", ("down",))):
        g = nvfp4_global_for(max(m[r].abs().max().item() for m in mats for r in roles))
        quantised = [[quantize_nvfp4(m[r], g)[:2] for r in roles] for m in mats]
        out[f"{base}.{name}"] = torch.stack([torch.cat([w for w, _ in q]).t() for q in quantised]).contiguous()
        out[f"{base}.{name}_weight_scale"] = torch.stack([torch.cat([s for _, s in q]).t() for q in quantised]
                                                         ).contiguous()
        out[f"{base}.{name}_weight_scale_2"] = g.reshape(())
        out[f"{base}.{name}_input_scale"] = torch.tensor(0.01)
    return out


def family_tensors(family: str, fmt: str, seed: int, d: Dims,
                   dtype: torch.dtype = torch.bfloat16) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(indexed tensors in file order, tensors of the file outside the index: GLM's mtp.safetensors)."""
    spec = FAMILY_SPECS[family]
    if spec.family == "nemotron-h":
        return nemotron_tensors(fmt, seed, d, _linear, dtype, latent=spec.latent_moe), {}
    if family == "kimi-k3":
        return kimi_k3_tensors(fmt, seed, d, dtype), {}
    if family == "gemma4-moe":
        return gemma4_tensors(fmt, seed, d, _linear, family_named(family).source_scheme, dtype), {}
    root = spec.prefix.rsplit(".layers", 1)[0]
    out: dict[str, torch.Tensor] = {}
    out[f"{root}.embed_tokens.weight"] = dense(seed, "embed", (d.vocab, d.hidden), dtype=dtype)
    for i in range(d.layers):
        if spec.ple:  # Qwen4-Exp: hyper-connections instead of the layer norms, PLE tables (synth/qwen4_exp.py)
            qwen4_exp_layer_extras(out, seed, f"{spec.prefix}.{i}", i, d, _linear, attn=_attn_kind(spec, fmt),
                                   big="fp8" if spec.mixed else "bf16", table=spec.ple, dtype=dtype)
            _moe(out, seed, spec, fmt, i, d, dtype)
        else:
            _layer(out, seed, spec, fmt, i, d, dtype)
    if spec.ple:
        qwen4_exp_top_extras(out, seed, root, d, dtype)
    else:
        out[f"{root}.norm.weight"] = torch.ones(d.hidden, dtype=dtype)
    out[spec.lm_head] = dense(seed, "lm_head", (d.vocab, d.hidden), dtype=dtype)
    outside: dict[str, torch.Tensor] = {}
    if spec.mtp == "file":  # GLM: layer num_hidden_layers, quantised like the others, outside the index
        _layer(outside, seed, spec, fmt, d.layers, d, dtype)
        for name in ("enorm", "hnorm"):
            outside[f"{spec.prefix}.{d.layers}.{name}.weight"] = torch.ones(d.hidden, dtype=dtype)
        outside[f"{spec.prefix}.{d.layers}.eh_proj.weight"] = dense(seed, "eh_proj", (d.hidden, 2 * d.hidden),
                                                                    dtype=dtype)
    elif spec.mtp == "unquantised" and spec.ple:  # Qwen4-Exp's: hyper-connections, QSA (synth/qwen4_exp.py)
        qwen4_exp_mtp(out, seed, d, _mlp, _linear, dtype)
    elif spec.mtp == "unquantised":  # Qwen3.5 / Qwen3-Next: a BF16 MTP block under mtp.*, experts included
        qwen_mtp_block(out, seed, d, _mlp, _linear, dtype)
    elif spec.mtp == "layer":  # DeepSeek: layer num_hidden_layers in the index, BF16, excluded (synth/mtp.py)
        deepseek_mtp_layer(out, seed, spec.prefix, d, _mlp, dtype, indexer=spec.attention != "mla",
                           dims=mla_dims(spec.config))
        if spec.attention == "kda-mla":  # GLM-5.3-Flash's MTP layer: MLA with the kpool indexer, the target's head
            kpool_indexer(out, seed, f"{spec.prefix}.{d.layers}.self_attn", d.hidden, dtype)
            del out[f"{spec.prefix}.{d.layers}.shared_head.head.weight"]
    return out, outside
