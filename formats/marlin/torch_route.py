"""The Marlin FP4 transforms in plain torch ops, so they run on any device (CUDA for `--device cuda`).

Same layout as formats/marlin/weight.py (docs/spec/MARLIN_FP4.md §2), written from the index rule
instead of the bit-swap schedule: with k = 16*kt + 8*kh + 2*kq + k0 and n = 64*c + 16*t + 8*dn + r,
source code (n, k) lands in int32 word (kt, 128*c + 16*r + 4*kq + t) at nibble 4*k0 + 2*dn + kh.
So the W4A16 weight is one axis permutation of the unpacked codes plus a nibble pack. W4A8 permutes
2-byte units and swaps bytes/nibbles inside each word, as the numpy codec does.
Byte-wise scale rules are taken from formats/marlin/scales.py as 256-entry tables (one home for each
rule) and applied on the device. Results are byte-identical to the CPU codecs (tests compare them).
"""

from __future__ import annotations

import torch

from ..e2m1 import pack_nibbles, unpack_nibbles
from . import mxfp4_source_for, nvfp4_source_for
from .scales import mxfp4_scales_to_marlin, nvfp4_scales_to_s0e5m3, scale_column_perm
from .weight import check_marlin_weight_shape

__all__ = ["to_marlin_weight_t", "from_marlin_weight_t", "nvfp4_to_marlin_t", "mxfp4_to_marlin_t", "byte_table",
           "permute_columns_t"]

# codes [L, c, t, dn, r, kt, kh, kq, k0] <-> words [L, kt, c, r, kq, t | k0, dn, kh]
_TO_WORDS = (0, 5, 1, 4, 7, 2, 8, 3, 6)
_TO_CODES = (0, 2, 5, 7, 3, 1, 8, 4, 6)


def _a16_forward(codes: torch.Tensor, n: int, k: int) -> torch.Tensor:
    x = codes.reshape(-1, n // 64, 4, 2, 8, k // 16, 2, 4, 2).permute(_TO_WORDS).reshape(-1, 8)
    return pack_nibbles(x).contiguous().view(torch.int32)


def _a16_inverse(q: torch.Tensor, n: int, k: int) -> torch.Tensor:
    nib = unpack_nibbles(q.contiguous().view(torch.uint8))
    x = nib.reshape(-1, k // 16, n // 64, 8, 4, 4, 2, 2, 2).permute(_TO_CODES)
    return x.reshape(-1, n, k)


def _u32(w: torch.Tensor) -> torch.Tensor:
    return w.to(torch.int64) & 0xFFFFFFFF


def _i32(w: torch.Tensor) -> torch.Tensor:
    return torch.where(w >= 2**31, w - 2**32, w).to(torch.int32)


def _swap_bytes_1_2(w):
    return (w & 0xFF0000FF) | ((w & 0x0000FF00) << 8) | ((w & 0x00FF0000) >> 8)


def _swap_nibbles_1_2(w):
    return (w & 0xF00FF00F) | ((w & 0x00F000F0) << 4) | ((w & 0x0F000F00) >> 4)


def _a8_forward(b: torch.Tensor, n: int, k2: int) -> torch.Tensor:
    units = b.contiguous().view(torch.int16).reshape(-1, n // 32, 4, 8, k2 // 16, 2, 4)
    words = units.permute(0, 4, 1, 3, 6, 2, 5).contiguous().view(torch.int32)
    return _i32(_swap_nibbles_1_2(_swap_bytes_1_2(_u32(words))))


def _a8_inverse(q: torch.Tensor, n: int, k2: int) -> torch.Tensor:
    words = _i32(_swap_bytes_1_2(_swap_nibbles_1_2(_u32(q))))
    units = words.contiguous().view(torch.int16).reshape(-1, k2 // 16, n // 32, 8, 4, 4, 2)
    return units.permute(0, 2, 5, 3, 1, 6, 4).contiguous().view(torch.uint8).reshape(-1, n, k2)


def to_marlin_weight_t(packed: torch.Tensor, *, w4a8: bool = False) -> torch.Tensor:
    """uint8 packed codes [..., N, K/2] -> int32 [..., K/16, 2N], on packed's device."""
    *lead, n, k2 = packed.shape
    check_marlin_weight_shape(n, 2 * k2, w4a8=w4a8)
    b = packed.contiguous().view(torch.uint8)
    if w4a8:
        words = _a8_forward(b, n, k2)
    else:
        words = _a16_forward(unpack_nibbles(b), n, 2 * k2)
    return words.reshape(*lead, 2 * k2 // 16, 2 * n)


def from_marlin_weight_t(qweight: torch.Tensor, *, w4a8: bool = False) -> torch.Tensor:
    """int32 [..., K/16, 2N] -> uint8 packed codes [..., N, K/2]; the inverse of to_marlin_weight_t."""
    *lead, rows, cols = qweight.shape
    n, k = cols // 2, rows * 16
    check_marlin_weight_shape(n, k, w4a8=w4a8)
    if w4a8:
        return _a8_inverse(qweight, n, k // 2).reshape(*lead, n, k // 2)
    return pack_nibbles(_a16_inverse(qweight, n, k).contiguous()).reshape(*lead, n, k // 2)


def byte_table(fn, dtype: torch.dtype, device) -> torch.Tensor:
    """The 256-entry table of a byte-wise rule `fn` (a CPU codec), ready to index on `device`."""
    codes = torch.arange(256, dtype=torch.uint8).view(dtype)
    return fn(codes).contiguous().view(torch.uint8).reshape(256).to(device)


def permute_columns_t(s: torch.Tensor, *, w4a8: bool, inverse: bool = False) -> torch.Tensor:
    """formats.marlin.scales.(un)permute_scale_columns on the tensor's device."""
    perm = scale_column_perm(w4a8=w4a8)
    perm = (torch.argsort(perm) if inverse else perm).to(s.device)
    n, block = s.shape[-1], perm.numel()
    if n % block:
        raise ValueError(f"scale columns N={n} must be a multiple of {block} for the Marlin scale permutation")
    return s.reshape(*s.shape[:-1], n // block, block)[..., perm].reshape(s.shape)


def nvfp4_to_marlin_t(weight, scale, *, target, sf: float = 1.0, n_pad=None, k_pad=None):
    """formats.marlin.nvfp4_to_marlin on the tensors' device (same bytes)."""
    weight, scale = nvfp4_source_for(weight, scale, target=target, n_pad=n_pad, k_pad=k_pad)
    table = byte_table(lambda c: nvfp4_scales_to_s0e5m3(c, clamp=target.clamps_scales, sf=sf), torch.float8_e4m3fn,
                       weight.device)
    s = table[scale.transpose(-1, -2).contiguous().view(torch.uint8).long()]
    return to_marlin_weight_t(weight), permute_columns_t(s, w4a8=False).view(torch.float8_e4m3fn)


def mxfp4_to_marlin_t(weight, scale, *, target, n_pad=None, k_pad=None):
    """formats.marlin.mxfp4_to_marlin on the tensors' device (same bytes)."""
    weight, scale = mxfp4_source_for(weight, scale, target=target, n_pad=n_pad, k_pad=k_pad)
    s = mxfp4_scales_to_marlin(scale.transpose(-1, -2).contiguous(), w4a8=target.w4a8)
    q = to_marlin_weight_t(weight, w4a8=target.w4a8)
    return q, permute_columns_t(s, w4a8=target.w4a8).view(torch.float8_e8m0fnu)
