"""Deterministic random tensors for `synth`: every tensor has its own generator, seeded from
(seed, key), so a tensor does not depend on which other tensors were generated before it and a
test can rebuild any original matrix from the seed alone (see `expert_matrix`)."""

from __future__ import annotations

import hashlib

import torch

from ..formats.constants import E4M3_MAX
from ..formats.e8m0 import exponent_to_e8m0

__all__ = ["FP8_BLOCK", "dense", "expert_matrix", "fp8_block_quantize", "generator_for"]

FP8_BLOCK = 128  # DeepSeek-V4 FP8 linears: one E8M0 scale per 128x128 block (ceil at the edges)


def generator_for(seed: int, key: str) -> torch.Generator:
    """A CPU generator seeded from sha256(seed/key): stable across runs, platforms and call order."""
    digest = hashlib.sha256(f"{seed}/{key}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))


def dense(seed: int, key: str, shape: tuple[int, ...], *, std: float = 0.02,
          dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Normal(0, std) values in `dtype`, keyed by `key` (usually the tensor name)."""
    return (torch.randn(shape, generator=generator_for(seed, key)) * std).to(dtype)


def expert_matrix(seed: int, layer: str, expert: int, role: str, n: int, k: int, *,
                  dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The float32 [n, k] matrix that synth quantizes for one expert projection.

    `layer` is "0", "1", ... or "mtp.0"; `role` is "gate", "up" or "down". Values are representable
    in `dtype` (bf16 by default); rows get different magnitudes (x 2**[-2, 2]) so block scales vary."""
    g = generator_for(seed, f"expert/{layer}/{expert}/{role}")
    w = torch.randn((n, k), generator=g) * 0.02
    row_gain = torch.exp2(torch.randint(-2, 3, (n, 1), generator=g).float())
    return (w * row_gain).to(dtype).float()


def fp8_block_quantize(w: torch.Tensor, block: tuple[int, int] = (FP8_BLOCK, FP8_BLOCK)
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """float [N, K] -> (float8_e4m3fn [N, K], E8M0 scales float8_e8m0fnu [ceil(N/rows), ceil(K/cols)]) for
    `block` = (rows, cols): DeepSeek-V4's 128x128, V4.1's 32x32 linears and 1x32 Engram rows.

    Each block gets the power of two 2**ceil(log2(amax/448)), as DeepSeek's ue8m0 FP8 does."""
    n, k = w.shape
    rows, cols = block
    bn, bk = -(-n // rows), -(-k // cols)
    padded = torch.zeros(bn * rows, bk * cols)
    padded[:n, :k] = w.float()
    blocks = padded.reshape(bn, rows, bk, cols)
    ratio = blocks.abs().amax(dim=(1, 3)) / E4M3_MAX
    mantissa, exponent = torch.frexp(ratio)
    exponent = torch.where(mantissa == 0.5, exponent - 1, exponent)
    exponent = torch.where(ratio == 0, torch.zeros_like(exponent), exponent)
    scale = torch.exp2(exponent.float())
    q = (blocks / scale[:, None, :, None]).reshape(bn * rows, bk * cols)[:n, :k]
    return q.contiguous().to(torch.float8_e4m3fn), exponent_to_e8m0(exponent).view(torch.float8_e8m0fnu)
