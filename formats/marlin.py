"""One FP4 projection (or a stack of them) <-> Marlin W4A16 / W4A8 tensors, for a given target.

This composes marlin_weight and marlin_scales into what an engine's `process_weights_after_loading`
produces, and its inverse. Targets (spec MARLIN_FP4.md §8-9):
  vllm   -> layout `vllm-L4`  (vLLM >= 0.20, checked against 0.33.0): fp32 global, rescale + clamp
  sglang -> layout `sglang-L2` (SGLang 0.5.23): global in the activation dtype, no rescale, no clamp
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dsv4_convert.core.engines import ACT_DTYPES, ENGINES, MXFP4_NEEDS_BF16, engine_facts, mxfp4_dtype_problem
from dsv4_convert.formats.constants import MXFP4_GROUP, NVFP4_GROUP
from dsv4_convert.formats.e4m3 import as_e4m3
from dsv4_convert.formats.e8m0 import as_e8m0_bytes
from dsv4_convert.formats.marlin_scales import (
    marlin_to_mxfp4_scales,
    mxfp4_scales_to_marlin,
    nvfp4_global_to_marlin,
    nvfp4_scales_to_s0e5m3,
    permute_scale_columns,
    s0e5m3_to_nvfp4_scales,
    unpermute_scale_columns,
    vllm_rescale_factor,
)
from dsv4_convert.formats.marlin_weight import from_marlin_weight, to_marlin_weight
from dsv4_convert.formats.tiles import padded_dense_nk, padded_moe_intermediate

__all__ = [
    "ENGINES", "ACT_DTYPES", "MarlinTarget", "padded_dense_nk", "padded_moe_intermediate",
    "nvfp4_to_marlin", "marlin_to_nvfp4", "mxfp4_to_marlin", "marlin_to_mxfp4",
    "nvfp4_dense_to_marlin", "mxfp4_dense_to_marlin", "nvfp4_moe_to_marlin", "mxfp4_moe_to_marlin",
]



@dataclass(frozen=True, slots=True)
class MarlinTarget:
    engine: str = "sglang"
    act_dtype: str = "bfloat16"
    w4a8: bool = False

    def __post_init__(self):
        engine_facts(self.engine)  # raises for an unknown engine
        if self.act_dtype not in ACT_DTYPES:
            raise ValueError(f"unknown activation dtype {self.act_dtype!r}; choose one of {ACT_DTYPES}")
        if self.w4a8 and not ENGINES[self.engine].w4a8:
            raise ValueError("W4A8 (fp8 activations) exists only in vLLM's Marlin; use engine='vllm'")

    @property
    def layout_tag(self) -> str:
        return ENGINES[self.engine].layout_tag

    @property
    def engine_version(self) -> str:
        return ENGINES[self.engine].version


def _pad_last2(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    r, c = t.shape[-2:]
    if (r, c) == (rows, cols):
        return t
    if rows < r or cols < c:
        raise ValueError(f"cannot pad [{r}, {c}] down to [{rows}, {cols}]")
    return F.pad(t.view(torch.uint8), (0, cols - c, 0, rows - r)).view(t.dtype)


def _check_source(weight: torch.Tensor, scale: torch.Tensor, group: int, fmt: str) -> None:
    """The packed weight and its block scales must agree before anything is padded or permuted."""
    if weight.dtype not in (torch.uint8, torch.int8):
        raise ValueError(f"{fmt} weight must be packed FP4 bytes (uint8 or int8), got {weight.dtype}")
    if weight.dim() < 2:
        raise ValueError(f"{fmt} weight must be [..., N, K/2], got shape {list(weight.shape)}")
    k = weight.shape[-1] * 2
    if k % group:
        raise ValueError(f"{fmt}: K={k} (weight {list(weight.shape)}) is not a multiple of the group size {group}")
    expected = [*weight.shape[:-1], k // group]
    if list(scale.shape) != expected:
        raise ValueError(f"{fmt} scale has shape {list(scale.shape)}, expected {expected} "
                         f"(weight {list(weight.shape)} -> K={k}, / group {group})")


def _pad_source(weight, scale, group, n_pad, k_pad):
    n, k = weight.shape[-2], weight.shape[-1] * 2
    n_pad, k_pad = n_pad or n, k_pad or k
    return _pad_last2(weight.view(torch.uint8), n_pad, k_pad // 2), _pad_last2(scale, n_pad, k_pad // group)


def nvfp4_source_for(weight, scale, *, target: MarlinTarget, n_pad=None, k_pad=None):
    """The refusals and padding before any NVFP4 -> Marlin transform (CPU codecs and formats/marlin_torch.py)."""
    if target.w4a8:
        raise ValueError("NVFP4 has no W4A8 Marlin variant (vLLM raises for it); drop --w4a8")
    _check_source(weight, scale, NVFP4_GROUP, "NVFP4")
    return _pad_source(weight, as_e4m3(scale), NVFP4_GROUP, n_pad, k_pad)


def mxfp4_source_for(weight, scale, *, target: MarlinTarget, n_pad=None, k_pad=None):
    """The refusals and padding before any MXFP4 -> Marlin transform (padded packed bytes, E8M0 bytes)."""
    if mxfp4_dtype_problem(target.act_dtype):
        raise ValueError(MXFP4_NEEDS_BF16)
    _check_source(weight, scale, MXFP4_GROUP, "MXFP4")
    return _pad_source(weight, as_e8m0_bytes(scale), MXFP4_GROUP, n_pad, k_pad)


def nvfp4_to_marlin(weight, scale, *, target: MarlinTarget, sf: float = 1.0, n_pad=None, k_pad=None):
    """(packed [..., N, K/2], e4m3 [..., N, K/16]) -> (int32 [..., Kp/16, 2Np], S0E5M3 bytes as
    float8_e4m3fn [..., Kp/16, Np]). `sf` is the vllm rescale factor of the whole stack (1 otherwise)."""
    weight, scale = nvfp4_source_for(weight, scale, target=target, n_pad=n_pad, k_pad=k_pad)
    qweight = to_marlin_weight(weight)
    s = nvfp4_scales_to_s0e5m3(scale.transpose(-1, -2), engine=target.engine, sf=sf)
    return qweight, permute_scale_columns(s).view(torch.float8_e4m3fn)


def marlin_to_nvfp4(qweight, mscale, *, target: MarlinTarget, n: int, k: int, sf: float = 1.0):
    """Inverse of nvfp4_to_marlin, cropped to the logical [n, k]. Returns (packed, e4m3 scales);
    scales the target clamped or made positive come back as 0 / |s|: compare bytes to find them."""
    packed = from_marlin_weight(qweight)[..., :n, : k // 2]
    s = unpermute_scale_columns(mscale.view(torch.uint8))
    scale = s0e5m3_to_nvfp4_scales(s, sf=sf).transpose(-1, -2)[..., :n, : k // NVFP4_GROUP]
    return packed.contiguous(), scale.contiguous()


def mxfp4_to_marlin(weight, scale, *, target: MarlinTarget, n_pad=None, k_pad=None):
    """(packed [..., N, K/2], E8M0 [..., N, K/32]) -> (int32 [..., Kp/16, 2Np], float8_e8m0fnu [..., Kp/32, Np])."""
    weight, scale = mxfp4_source_for(weight, scale, target=target, n_pad=n_pad, k_pad=k_pad)
    qweight = to_marlin_weight(weight, w4a8=target.w4a8)
    s = mxfp4_scales_to_marlin(scale.transpose(-1, -2), w4a8=target.w4a8)
    return qweight, permute_scale_columns(s, w4a8=target.w4a8).view(torch.float8_e8m0fnu)


def marlin_to_mxfp4(qweight, mscale, *, target: MarlinTarget, n: int, k: int):
    packed = from_marlin_weight(qweight, w4a8=target.w4a8)[..., :n, : k // 2]
    s = unpermute_scale_columns(as_e8m0_bytes(mscale), w4a8=target.w4a8)
    scale = marlin_to_mxfp4_scales(s, w4a8=target.w4a8).transpose(-1, -2)[..., :n, : k // MXFP4_GROUP]
    return packed.contiguous(), scale.contiguous().view(torch.float8_e8m0fnu)


def nvfp4_dense_to_marlin(weight, scale, scale_2, *, target: MarlinTarget) -> dict[str, torch.Tensor]:
    """One dense NVFP4 linear as the engines prepare it: tile padding, one rescale factor, the max
    global over fused partitions; the global is 0-d for vllm and shape [1] for sglang."""
    n, k = weight.shape[-2], weight.shape[-1] * 2
    n_pad, k_pad = padded_dense_nk(n, k, NVFP4_GROUP)
    sf = vllm_rescale_factor(scale, target.act_dtype) if target.engine == "vllm" else 1.0
    q, s = nvfp4_to_marlin(weight, scale, target=target, sf=sf, n_pad=n_pad, k_pad=k_pad)
    g = nvfp4_global_to_marlin(scale_2.float().max(), engine=target.engine, act_dtype=target.act_dtype, sf=sf)
    return {"weight": q, "weight_scale": s, "weight_global_scale": g if target.engine == "vllm" else g.reshape(1)}


def mxfp4_dense_to_marlin(weight, scale, *, target: MarlinTarget) -> dict[str, torch.Tensor]:
    n_pad, k_pad = padded_dense_nk(weight.shape[-2], weight.shape[-1] * 2, MXFP4_GROUP)
    q, s = mxfp4_to_marlin(weight, scale, target=target, n_pad=n_pad, k_pad=k_pad)
    return {"weight": q, "weight_scale": s}


def _pad_halves(w13, i: int, i_pad: int):
    """Pad the gate rows [0, I) and the up rows [I, 2I) of a w13 stack separately to i_pad each."""
    if i_pad == i:
        return w13
    gate, up = w13[..., :i, :], w13[..., i:, :]
    cols = w13.shape[-1]
    return torch.cat((_pad_last2(gate, i_pad, cols), _pad_last2(up, i_pad, cols)), dim=-2)


def nvfp4_moe_to_marlin(w13, w13_scale, w13_scale_2, w2, w2_scale, w2_scale_2, *, target: MarlinTarget,
                        i_pad: int | None = None) -> dict[str, torch.Tensor]:
    """Stacked experts, as the engines prepare them: w13 [E, 2I, H/2] (gate rows then up rows), w2
    [E, H, I/2], globals [E, 2] (gate, up) / [E]. Only the gate's global is kept for w13 (both
    engines do this). One vllm rescale factor per stack. Returns the engine's final tensors."""
    i, h = w13.shape[-2] // 2, w2.shape[-2]
    i_pad = i_pad or i
    sf13 = vllm_rescale_factor(w13_scale, target.act_dtype) if target.engine == "vllm" else 1.0
    sf2 = vllm_rescale_factor(w2_scale, target.act_dtype) if target.engine == "vllm" else 1.0
    q13, s13 = nvfp4_to_marlin(_pad_halves(w13.view(torch.uint8), i, i_pad),
                               _pad_halves(as_e4m3(w13_scale), i, i_pad), target=target, sf=sf13)
    q2, s2 = nvfp4_to_marlin(w2, w2_scale, target=target, sf=sf2, n_pad=h, k_pad=i_pad)
    g13 = w13_scale_2[:, 0] if w13_scale_2.dim() == 2 else w13_scale_2
    return {
        "w13_weight": q13, "w13_weight_scale": s13,
        "w13_weight_scale_2": nvfp4_global_to_marlin(g13, engine=target.engine, act_dtype=target.act_dtype, sf=sf13),
        "w2_weight": q2, "w2_weight_scale": s2,
        "w2_weight_scale_2": nvfp4_global_to_marlin(w2_scale_2, engine=target.engine, act_dtype=target.act_dtype, sf=sf2),
    }


def mxfp4_moe_to_marlin(w13, w13_scale, w2, w2_scale, *, target: MarlinTarget,
                        i_pad: int | None = None, h_pad: int | None = None) -> dict[str, torch.Tensor]:
    """Stacked MXFP4 experts -> the engine's final Marlin tensors (see nvfp4_moe_to_marlin)."""
    i, h = w13.shape[-2] // 2, w2.shape[-2]
    i_pad, h_pad = i_pad or i, h_pad or h
    w13p = _pad_halves(w13.view(torch.uint8), i, i_pad)
    s13p = _pad_halves(as_e8m0_bytes(w13_scale), i, i_pad)
    q13, s13 = mxfp4_to_marlin(w13p, s13p, target=target, k_pad=h_pad)
    q2, s2 = mxfp4_to_marlin(w2, w2_scale, target=target, n_pad=h_pad, k_pad=i_pad)
    return {"w13_weight": q13, "w13_weight_scale": s13, "w2_weight": q2, "w2_weight_scale": s2}
