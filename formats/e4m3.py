"""FP8-E4M3 block scales and Marlin's S0E5M3 re-encoding of them (docs/spec/MARLIN_FP4.md §3.3).

S0E5M3 byte = bits 14..7 of the fp16 pattern of (scale x 128): a 5-bit exponent and 3 mantissa
bits with the sign dropped. The kernel rebuilds the half as byte << 7. The bytes are stored in a
float8_e4m3fn tensor but are not E4M3 values.
"""

import torch

from .constants import E4M3_NAN_BITS

__all__ = ["as_e4m3", "e4m3_is_nan", "e4m3_to_float", "half_to_s0e5m3", "s0e5m3_to_half"]

def e4m3_is_nan(b):
    """Mask of the NaN bytes of E4M3 data viewed as uint8 (numpy array or torch tensor)."""
    return (b & E4M3_NAN_BITS) == E4M3_NAN_BITS


def as_e4m3(scale: torch.Tensor) -> torch.Tensor:
    """View E4M3 scale bytes (float8_e4m3fn or uint8) as float8_e4m3fn, never converting values."""
    if scale.dtype == torch.float8_e4m3fn:
        return scale
    if scale.dtype in (torch.uint8, torch.int8):
        return scale.view(torch.float8_e4m3fn)
    raise ValueError(f"NVFP4 block scales must be float8_e4m3fn (or raw uint8 bytes), got {scale.dtype}")


def e4m3_to_float(scale: torch.Tensor) -> torch.Tensor:
    return as_e4m3(scale).float()


def half_to_s0e5m3(v: torch.Tensor) -> torch.Tensor:
    """fp16 values (already x128, >= 0 expected) -> uint8 S0E5M3 bytes. The sign bit is dropped and
    the 7 low mantissa bits are truncated, which is exact for x128-scaled E4M3 values."""
    if v.dtype != torch.float16:
        raise ValueError(f"half_to_s0e5m3 expects float16, got {v.dtype}")
    bits = v.view(torch.int16).to(torch.int32) & 0x7FFF
    return (bits >> 7).to(torch.uint8)


def s0e5m3_to_half(b: torch.Tensor) -> torch.Tensor:
    """uint8 S0E5M3 bytes -> the fp16 value the kernel's fp16 path sees (byte << 7)."""
    bits = (b.view(torch.uint8).to(torch.int32) << 7).to(torch.int16)
    return bits.view(torch.float16)
