"""One FP4 projection (or a stack of them) <-> Marlin W4A16 / W4A8 tensors, for a given target (a
core.target.MarlinTarget: the codecs read its fields and never import the engine table).

This composes weight and scales into what an engine's `process_weights_after_loading`
produces, and its inverse. Targets (docs/spec/MARLIN_FP4.md §8-9):
  vllm   -> layout `vllm-L4`  (vLLM >= 0.20, checked against 0.33.0): fp32 global, rescale + clamp
  sglang -> layout `sglang-L2` (SGLang 0.5.23): global in the activation dtype, no rescale, no clamp
"""

import torch
import torch.nn.functional as F

from ..constants import MXFP4_GROUP, NVFP4_GROUP
from ..e4m3 import as_e4m3
from ..e8m0 import as_e8m0_bytes
from .scales import (
    marlin_to_mxfp4_scales,
    mxfp4_scales_to_marlin,
    nvfp4_scales_to_marlin,
    permute_scale_columns,
    s0e5m3_to_nvfp4_scales,
    unpermute_scale_columns,
)
from .weight import from_marlin_weight, to_marlin_weight

__all__ = [
    "nvfp4_to_marlin", "marlin_to_nvfp4", "mxfp4_to_marlin",
    "marlin_to_mxfp4",
]



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


def nvfp4_source_for(weight, scale, *, target, n_pad=None, k_pad=None):
    """The refusals and padding before any NVFP4 -> Marlin transform (CPU codecs and formats/marlin/torch_route.py)."""
    if target.w4a8:
        raise ValueError("NVFP4 has no W4A8 Marlin variant (vLLM raises for it); drop --w4a8")
    _check_source(weight, scale, NVFP4_GROUP, "NVFP4")
    return _pad_source(weight, as_e4m3(scale), NVFP4_GROUP, n_pad, k_pad)


def mxfp4_source_for(weight, scale, *, target, n_pad=None, k_pad=None):
    """The refusals and padding before any MXFP4 -> Marlin transform (padded packed bytes, E8M0 bytes)."""
    if problem := target.mxfp4_problem:
        raise ValueError(problem)
    _check_source(weight, scale, MXFP4_GROUP, "MXFP4")
    return _pad_source(weight, as_e8m0_bytes(scale), MXFP4_GROUP, n_pad, k_pad)


def nvfp4_to_marlin(weight, scale, *, target, sf: float = 1.0, n_pad=None, k_pad=None, threads=None):
    """(packed [..., N, K/2], e4m3 [..., N, K/16]) -> (int32 [..., Kp/16, 2Np], S0E5M3 bytes as
    float8_e4m3fn [..., Kp/16, Np]). `sf` is the vllm rescale factor of the whole stack (1 otherwise);
    `threads`: the weight repack's (to_marlin_weight)."""
    weight, scale = nvfp4_source_for(weight, scale, target=target, n_pad=n_pad, k_pad=k_pad)
    qweight = to_marlin_weight(weight, threads=threads)
    return qweight, nvfp4_scales_to_marlin(scale, clamp=target.clamps_scales, sf=sf).view(torch.float8_e4m3fn)


def marlin_to_nvfp4(qweight, mscale, *, target, n: int, k: int, sf: float = 1.0):
    """Inverse of nvfp4_to_marlin, cropped to the logical [n, k]. Returns (packed, e4m3 scales);
    scales the target clamped or made positive come back as 0 / |s|: compare bytes to find them."""
    packed = from_marlin_weight(qweight)[..., :n, : k // 2]
    s = unpermute_scale_columns(mscale.view(torch.uint8))
    scale = s0e5m3_to_nvfp4_scales(s, sf=sf).transpose(-1, -2)[..., :n, : k // NVFP4_GROUP]
    return packed.contiguous(), scale.contiguous()


def mxfp4_to_marlin(weight, scale, *, target, n_pad=None, k_pad=None, threads=None):
    """(packed [..., N, K/2], E8M0 [..., N, K/32]) -> (int32 [..., Kp/16, 2Np], float8_e8m0fnu [..., Kp/32, Np])."""
    weight, scale = mxfp4_source_for(weight, scale, target=target, n_pad=n_pad, k_pad=k_pad)
    qweight = to_marlin_weight(weight, w4a8=target.w4a8, threads=threads)
    s = mxfp4_scales_to_marlin(scale.transpose(-1, -2), w4a8=target.w4a8)
    return qweight, permute_scale_columns(s, w4a8=target.w4a8).view(torch.float8_e8m0fnu)


def marlin_to_mxfp4(qweight, mscale, *, target, n: int, k: int):
    packed = from_marlin_weight(qweight, w4a8=target.w4a8)[..., :n, : k // 2]
    s = unpermute_scale_columns(as_e8m0_bytes(mscale), w4a8=target.w4a8)
    scale = marlin_to_mxfp4_scales(s, w4a8=target.w4a8).transpose(-1, -2)[..., :n, : k // MXFP4_GROUP]
    return packed.contiguous(), scale.contiguous().view(torch.float8_e8m0fnu)
