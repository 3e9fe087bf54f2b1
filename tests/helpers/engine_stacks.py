"""Whole dense linears and MoE expert stacks, composed from formats/marlin/projection.py the way each engine's
`process_weights_after_loading` composes its steps: tile padding, one rescale factor per stacked
tensor, the gate's global for w13. The converter works one projection at a time and never needs
these; they exist so the golden cases (tests/golden/, made by the engines' own code) pin the
per-projection codecs on exactly the inputs the engines see. Test reference code, not production.
"""

import torch

from dsv4_convert.core.targets.target import MarlinTarget
from dsv4_convert.formats.constants import MXFP4_GROUP, NVFP4_GROUP
from dsv4_convert.formats.e4m3 import as_e4m3
from dsv4_convert.formats.e8m0 import as_e8m0_bytes
from dsv4_convert.formats.marlin import _pad_last2, mxfp4_to_marlin, nvfp4_to_marlin
from dsv4_convert.formats.marlin.scales import nvfp4_global_to_marlin, vllm_rescale_factor
from dsv4_convert.formats.tiles import padded_dense_nk

__all__ = ["mxfp4_dense_to_marlin", "mxfp4_moe_to_marlin", "nvfp4_dense_to_marlin", "nvfp4_moe_to_marlin"]


def nvfp4_dense_to_marlin(weight, scale, scale_2, *, target: MarlinTarget) -> dict[str, torch.Tensor]:
    """One dense NVFP4 linear as the engines prepare it: tile padding, one rescale factor, the max
    global over fused partitions; the global is 0-d for vllm and shape [1] for sglang."""
    n, k = weight.shape[-2], weight.shape[-1] * 2
    n_pad, k_pad = padded_dense_nk(n, k, NVFP4_GROUP)
    sf = vllm_rescale_factor(scale, target.act_dtype) if target.engine == "vllm" else 1.0
    q, s = nvfp4_to_marlin(weight, scale, target=target, sf=sf, n_pad=n_pad, k_pad=k_pad)
    g = nvfp4_global_to_marlin(scale_2.float().max(), fp32_global=target.fp32_global, act_dtype=target.act_dtype, sf=sf)
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
                        i_pad: int | None = None, sf: tuple[float, float] | None = None) -> dict[str, torch.Tensor]:
    """Stacked experts, as the engines prepare them: w13 [E, 2I, H/2] (gate rows then up rows), w2
    [E, H, I/2], globals [E, 2] (gate, up) / [E]. Only the gate's global is kept for w13 (both
    engines do this). One vllm rescale factor per stack (or `sf` = (w13, w2) given: a rank's slice
    encoded with the whole stack's factors, as a --tp conversion writes it). Returns the engine's
    final tensors."""
    i, h = w13.shape[-2] // 2, w2.shape[-2]
    i_pad = i_pad or i
    sf13 = vllm_rescale_factor(w13_scale, target.act_dtype) if target.engine == "vllm" else 1.0
    sf2 = vllm_rescale_factor(w2_scale, target.act_dtype) if target.engine == "vllm" else 1.0
    if sf is not None:
        sf13, sf2 = sf
    q13, s13 = nvfp4_to_marlin(_pad_halves(w13.view(torch.uint8), i, i_pad),
                               _pad_halves(as_e4m3(w13_scale), i, i_pad), target=target, sf=sf13)
    q2, s2 = nvfp4_to_marlin(w2, w2_scale, target=target, sf=sf2, n_pad=h, k_pad=i_pad)
    g13 = w13_scale_2[:, 0] if w13_scale_2.dim() == 2 else w13_scale_2
    return {
        "w13_weight": q13, "w13_weight_scale": s13,
        "w13_weight_scale_2": nvfp4_global_to_marlin(g13, fp32_global=target.fp32_global, act_dtype=target.act_dtype, sf=sf13),
        "w2_weight": q2, "w2_weight_scale": s2,
        "w2_weight_scale_2": nvfp4_global_to_marlin(w2_scale_2, fp32_global=target.fp32_global, act_dtype=target.act_dtype, sf=sf2),
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
