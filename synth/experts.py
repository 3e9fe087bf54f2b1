"""Routed-expert tensors for `synth`, per source format: where each projection lives (`ExpertSlot`)
and how a layer's float matrices become that format's tensors (`encode_layer_experts`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..core.naming import SCHEMES, Scheme, expert_key
from ..core.tensor_model import Role
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
    "expert_slot",
    "gptoss_interleave",
]

ROLES = ("gate", "up", "down")  # DeepSeek w1, w3, w2; HF gate_proj, up_proj, down_proj
_DS_PROJ = {"gate": "w1", "up": "w3", "down": "w2"}
_HF_SCHEME = next(s for s in SCHEMES if s.name == "hf-mlp")
# per format: (weight suffix, block-scale suffix, global suffix, input-scale suffix)
_SUFFIXES = {
    "mxfp4-dsv4": ("weight", "scale", None, None),
    "nvfp4-modelopt-dsv4": ("weight", "weight_scale", "weight_scale_2", "input_scale"),
    "nvfp4-modelopt-hf": ("weight", "weight_scale", "weight_scale_2", "input_scale"),
    "nvfp4-ct": ("weight_packed", "weight_scale", "weight_global_scale", "input_global_scale"),
    "mxfp4-ct": ("weight_packed", "weight_scale", None, None),
}


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


def expert_quant(fmt: str, layer: str) -> str:
    """"nvfp4" or "mxfp4" for the routed experts of `layer` ("mtp.*" stays MXFP4 in ModelOpt DSV4)."""
    if fmt == "nvfp4-modelopt-dsv4" and layer.startswith("mtp."):
        return "mxfp4"
    return "nvfp4" if fmt.startswith("nvfp4") else "mxfp4"


def expert_slot(fmt: str, layer: str, expert: int, role: str, scheme: Scheme | None = None) -> ExpertSlot:
    """Where `fmt` keeps one projection; `scheme` (a per-expert naming scheme of core/naming.py) names it
    for a model family, else the format's default names are used."""
    if fmt == "mxfp4-gptoss":
        base = f"model.layers.{layer}.mlp.experts."
        if role == "down":
            return ExpertSlot(layer, expert, role, base + "down_proj_blocks", base + "down_proj_scales",
                              index=(expert, 0, 1))
        return ExpertSlot(layer, expert, role, base + "gate_up_proj_blocks", base + "gate_up_proj_scales",
                          index=(expert, 0 if role == "gate" else 1, 2))
    if fmt in ("mxfp4-dsv4", "nvfp4-modelopt-dsv4"):
        lp = layer if layer.startswith("mtp.") else f"layers.{layer}"
        prefix = f"{lp}.ffn.experts.{expert}.{_DS_PROJ[role]}"
        suffixes = _SUFFIXES["mxfp4-dsv4" if expert_quant(fmt, layer) == "mxfp4" else fmt]
    else:
        prefix = expert_key(scheme or _HF_SCHEME, layer, expert, Role(role))
        suffixes = _SUFFIXES[fmt]
    w, s, g, i = (f"{prefix}.{x}" if x else None for x in suffixes)
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


def _encode_expert(fmt: str, quant: str, slots: dict[str, ExpertSlot], mats: dict[str, torch.Tensor],
                   input_scale: torch.Tensor, own_globals: bool) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    if quant == "mxfp4":
        for role in ("gate", "down", "up") if fmt.endswith("dsv4") else ROLES:
            packed, scale = quantize_mxfp4(mats[role])
            slot = slots[role]
            if fmt == "mxfp4-ct":
                out[slot.weight], out[slot.scale] = packed, scale
            else:
                out[slot.weight], out[slot.scale] = packed.view(torch.int8), scale.view(torch.float8_e8m0fnu)
        return out
    shared = nvfp4_global_for(max(mats["gate"].abs().max().item(), mats["up"].abs().max().item()))
    for role in ("gate", "down", "up") if fmt.endswith("dsv4") else ROLES:
        g = None if role == "down" or own_globals else shared
        packed, scale, g = quantize_nvfp4(mats[role], g)
        slot = slots[role]
        out[slot.weight], out[slot.scale] = packed, scale
        if fmt == "nvfp4-ct":
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
    if fmt == "mxfp4-gptoss":
        return _encode_gptoss(seed, layer, experts, hidden, inter, tweaks, dtype)
    quant = expert_quant(fmt, layer)
    out: dict[str, torch.Tensor] = {}
    for e in range(experts):
        if (layer, e) in tweaks.missing:
            continue
        slots = {r: expert_slot(fmt, layer, e, r, scheme) for r in ROLES}
        mats = _matrices(seed, layer, e, hidden, inter, (layer, e) in tweaks.zero, dtype)
        out.update(_encode_expert(fmt, quant, slots, mats, _input_scale(seed, layer, e),
                                  (layer, e) in tweaks.own_globals))
    return out
