"""Marlin FP4 weight layout (spec MARLIN_FP4.md §2): packed codes [N, K/2] <-> int32 [K/16, 2N].

Source element (k, n) of a W4A16 tile lands at
    row = k // 16,  col = 128*(n // 64) + 4*(4*(n % 8) + (k % 8) // 2) + (n % 64) // 16,
    nibble = 4*(k % 2) + 2*((n % 16) // 8) + (k % 16) // 8.
Each output int32 therefore takes 4 whole source bytes (the two codes of a byte go to nibbles s
and s+4). The repack is done as three vectorized passes, with no per-element Python:
  1. permute 4-byte source words (the 4 bytes q = lane % 4 are contiguous in the source),
  2. a 16x4 byte transpose inside each 64-byte block,
  3. a nibble shuffle inside each int32 (low nibbles -> bits 0-15, high nibbles -> bits 16-31).
W4A8 (32x32 tiles) uses the same idea with 2-byte units. Leading (expert) dimensions are kept.
"""

import numpy as np
import torch

from .constants import MARLIN_TILE_K, MARLIN_TILE_N, W4A8_TILE

__all__ = ["to_marlin_weight", "from_marlin_weight", "check_marlin_weight_shape"]


def check_marlin_weight_shape(n: int, k: int, *, w4a8: bool = False) -> None:
    """Raise ValueError unless [N, K] can be repacked without padding."""
    tile_k, tile_n = (W4A8_TILE, W4A8_TILE) if w4a8 else (MARLIN_TILE_K, MARLIN_TILE_N)
    if k % 8:
        raise ValueError(f"K={k} must be a multiple of 8 (the uint8 -> int32 view needs whole words)")
    if k % tile_k or n % tile_n:
        raise ValueError(
            f"shape N={n}, K={k} is not a multiple of the Marlin tile ({tile_k} in K, {tile_n} in N); "
            "pad it first (padded_dense_nk) or use a tensor-parallel split that keeps whole tiles"
        )


def _compress_nibbles(x: np.ndarray) -> np.ndarray:
    """4 nibbles at bits 0, 8, 16, 24 -> bits 0, 4, 8, 12."""
    x = (x | (x >> 4)) & 0x00FF00FF
    return (x | (x >> 8)) & 0x0000FFFF


def _expand_nibbles(x: np.ndarray) -> np.ndarray:
    """Inverse of _compress_nibbles."""
    x = (x | (x << 8)) & 0x00FF00FF
    return (x | (x << 4)) & 0x0F0F0F0F


def _swap_bytes_1_2(w: np.ndarray) -> np.ndarray:
    return (w & 0xFF0000FF) | ((w & 0x0000FF00) << 8) | ((w & 0x00FF0000) >> 8)


def _swap_nibbles_1_2(w: np.ndarray) -> np.ndarray:
    """Swap nibbles 1 and 2 of each 16-bit half."""
    return (w & 0xF00FF00F) | ((w & 0x00F000F0) << 4) | ((w & 0x0F000F00) >> 4)


def _a16_forward(b: np.ndarray, n: int, k2: int) -> np.ndarray:
    # source word (c, t, dn, r, kt, dk) holds bytes q = 0..3 of n = 64c+16t+8dn+r, j = 8kt+4dk+q
    words = b.view("<u4").reshape(-1, n // 64, 4, 2, 8, k2 // 8, 2)
    words = np.ascontiguousarray(words.transpose(0, 5, 1, 4, 2, 3, 6))  # -> (kt, c, r, t, dn, dk)
    blocks = words.view(np.uint8).reshape(-1, 16, 4)  # per (kt, c, r): bytes (t, dn, dk) x q
    out = np.ascontiguousarray(blocks.transpose(0, 2, 1)).reshape(-1).view("<u4")  # word (q, t)
    return _compress_nibbles(out & 0x0F0F0F0F) | (_compress_nibbles((out >> 4) & 0x0F0F0F0F) << 16)


def _a16_inverse(q: np.ndarray, n: int, k2: int) -> np.ndarray:
    out = _expand_nibbles(q & 0xFFFF) | (_expand_nibbles(q >> 16) << 4)
    blocks = np.ascontiguousarray(out.view(np.uint8).reshape(-1, 4, 16).transpose(0, 2, 1))
    words = blocks.reshape(-1).view("<u4").reshape(-1, k2 // 8, n // 64, 8, 4, 2, 2)
    return np.ascontiguousarray(words.transpose(0, 2, 4, 5, 3, 1, 6)).reshape(-1).view(np.uint8)


def _a8_forward(b: np.ndarray, n: int, k2: int) -> np.ndarray:
    # source unit (c, gq, r, kt2, hb, q) holds bytes lb = 0, 1 of n = 32c+8gq+r, j = 16kt2+8hb+2q+lb
    units = b.view("<u2").reshape(-1, n // 32, 4, 8, k2 // 16, 2, 4)
    units = np.ascontiguousarray(units.transpose(0, 4, 1, 3, 6, 2, 5))  # -> (kt2, c, r, q, gq, hb)
    return _swap_nibbles_1_2(_swap_bytes_1_2(units.reshape(-1).view("<u4")))


def _a8_inverse(q: np.ndarray, n: int, k2: int) -> np.ndarray:
    units = _swap_bytes_1_2(_swap_nibbles_1_2(q)).view("<u2").reshape(-1, k2 // 16, n // 32, 8, 4, 4, 2)
    return np.ascontiguousarray(units.transpose(0, 2, 5, 3, 1, 6, 4)).reshape(-1).view(np.uint8)


def to_marlin_weight(packed: torch.Tensor, *, w4a8: bool = False) -> torch.Tensor:
    """uint8/int8 packed codes [..., N, K/2] -> int32 [..., K/16, 2N] in Marlin tile order."""
    if packed.dtype not in (torch.uint8, torch.int8):
        raise ValueError(f"packed FP4 weights must be uint8 or int8, got {packed.dtype}")
    *lead, n, k2 = packed.shape
    check_marlin_weight_shape(n, 2 * k2, w4a8=w4a8)
    b = packed.contiguous().view(torch.uint8).numpy().reshape(-1)
    words = (_a8_forward if w4a8 else _a16_forward)(b, n, k2)
    return torch.from_numpy(words.view(np.int32)).reshape(*lead, 2 * k2 // MARLIN_TILE_K, 2 * n)


def from_marlin_weight(qweight: torch.Tensor, *, w4a8: bool = False) -> torch.Tensor:
    """int32 [..., K/16, 2N] -> uint8 packed codes [..., N, K/2]; the exact inverse of to_marlin_weight."""
    if qweight.dtype != torch.int32:
        raise ValueError(f"Marlin weights must be int32, got {qweight.dtype}")
    *lead, rows, cols = qweight.shape
    n, k2 = cols // 2, rows * MARLIN_TILE_K // 2
    check_marlin_weight_shape(n, 2 * k2, w4a8=w4a8)
    q = qweight.contiguous().numpy().reshape(-1).view("<u4")
    b = (_a8_inverse if w4a8 else _a16_inverse)(q, n, k2)
    return torch.from_numpy(b).reshape(*lead, n, k2)
