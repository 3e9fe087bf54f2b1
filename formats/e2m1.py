"""E2M1 (FP4) codes: value <-> code, and two codes per byte (element 2i in the low nibble)."""

import torch

from .constants import E2M1_VALUES

__all__ = ["pack_nibbles", "unpack_nibbles", "e2m1_to_float", "float_to_e2m1"]

# Midpoints between neighbouring magnitudes; a tie rounds to the even code (mantissa bit 0),
# which alternates down (0.25 -> 0), up (0.75 -> 1.0), down (1.25 -> 1.0), ...
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_TIE_ROUNDS_UP = (False, True, False, True, False, True, False)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [..., K] (values 0..15) -> uint8 [..., K/2], code 2i in bits 0-3, 2i+1 in bits 4-7."""
    if codes.dtype != torch.uint8:
        raise ValueError(f"pack_nibbles expects uint8 codes, got {codes.dtype}")
    if codes.shape[-1] % 2:
        raise ValueError(f"pack_nibbles needs an even last dimension, got {codes.shape[-1]}")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """uint8/int8 [..., K/2] -> uint8 codes [..., K]. int8 input is reinterpreted, never sign-shifted."""
    if packed.dtype not in (torch.uint8, torch.int8):
        raise ValueError(f"unpack_nibbles expects uint8 or int8 bytes, got {packed.dtype}")
    b = packed.view(torch.uint8)
    return torch.stack((b & 0x0F, b >> 4), dim=-1).flatten(-2)


def e2m1_to_float(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes -> float32 values (code 8 is -0.0)."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32)
    return table[codes.long()]


def float_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """float values (already divided by their scale) -> uint8 codes; round to nearest, ties to even,
    magnitudes above 6 saturate to 6. The sign bit follows signbit, so -0.0 gives code 8."""
    if not torch.is_floating_point(x):
        raise ValueError(f"float_to_e2m1 expects a floating tensor, got {x.dtype}")
    x = x.float()
    if torch.isnan(x).any():
        raise ValueError("float_to_e2m1: input contains NaN; E2M1 has no NaN encoding")
    mag = x.abs()
    idx = torch.zeros(x.shape, dtype=torch.uint8)
    for mid, up in zip(_MIDPOINTS, _TIE_ROUNDS_UP):
        idx += ((mag > mid) | ((mag == mid) & up)).to(torch.uint8)
    return idx | (torch.signbit(x).to(torch.uint8) << 3)
