"""Marlin FP4 scale layout and values (docs/spec/MARLIN_FP4.md §3).

Layout: scales are transposed to [G, N] and their columns permuted inside aligned blocks: for
16-bit activations an 8x8 transpose per 64 columns followed by the [0,2,1,3] quad interleave;
for W4A8 the `scale_perm_single` order per 32 columns. Values: NVFP4 block scales become S0E5M3
bytes (with vLLM's power-of-two rescale and clamp where the target has them); MXFP4 bytes are kept
(W4A8 adds 6). All functions here work on [..., G, N] and carry leading dimensions through.
"""

import numpy as np
import torch

from ..constants import (
    ACT_EXPONENT_BIAS,
    S0E5M3_MULTIPLIER,
    W4A8_E8M0_OFFSET,
    W4A8_MAX_SOURCE_BYTE,
)
from ..e4m3 import as_e4m3, s0e5m3_to_half
from ..e8m0 import as_e8m0_bytes
from . import compiled_kernels
from .reference_scales import permute_scales, rescale_factor, s0e5m3_table, scale_perm

__all__ = [
    "scale_column_perm", "permute_scale_columns", "unpermute_scale_columns",
    "vllm_rescale_factor", "nvfp4_scales_to_s0e5m3", "nvfp4_scales_to_marlin", "s0e5m3_to_nvfp4_scales",
    "nvfp4_global_to_marlin", "marlin_to_nvfp4_global", "mxfp4_scales_to_marlin", "marlin_to_mxfp4_scales",
]


def scale_column_perm(*, w4a8: bool) -> torch.Tensor:
    """Source column (within one block) for each output column: 64 entries, or 32 for W4A8."""
    return torch.from_numpy(scale_perm(w4a8).copy())


def _apply_block_perm(s: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    n = s.shape[-1]
    block = perm.numel()
    if n % block:
        raise ValueError(f"scale columns N={n} must be a multiple of {block} for the Marlin scale permutation")
    return s.reshape(*s.shape[:-1], n // block, block)[..., perm].reshape(s.shape)


def permute_scale_columns(s: torch.Tensor, *, w4a8: bool = False, table: np.ndarray | None = None) -> torch.Tensor:
    """[..., G, N] -> the same shape with Marlin's column order (a pure permutation of bytes), and with
    `table` ([256] uint8) applied to every byte if given (a byte-wise value rule, e.g. reference_scales.s0e5m3_table).
    Given the transpose of [..., N, G] bytes (how the converters call it), the transpose, the
    permutation and the table are one compiled pass; anything else takes the torch reference."""
    perm = scale_perm(w4a8)
    if s.dim() < 2 or s.element_size() != 1 or s.shape[-1] % perm.size or not s.transpose(-1, -2).is_contiguous():
        if table is not None:
            s = torch.from_numpy(table[s.contiguous().view(torch.uint8).numpy()]).view(s.dtype)
        return _apply_block_perm(s, torch.from_numpy(perm.copy()))
    *lead, g, n = s.shape
    src = s.transpose(-1, -2).view(torch.uint8).reshape(-1, n, g).numpy()
    out = permute_scales(src, w4a8=w4a8, table=table)
    return torch.from_numpy(out).reshape(*lead, g, n).view(s.dtype)


def nvfp4_scales_to_marlin(scale: torch.Tensor, *, clamp: bool, sf: float = 1.0) -> torch.Tensor:
    """E4M3 block scales [..., N, G] -> Marlin's S0E5M3 bytes [..., G, N] (uint8): the same bytes as
    permute_scale_columns(nvfp4_scales_to_s0e5m3(scale.transpose(-1, -2))), in one pass."""
    src = as_e4m3(scale).view(torch.uint8)
    return permute_scale_columns(src.transpose(-1, -2), table=s0e5m3_table(clamp=clamp, sf=sf))


def unpermute_scale_columns(s: torch.Tensor, *, w4a8: bool = False) -> torch.Tensor:
    return _apply_block_perm(s, torch.argsort(scale_column_perm(w4a8=w4a8)))


def vllm_rescale_factor(scales: list[torch.Tensor] | torch.Tensor, act_dtype: str) -> float:
    """vLLM >= 0.20's power-of-two factor for one stacked tensor (all experts of w13, or of w2):
    2**floor(log2(448*128 / m)) where m is the largest non-zero x128 scale, if m < 448*128; else 1.
    Always 1 for fp16 activations."""
    parts = [scales] if isinstance(scales, torch.Tensor) else scales
    present = np.zeros(256, dtype=bool)  # only which byte values occur matters: one histogram per part
    for part in parts:
        present |= compiled_kernels.byte_presence(as_e4m3(part).contiguous().view(torch.uint8).numpy().reshape(-1))
    return rescale_factor(present, act_dtype)


def nvfp4_scales_to_s0e5m3(scale: torch.Tensor, *, clamp: bool, sf: float = 1.0) -> torch.Tensor:
    """E4M3 block scales -> uint8 S0E5M3 bytes (same shape, no permutation).

    fp16(s) [* sf] * 128 with the sign dropped; with `clamp` (vLLM: core/targets/engines.py scale_clamp) values
    below 2 (tiny, zero or negative) become 0. SGLang: no clamp, and sf is 1 (it has no rescale).
    Each output byte depends on its input byte alone, so the rule is evaluated once over all 256
    bytes and applied as a table lookup (several times faster on a [2048, 256] expert scale)."""
    table = s0e5m3_table(clamp=clamp, sf=sf)
    src = as_e4m3(scale).view(torch.uint8)
    transposed = src.dim() >= 2 and not src.is_contiguous() and src.transpose(-1, -2).is_contiguous()
    base = src.transpose(-1, -2) if transposed else src.contiguous()  # keep a transposed view's layout
    out = base.clone()
    compiled_kernels.lookup(out.reshape(-1).numpy(), table)
    return out.transpose(-1, -2) if transposed else out


def s0e5m3_to_nvfp4_scales(b: torch.Tensor, *, sf: float = 1.0) -> torch.Tensor:
    """S0E5M3 bytes -> E4M3 block scales (float8_e4m3fn). Exact for every byte the forward produced
    from a non-negative scale that was not clamped; compare bytes to find the lost ones.
    Byte-wise, so applied as a 256-entry table like the forward."""
    codes = torch.arange(256, dtype=torch.uint8)
    table = (s0e5m3_to_half(codes).float() / (S0E5M3_MULTIPLIER * sf)).to(torch.float8_e4m3fn).view(torch.uint8)
    return torch.from_numpy(table.numpy()[b.contiguous().view(torch.uint8).numpy()]).view(torch.float8_e4m3fn)


def nvfp4_global_to_marlin(g: torch.Tensor, *, fp32_global: bool, act_dtype: str, sf: float = 1.0) -> torch.Tensor:
    """ModelOpt global scale(s) -> the processed global the kernel multiplies by: g * 2**(B-7) / sf,
    in float32 with `fp32_global` (vLLM), else in the activation dtype (SGLang, which has no sf)."""
    if act_dtype not in ACT_EXPONENT_BIAS:
        raise ValueError(f"unknown activation dtype {act_dtype!r}; expected one of {sorted(ACT_EXPONENT_BIAS)}")
    bias = ACT_EXPONENT_BIAS[act_dtype]
    bad = ~(torch.isfinite(g) & (g > 0))
    if bad.any():
        first = torch.nonzero(bad.reshape(-1))[0].item()
        raise ValueError(f"NVFP4 global scales must be finite and > 0; {int(bad.sum())} of {g.numel()} are not "
                         f"(first at flat index {first}: {g.reshape(-1)[first].item()})")
    if fp32_global:
        return g.float() * (2.0 ** (bias - 7)) / sf
    if sf != 1.0:
        raise ValueError("a global kept in the activation dtype has no rescale factor (sf must be 1)")
    return g.to(getattr(torch, act_dtype)) * (2.0 ** (bias - 7))


def marlin_to_nvfp4_global(gm: torch.Tensor, *, act_dtype: str, sf: float = 1.0) -> torch.Tensor:
    """Processed global -> float32 ModelOpt global. Exact for vllm (fp32); for sglang the global was
    rounded to the activation dtype, which is why converted checkpoints keep `weight_scale_2`."""
    return gm.float() * sf / (2.0 ** (ACT_EXPONENT_BIAS[act_dtype] - 7))


def mxfp4_scales_to_marlin(scale: torch.Tensor, *, w4a8: bool = False) -> torch.Tensor:
    """E8M0 bytes -> uint8 bytes for Marlin: unchanged for 16-bit activations, + 6 for W4A8."""
    b = as_e8m0_bytes(scale)
    if not w4a8:
        return b.clone()
    if (b > W4A8_MAX_SOURCE_BYTE).any():
        raise ValueError(f"W4A8 needs E8M0 scale bytes <= {W4A8_MAX_SOURCE_BYTE}: with the +6 offset, 249 becomes "
                         "255, which the kernel decodes as Inf")
    return b + W4A8_E8M0_OFFSET


def marlin_to_mxfp4_scales(b: torch.Tensor, *, w4a8: bool = False) -> torch.Tensor:
    b = as_e8m0_bytes(b)
    return (b - W4A8_E8M0_OFFSET) if w4a8 else b.clone()
