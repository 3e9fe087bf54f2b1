"""E8M0 (UE8M0) scale bytes: byte e means 2**(e - 127); 0xFF is NaN."""

import torch

from .constants import E8M0_BIAS, E8M0_NAN

__all__ = ["e8m0_to_float", "exponent_to_e8m0", "as_e8m0_bytes"]


def as_e8m0_bytes(scale: torch.Tensor) -> torch.Tensor:
    """View an E8M0 scale tensor (float8_e8m0fnu, uint8 or int8) as its raw bytes, never converting."""
    if scale.dtype not in (torch.float8_e8m0fnu, torch.uint8, torch.int8):
        raise ValueError(f"E8M0 scales must be float8_e8m0fnu or uint8 bytes, got {scale.dtype}")
    return scale.view(torch.uint8)


def e8m0_to_float(scale: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes -> float32 2**(e-127); 0xFF -> NaN. Byte 0 is 2**-127 (a float32 subnormal)."""
    b = as_e8m0_bytes(scale)
    out = torch.ldexp(torch.ones(b.shape, dtype=torch.float64), b.to(torch.int32) - E8M0_BIAS).float()
    return torch.where(b == E8M0_NAN, torch.full_like(out, float("nan")), out)


def exponent_to_e8m0(exponent: torch.Tensor) -> torch.Tensor:
    """Integer exponents e (value 2**e) -> E8M0 bytes. Raises if e is outside [-127, 127]."""
    e = exponent.to(torch.int32) + E8M0_BIAS
    if ((e < 0) | (e > 254)).any():
        raise ValueError("exponent_to_e8m0: exponent outside the E8M0 range [-127, 127]")
    return e.to(torch.uint8)
