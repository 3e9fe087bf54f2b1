"""NVFP4: E2M1 codes, one E4M3 scale per 16 values along K, one FP32 global scale.

value = e2m1(code) * e4m3(block_scale) * global, with `global` in the ModelOpt convention
(`weight_scale_2`, a multiplier). compressed-tensors stores the reciprocal (`weight_global_scale`).
"""

import torch

from .constants import E2M1_MAX, E4M3_MAX, NVFP4_GROUP
from .e2m1 import e2m1_to_float, float_to_e2m1, pack_nibbles, unpack_nibbles
from .e4m3 import as_e4m3

__all__ = ["quantize_nvfp4", "dequantize_nvfp4", "global_from_ct", "global_to_ct", "nvfp4_global_for"]

_E4M3_MIN_SCALE = 2.0**-9  # ModelOpt clamps block scales to [2**-9, 448] before the E4M3 cast


def nvfp4_global_for(amax: float) -> torch.Tensor:
    """ModelOpt's global scale for a tensor whose absolute maximum is `amax`: amax / (6 * 448)."""
    value = float(amax) / (E2M1_MAX * E4M3_MAX) if amax > 0 else 1.0
    return torch.tensor(value, dtype=torch.float32)


def quantize_nvfp4(w: torch.Tensor, global_scale: torch.Tensor | None = None):
    """float [..., N, K] -> (packed uint8 [..., N, K/2], block scales float8_e4m3fn [..., N, K/16],
    global float32 0-d). Pass `global_scale` to share one global across tensors (gate and up)."""
    if w.shape[-1] % NVFP4_GROUP:
        raise ValueError(f"NVFP4 needs K to be a multiple of {NVFP4_GROUP}, got K={w.shape[-1]}")
    w = w.float()
    g = nvfp4_global_for(w.abs().max().item()) if global_scale is None else global_scale.float().reshape(())
    if not (torch.isfinite(g) and g > 0):
        raise ValueError(f"NVFP4 global scale must be finite and > 0, got {g.item()}")
    blocks = w.reshape(*w.shape[:-1], -1, NVFP4_GROUP)
    block_amax = blocks.abs().amax(dim=-1)
    scale = (block_amax / (E2M1_MAX * g)).clamp(_E4M3_MIN_SCALE, E4M3_MAX)
    scale = torch.where(block_amax == 0, torch.ones_like(scale), scale).to(torch.float8_e4m3fn)
    codes = float_to_e2m1(blocks / (scale.float().unsqueeze(-1) * g))
    return pack_nibbles(codes.reshape(w.shape)), scale, g.clone()


def dequantize_nvfp4(packed: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """(packed [..., N, K/2], e4m3 [..., N, K/16], global) -> float32 [..., N, K]."""
    values = e2m1_to_float(unpack_nibbles(packed))
    k = values.shape[-1]
    if scale.shape[-1] * NVFP4_GROUP != k:
        raise ValueError(f"NVFP4 scale has {scale.shape[-1]} groups, expected K/16 = {k // NVFP4_GROUP}")
    blocks = values.reshape(*values.shape[:-1], -1, NVFP4_GROUP) * as_e4m3(scale).float().unsqueeze(-1)
    g = global_scale.float()
    return blocks.reshape(values.shape) * g.reshape(g.shape + (1,) * (values.dim() - g.dim()))


def global_from_ct(ct_global: torch.Tensor) -> torch.Tensor:
    """compressed-tensors `weight_global_scale` (a divisor) -> ModelOpt multiplier, computed in fp32 as
    vLLM's compressed-tensors scheme does (1 / max over fused partitions)."""
    return (1.0 / ct_global.float().max()).reshape(())


def global_to_ct(global_scale: torch.Tensor) -> torch.Tensor:
    return (1.0 / global_scale.float()).reshape(1)
