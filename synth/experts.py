"""Routed-expert tensors for `synth`, per source format: where each projection lives (`ExpertSlot`)
and how a layer's float matrices become that format's tensors (`encode_layer_experts`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..core.checkpoint.dtypes import DTYPES
from ..core.checkpoint.tensor_model import Quant, Role
from ..core.sources.naming import SCHEMES, Scheme, expert_key
from ..core.sources.source_formats import SourceFormat, source_format
from ..formats.constants import E2M1_MAX, E4M3_MAX
from ..formats.mxfp4 import quantize_mxfp4
from ..formats.nvfp4 import global_to_ct, nvfp4_global_for, quantize_nvfp4
from .seeded import expert_matrix, generator_for

__all__ = [
    "ROLES",
    "ExpertSlot",
    "Tweaks",
    "encode_layer_experts",
    "expert_quant",
    "layer_format",
    "expert_slot",
    "gptoss_interleave",
]

ROLES = ("gate", "up", "down")  # DeepSeek w1, w3, w2; HF gate_proj, up_proj, down_proj
_DS_PROJ = {"gate": "w1", "up": "w3", "down": "w2"}
_HF_SCHEME = next(s for s in SCHEMES if s.name == "hf-mlp")


@dataclass(frozen=True, slots=True)
class ExpertSlot:
    """Where one expert projection is stored. For gpt-oss the tensors are stacked per layer and
    `index` = (expert, first row, row step) selects the projection: gate rows 0::2, up rows 1::2."""
    layer: str
    expert: int
    role: str
    weight: str
    scale: str
    global_scale: str | None = None
    input_scale: str | None = None
    index: tuple[int, int, int] | None = None


@dataclass(frozen=True, slots=True)
class Tweaks:
    """Generation-time defects: (layer, expert) pairs to drop, to zero, or to give gate and up
    their own NVFP4 global instead of the shared one."""
    missing: frozenset = field(default_factory=frozenset)
    zero: frozenset = field(default_factory=frozenset)
    own_globals: frozenset = field(default_factory=frozenset)


def layer_format(fmt: str, layer: str) -> SourceFormat:
    """The table row whose tensors `layer`'s experts are written in: the format's own, or for "mtp.*" layers
    its `mtp_format` (ModelOpt keeps DeepSeek-V4's MTP experts MXFP4)."""
    row = source_format(fmt)
    if row.synth.mtp_format and layer.startswith("mtp."):
        return source_format(row.synth.mtp_format)
    return row


def expert_quant(fmt: str, layer: str) -> str:
    """"nvfp4" or "mxfp4" for the routed experts of `layer`."""
    return layer_format(fmt, layer).trunk.value


def _order(fmt: str) -> tuple[str, ...]:
    """Projection file order: DeepSeek-V4's own checkpoints write w1, w2, w3."""
    return ("gate", "down", "up") if source_format(fmt).synth.tree == "deepseek-v4" else ROLES


def expert_slot(fmt: str, layer: str, expert: int, role: str, scheme: Scheme | None = None) -> ExpertSlot:
    """Where `fmt` keeps one projection; `scheme` (a per-expert naming scheme of core/sources/naming.py) names it
    for a model family, else the format's default names are used."""
    tree = source_format(fmt).synth.tree
    if tree == "gpt-oss":
        base = f"model.layers.{layer}.mlp.experts."
        if role == "down":
            return ExpertSlot(layer, expert, role, base + "down_proj_blocks", base + "down_proj_scales",
                              index=(expert, 0, 1))
        return ExpertSlot(layer, expert, role, base + "gate_up_proj_blocks", base + "gate_up_proj_scales",
                          index=(expert, 0 if role == "gate" else 1, 2))
    if tree == "deepseek-v4":
        lp = layer if layer.startswith("mtp.") else f"layers.{layer}"
        prefix = f"{lp}.ffn.experts.{expert}.{_DS_PROJ[role]}"
    else:
        prefix = expert_key(scheme or _HF_SCHEME, layer, expert, Role(role))
    x = layer_format(fmt, layer).suffixes
    w, s, g, i = (f"{prefix}.{x}" if x else None for x in (x.weight, x.scale, x.global_scale, x.input_scale))
    return ExpertSlot(layer, expert, role, w, s, g, i)


def _matrices(seed: int, layer: str, expert: int, hidden: int, inter: int, zero: bool,
              dtype: torch.dtype) -> dict[str, torch.Tensor]:
    shapes = {"gate": (inter, hidden), "up": (inter, hidden), "down": (hidden, inter)}
    if zero:
        return {r: torch.zeros(shapes[r]) for r in ROLES}
    return {r: expert_matrix(seed, layer, expert, r, *shapes[r], dtype=dtype) for r in ROLES}


def _input_scale(seed: int, layer: str, expert: int) -> torch.Tensor:
    """ModelOpt input_scale = activation amax / (6 * 448), with a random amax in [1, 16)."""
    amax = 1.0 + 15.0 * torch.rand((), generator=generator_for(seed, f"act/{layer}/{expert}"))
    return (amax / (E2M1_MAX * E4M3_MAX)).float()


def _stored(t: torch.Tensor, dtype: str) -> torch.Tensor:
    """The codec's bytes as the format stores them (DeepSeek: I8 codes, F8_E8M0 scales)."""
    return t.view(getattr(torch, DTYPES[dtype][1]))


def _encode_expert(fmt: str, row: SourceFormat, slots: dict[str, ExpertSlot], mats: dict[str, torch.Tensor],
                   input_scale: torch.Tensor, own_globals: bool) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    if row.trunk is Quant.MXFP4:
        for role in _order(fmt):
            packed, scale = quantize_mxfp4(mats[role])
            slot = slots[role]
            out[slot.weight], out[slot.scale] = _stored(packed, row.weight_dtype), _stored(scale, row.scale_dtype)
        return out
    shared = nvfp4_global_for(max(mats["gate"].abs().max().item(), mats["up"].abs().max().item()))
    for role in _order(fmt):
        g = None if role == "down" or own_globals else shared
        packed, scale, g = quantize_nvfp4(mats[role], g)
        slot = slots[role]
        out[slot.weight], out[slot.scale] = packed, scale
        if row.global_rule.reciprocal:
            out[slot.global_scale] = global_to_ct(g)
            out[slot.input_scale] = (1.0 / input_scale).reshape(1)
        else:
            out[slot.global_scale] = g.reshape(())
            out[slot.input_scale] = input_scale.clone().reshape(())
    return out


def gptoss_interleave(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """[I, ...] gate and up -> [2I, ...] with row 2i = gate row i and row 2i+1 = up row i."""
    return torch.stack((gate, up), dim=1).reshape(gate.shape[0] * 2, *gate.shape[1:])


def _encode_gptoss(seed: int, layer: str, experts: int, hidden: int, inter: int, tweaks: Tweaks,
                   dtype: torch.dtype) -> dict[str, torch.Tensor]:
    gu_blocks, gu_scales, d_blocks, d_scales = [], [], [], []
    for e in range(experts):
        mats = _matrices(seed, layer, e, hidden, inter, (layer, e) in tweaks.zero, dtype)
        (gp, gs), (up, us), (dp, ds) = (quantize_mxfp4(mats[r]) for r in ("gate", "up", "down"))
        gu_blocks.append(gptoss_interleave(gp, up).reshape(2 * inter, hidden // 32, 16))
        gu_scales.append(gptoss_interleave(gs, us))
        d_blocks.append(dp.reshape(hidden, inter // 32, 16))
        d_scales.append(ds)
    base = f"model.layers.{layer}.mlp.experts."
    g = generator_for(seed, f"{base}bias")
    return {
        base + "gate_up_proj_blocks": torch.stack(gu_blocks),
        base + "gate_up_proj_scales": torch.stack(gu_scales),
        base + "gate_up_proj_bias": (torch.randn((experts, 2 * inter), generator=g) * 0.01).to(dtype),
        base + "down_proj_blocks": torch.stack(d_blocks),
        base + "down_proj_scales": torch.stack(d_scales),
        base + "down_proj_bias": (torch.randn((experts, hidden), generator=g) * 0.01).to(dtype),
    }


def encode_layer_experts(fmt: str, seed: int, layer: str, *, experts: int, hidden: int, inter: int,
                         tweaks: Tweaks, dtype: torch.dtype = torch.bfloat16,
                         scheme: Scheme | None = None) -> dict[str, torch.Tensor]:
    """All routed-expert tensors of one layer, in file order (expert by expert, or stacked for gpt-oss)."""
    if source_format(fmt).synth.tree == "gpt-oss":
        return _encode_gptoss(seed, layer, experts, hidden, inter, tweaks, dtype)
    row = layer_format(fmt, layer)
    out: dict[str, torch.Tensor] = {}
    for e in range(experts):
        if (layer, e) in tweaks.missing:
            continue
        slots = {r: expert_slot(fmt, layer, e, r, scheme) for r in ROLES}
        mats = _matrices(seed, layer, e, hidden, inter, (layer, e) in tweaks.zero, dtype)
        out.update(_encode_expert(fmt, row, slots, mats, _input_scale(seed, layer, e),
                                  (layer, e) in tweaks.own_globals))
    return out
