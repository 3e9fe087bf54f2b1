"""The whole tensor tree of a small synthetic checkpoint, per source format, in file order.

DeepSeek-V4 native names (no `model.` prefix, FP8 block-quant attention and shared experts with
E8M0 128x128 scales) for `mxfp4-dsv4` and `nvfp4-modelopt-dsv4`; Hugging Face names (BF16
attention, `model.layers.L.mlp.*`) for the generic ModelOpt, compressed-tensors and gpt-oss formats.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from ..core.sources.source_formats import source_format
from .experts import Tweaks, encode_layer_experts
from .seeded import FP8_BLOCK, dense, fp8_block_quantize, generator_for

__all__ = ["Dims", "build_tensors"]

DSV4_HC_MULT = 4  # DeepSeek-V4's hyper-connection streams (config.json `hc_mult`)


@dataclass(frozen=True, slots=True)
class Dims:
    """Model dimensions of a synthetic checkpoint; everything not given is derived from `hidden`."""
    layers: int
    experts: int
    hidden: int
    intermediate: int
    hash_layers: int
    mtp: bool
    vocab: int = 512
    heads: int = 2
    head_dim: int = 64

    @property
    def top_k(self) -> int:
        return min(6, self.experts)

    @property
    def q_lora_rank(self) -> int:
        return max(self.hidden // 2, 32)


def _fp8_linear(out: dict, seed: int, name: str, n: int, k: int, block: int = FP8_BLOCK) -> None:
    w, s = fp8_block_quantize(dense(seed, name, (n, k), dtype=torch.float32), (block, block))
    out[f"{name}.weight"], out[f"{name}.scale"] = w, s


def _norm(out: dict, seed: int, name: str, size: int, dtype: torch.dtype) -> None:
    out[name] = (1.0 + dense(seed, name, (size,), std=0.05, dtype=torch.float32)).to(dtype)


def _hyper_connection(out: dict, seed: int, name: str, mix: int, scales: int, h: int) -> None:
    """`{name}_fn` [mix, hc_mult * hidden], `_base` [mix], `_scale` [scales]: F32, as the release stores them."""
    for suffix, shape in (("fn", (mix, DSV4_HC_MULT * h)), ("base", (mix,)), ("scale", (scales,))):
        out[f"{name}_{suffix}"] = dense(seed, f"{name}_{suffix}", shape, dtype=torch.float32)


def _dsv4_block(out: dict, seed: int, prefix: str, layer: str, index: int, d: Dims, fmt: str,
                tweaks: Tweaks, dtype: torch.dtype, *, block: int = FP8_BLOCK, experts: int | None = None,
                engram=None, bias_vl: bool = False) -> None:
    """One DeepSeek-V4 transformer block: hyper-connection mixers (F32), sliding-window attention (FP8, one
    output group: wo_a [hd, hd]), router, shared (FP8) and routed experts. V4.1 (synth/dsv41.py): `block` 32,
    `experts` a draft stage's own count, `engram(out, prefix)` writes the layer's Engram before its attention,
    `bias_vl`: the router's bias for image tokens (a vision checkpoint's every MoE layer)."""
    h, q, hd = d.hidden, d.q_lora_rank, d.heads * d.head_dim
    n_experts = d.experts if experts is None else experts
    _fp8 = partial(_fp8_linear, block=block)
    for sub in ("attn", "ffn"):
        _hyper_connection(out, seed, f"{prefix}.hc_{sub}", (2 + DSV4_HC_MULT) * DSV4_HC_MULT, 3, h)
    if engram is not None:
        engram(out, prefix)
    _norm(out, seed, f"{prefix}.attn_norm.weight", h, dtype)
    _fp8(out, seed, f"{prefix}.attn.wq_a", q, h)
    _norm(out, seed, f"{prefix}.attn.q_norm.weight", q, dtype)
    _fp8(out, seed, f"{prefix}.attn.wq_b", hd, q)
    _fp8(out, seed, f"{prefix}.attn.wkv", d.head_dim, h)
    _norm(out, seed, f"{prefix}.attn.kv_norm.weight", d.head_dim, dtype)
    _fp8(out, seed, f"{prefix}.attn.wo_a", hd, hd)
    _fp8(out, seed, f"{prefix}.attn.wo_b", h, hd)
    out[f"{prefix}.attn.attn_sink"] = dense(seed, f"{prefix}.attn.attn_sink", (d.heads,), dtype=torch.float32)
    _norm(out, seed, f"{prefix}.ffn_norm.weight", h, torch.float32)
    out[f"{prefix}.ffn.gate.weight"] = dense(seed, f"{prefix}.ffn.gate.weight", (n_experts, h), dtype=dtype)
    if index < d.hash_layers:
        g = generator_for(seed, f"{prefix}.ffn.gate.tid2eid")
        out[f"{prefix}.ffn.gate.tid2eid"] = torch.randint(0, n_experts, (d.vocab, d.top_k), generator=g)
    else:
        out[f"{prefix}.ffn.gate.bias"] = dense(seed, f"{prefix}.ffn.gate.bias", (n_experts,), dtype=torch.float32)
    if bias_vl:
        out[f"{prefix}.ffn.gate.bias_vl"] = dense(seed, f"{prefix}.ffn.gate.bias_vl", (n_experts,), dtype=torch.float32)
    for proj, (n, k) in (("w1", (d.intermediate, h)), ("w2", (h, d.intermediate)), ("w3", (d.intermediate, h))):
        _fp8(out, seed, f"{prefix}.ffn.shared_experts.{proj}", n, k)
    out.update(encode_layer_experts(fmt, seed, layer, experts=n_experts, hidden=h, inter=d.intermediate,
                                    tweaks=tweaks, dtype=dtype))


def _dsv4_tree(fmt: str, seed: int, d: Dims, tweaks: Tweaks, dtype: torch.dtype) -> dict:
    out: dict[str, torch.Tensor] = {}
    out["embed.weight"] = dense(seed, "embed.weight", (d.vocab, d.hidden), dtype=dtype)
    for i in range(d.layers):
        _dsv4_block(out, seed, f"layers.{i}", str(i), i, d, fmt, tweaks, dtype)
    _hyper_connection(out, seed, "hc_head", DSV4_HC_MULT, 1, d.hidden)
    _norm(out, seed, "norm.weight", d.hidden, dtype)
    out["head.weight"] = dense(seed, "head.weight", (d.vocab, d.hidden), dtype=dtype)
    if d.mtp:
        _norm(out, seed, "mtp.0.enorm.weight", d.hidden, dtype)
        _norm(out, seed, "mtp.0.hnorm.weight", d.hidden, dtype)
        _fp8_linear(out, seed, "mtp.0.e_proj", d.hidden, d.hidden)
        _fp8_linear(out, seed, "mtp.0.h_proj", d.hidden, d.hidden)
        _dsv4_block(out, seed, "mtp.0", "mtp.0", d.layers, d, fmt, tweaks, dtype)
        _norm(out, seed, "mtp.0.norm.weight", d.hidden, dtype)
    return out


def _hf_tree(fmt: str, seed: int, d: Dims, tweaks: Tweaks, dtype: torch.dtype) -> dict:
    out: dict[str, torch.Tensor] = {}
    h, hd = d.hidden, d.heads * d.head_dim
    out["model.embed_tokens.weight"] = dense(seed, "model.embed_tokens.weight", (d.vocab, h), dtype=dtype)
    for i in range(d.layers):
        p = f"model.layers.{i}"
        _norm(out, seed, f"{p}.input_layernorm.weight", h, dtype)
        for proj, shape in (("q_proj", (hd, h)), ("k_proj", (d.head_dim, h)), ("v_proj", (d.head_dim, h)),
                            ("o_proj", (h, hd))):
            out[f"{p}.self_attn.{proj}.weight"] = dense(seed, f"{p}.self_attn.{proj}.weight", shape, dtype=dtype)
        _norm(out, seed, f"{p}.post_attention_layernorm.weight", h, dtype)
        if source_format(fmt).synth.tree == "gpt-oss":
            out[f"{p}.mlp.router.weight"] = dense(seed, f"{p}.mlp.router.weight", (d.experts, h), dtype=dtype)
            out[f"{p}.mlp.router.bias"] = dense(seed, f"{p}.mlp.router.bias", (d.experts,), dtype=dtype)
        else:
            out[f"{p}.mlp.gate.weight"] = dense(seed, f"{p}.mlp.gate.weight", (d.experts, h), dtype=dtype)
            for proj, shape in (("gate_proj", (d.intermediate, h)), ("up_proj", (d.intermediate, h)),
                                ("down_proj", (h, d.intermediate))):
                name = f"{p}.mlp.shared_experts.{proj}.weight"
                out[name] = dense(seed, name, shape, dtype=dtype)
        out.update(encode_layer_experts(fmt, seed, str(i), experts=d.experts, hidden=h, inter=d.intermediate,
                                        tweaks=tweaks, dtype=dtype))
    _norm(out, seed, "model.norm.weight", h, dtype)
    out["lm_head.weight"] = dense(seed, "lm_head.weight", (d.vocab, h), dtype=dtype)
    return out


def build_tensors(fmt: str, seed: int, dims: Dims, tweaks: Tweaks,
                  dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """name -> tensor for the whole checkpoint, in file order (embed, layers, final norm, head, MTP)."""
    if source_format(fmt).synth.tree == "deepseek-v4":
        return _dsv4_tree(fmt, seed, dims, tweaks, dtype)
    return _hf_tree(fmt, seed, dims, tweaks, dtype)
