"""Marlin FP4 weight layout (docs/spec/MARLIN_FP4.md §2): packed codes [N, K/2] <-> int32 [K/16, 2N], on torch
tensors. Source element (k, n) of a W4A16 tile lands at
    row = k // 16,  col = 128*(n // 64) + 4*(4*(n % 8) + (k % 8) // 2) + (n % 64) // 16,
    nibble = 4*(k % 2) + 2*((n % 16) // 8) + (k % 16) // 8.
How the bytes are moved (bit exchanges on 64-bit words, the compiled kernel, threads): formats/marlin/reference_weight.py.
Leading (expert) dimensions are kept.
"""

import numpy as np
import torch

from ..constants import MARLIN_TILE_K
from ..tiles import check_weight_tiles as check_marlin_weight_shape
from .reference_weight import a8_forward, a8_inverse, a16_forward, a16_inverse

__all__ = ["check_marlin_weight_shape", "from_marlin_weight", "to_marlin_weight"]


def to_marlin_weight(packed: torch.Tensor, *, w4a8: bool = False, threads: int | None = None) -> torch.Tensor:
    """uint8/int8 packed codes [..., N, K/2] -> int32 [..., K/16, 2N] in Marlin tile order, on `threads`
    threads (None: reference_weight.default_threads())."""
    if packed.dtype not in (torch.uint8, torch.int8):
        raise ValueError(f"packed FP4 weights must be uint8 or int8, got {packed.dtype}")
    if packed.dim() < 2:
        raise ValueError(f"packed FP4 weights must be [..., N, K/2], got shape {list(packed.shape)}")
    *lead, n, k2 = packed.shape
    check_marlin_weight_shape(n, 2 * k2, w4a8=w4a8)
    if packed.numel() == 0:
        return torch.empty(*lead, 2 * k2 // MARLIN_TILE_K, 2 * n, dtype=torch.int32)
    b = packed.contiguous().view(torch.uint8).numpy().reshape(-1)
    words = a8_forward(b, n, k2) if w4a8 else a16_forward(b, n, k2, threads=threads)
    return torch.from_numpy(words.view(np.int32)).reshape(*lead, 2 * k2 // MARLIN_TILE_K, 2 * n)


def from_marlin_weight(qweight: torch.Tensor, *, w4a8: bool = False, threads: int | None = None) -> torch.Tensor:
    """int32 [..., K/16, 2N] -> uint8 packed codes [..., N, K/2]; the exact inverse of to_marlin_weight."""
    if qweight.dtype != torch.int32:
        raise ValueError(f"Marlin weights must be int32, got {qweight.dtype}")
    if qweight.dim() < 2 or qweight.shape[-1] % 2:
        raise ValueError(f"Marlin weights must be [..., K/16, 2N] (even last dimension), got {list(qweight.shape)}")
    *lead, rows, cols = qweight.shape
    n, k2 = cols // 2, rows * MARLIN_TILE_K // 2
    check_marlin_weight_shape(n, 2 * k2, w4a8=w4a8)
    if qweight.numel() == 0:
        return torch.empty(*lead, n, k2, dtype=torch.uint8)
    q = qweight.contiguous().numpy().reshape(-1).view("<u4")
    b = a8_inverse(q, n, k2) if w4a8 else a16_inverse(q, n, k2, threads=threads)
    return torch.from_numpy(b).reshape(*lead, n, k2)
