"""MXFP4 (OCP MX): E2M1 codes with one E8M0 scale per 32 values along K; no global scale."""

import torch

from .constants import E2M1_MAX, E8M0_BIAS, MXFP4_GROUP
from .e2m1 import e2m1_to_float, float_to_e2m1, pack_nibbles, unpack_nibbles
from .e8m0 import e8m0_to_float, exponent_to_e8m0

__all__ = ["quantize_mxfp4", "dequantize_mxfp4"]


def quantize_mxfp4(w: torch.Tensor):
    """float [..., N, K] -> (packed uint8 [..., N, K/2], E8M0 bytes uint8 [..., N, K/32]).

    The block exponent is ceil(log2(amax / 6)), so no value in a block is clipped; all-zero blocks
    get byte 127 (scale 1.0)."""
    if w.shape[-1] % MXFP4_GROUP:
        raise ValueError(f"MXFP4 needs K to be a multiple of {MXFP4_GROUP}, got K={w.shape[-1]}")
    blocks = w.float().reshape(*w.shape[:-1], -1, MXFP4_GROUP)
    ratio = blocks.abs().amax(dim=-1) / E2M1_MAX
    mantissa, exponent = torch.frexp(ratio)  # ratio = mantissa * 2**exponent, mantissa in [0.5, 1)
    exponent = torch.where(mantissa == 0.5, exponent - 1, exponent)  # exact powers of two
    exponent = torch.where(ratio == 0, torch.zeros_like(exponent), exponent).clamp(-E8M0_BIAS, E8M0_BIAS)
    scale = exponent_to_e8m0(exponent)
    codes = float_to_e2m1(blocks / e8m0_to_float(scale).unsqueeze(-1))
    return pack_nibbles(codes.reshape(w.shape)), scale


def dequantize_mxfp4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(packed [..., N, K/2], E8M0 [..., N, K/32]) -> float32 [..., N, K]; 0xFF scales give NaN."""
    values = e2m1_to_float(unpack_nibbles(packed))
    k = values.shape[-1]
    if scale.shape[-1] * MXFP4_GROUP != k:
        raise ValueError(f"MXFP4 scale has {scale.shape[-1]} groups, expected K/32 = {k // MXFP4_GROUP}")
    blocks = values.reshape(*values.shape[:-1], -1, MXFP4_GROUP) * e8m0_to_float(scale).unsqueeze(-1)
    return blocks.reshape(values.shape)
