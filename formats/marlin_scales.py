"""Marlin FP4 scale layout and values (spec MARLIN_FP4.md §3).

Layout: scales are transposed to [G, N] and their columns permuted inside aligned blocks: for
16-bit activations an 8x8 transpose per 64 columns followed by the [0,2,1,3] quad interleave;
for W4A8 the `scale_perm_single` order per 32 columns. Values: NVFP4 block scales become S0E5M3
bytes (with vLLM's power-of-two rescale and clamp where the target has them); MXFP4 bytes are kept
(W4A8 adds 6). All functions here work on [..., G, N] and carry leading dimensions through.
"""

import functools
import math

import numpy as np
import torch

from dsv4_convert.formats import fp4_kernels
from dsv4_convert.formats.constants import (
    ACT_EXPONENT_BIAS,
    S0E5M3_MIN,
    S0E5M3_MULTIPLIER,
    VLLM_RESCALE_TARGET,
    W4A8_E8M0_OFFSET,
    W4A8_MAX_SOURCE_BYTE,
)
from dsv4_convert.formats.e4m3 import as_e4m3, half_to_s0e5m3, s0e5m3_to_half
from dsv4_convert.formats.e8m0 import as_e8m0_bytes

__all__ = [
    "scale_column_perm", "permute_scale_columns", "unpermute_scale_columns",
    "vllm_rescale_factor", "nvfp4_scales_to_s0e5m3", "nvfp4_scales_to_marlin", "s0e5m3_to_nvfp4_scales",
    "nvfp4_global_to_marlin", "marlin_to_nvfp4_global", "mxfp4_scales_to_marlin", "marlin_to_mxfp4_scales",
]

_QUAD = (0, 2, 1, 3)
_NO_TABLE = np.empty(0, np.uint8)
_SINGLE = (0, 1, 8, 9, 16, 17, 24, 25)


def scale_column_perm(*, w4a8: bool) -> torch.Tensor:
    """Source column (within one block) for each output column: 64 entries, or 32 for W4A8."""
    return torch.from_numpy(_perm(w4a8).copy())


@functools.lru_cache(maxsize=2)
def _perm(w4a8: bool) -> np.ndarray:
    """scale_column_perm, built once (read-only: callers get copies)."""
    perm = _build_perm(w4a8).numpy()
    perm.setflags(write=False)
    return perm


def _build_perm(w4a8: bool) -> torch.Tensor:
    if w4a8:
        return torch.tensor([2 * i + _SINGLE[m] for i in range(4) for m in range(8)])
    src = []
    for q in range(64):
        p = 4 * (q // 4) + _QUAD[q % 4]
        src.append(8 * (p % 8) + p // 8)
    return torch.tensor(src)


def _apply_block_perm(s: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    n = s.shape[-1]
    block = perm.numel()
    if n % block:
        raise ValueError(f"scale columns N={n} must be a multiple of {block} for the Marlin scale permutation")
    return s.reshape(*s.shape[:-1], n // block, block)[..., perm].reshape(s.shape)


def permute_scale_columns(s: torch.Tensor, *, w4a8: bool = False, table: np.ndarray | None = None) -> torch.Tensor:
    """[..., G, N] -> the same shape with Marlin's column order (a pure permutation of bytes), and with
    `table` ([256] uint8) applied to every byte if given (a byte-wise value rule, e.g. _s0e5m3_table).
    Given the transpose of [..., N, G] bytes (how the converters call it), the transpose, the
    permutation and the table are one compiled pass; anything else takes the torch reference."""
    perm = _perm(w4a8)
    if s.dim() < 2 or s.element_size() != 1 or s.shape[-1] % perm.size or not s.transpose(-1, -2).is_contiguous():
        if table is not None:
            s = torch.from_numpy(table[s.contiguous().view(torch.uint8).numpy()]).view(s.dtype)
        return _apply_block_perm(s, torch.from_numpy(perm.copy()))
    *lead, g, n = s.shape
    src = s.transpose(-1, -2).view(torch.uint8).reshape(-1, n, g).numpy()
    out = np.empty((src.shape[0], g, n), np.uint8)
    fp4_kernels.permute_scales(src, perm, _NO_TABLE if table is None else table, out)
    return torch.from_numpy(out).reshape(*lead, g, n).view(s.dtype)


def nvfp4_scales_to_marlin(scale: torch.Tensor, *, engine: str, sf: float = 1.0) -> torch.Tensor:
    """E4M3 block scales [..., N, G] -> Marlin's S0E5M3 bytes [..., G, N] (uint8): the same bytes as
    permute_scale_columns(nvfp4_scales_to_s0e5m3(scale.transpose(-1, -2))), in one pass."""
    src = as_e4m3(scale).view(torch.uint8)
    return permute_scale_columns(src.transpose(-1, -2), table=_s0e5m3_table(engine, sf))


def unpermute_scale_columns(s: torch.Tensor, *, w4a8: bool = False) -> torch.Tensor:
    return _apply_block_perm(s, torch.argsort(scale_column_perm(w4a8=w4a8)))


def vllm_rescale_factor(scales: list[torch.Tensor] | torch.Tensor, act_dtype: str) -> float:
    """vLLM >= 0.20's power-of-two factor for one stacked tensor (all experts of w13, or of w2):
    2**floor(log2(448*128 / m)) where m is the largest non-zero x128 scale, if m < 448*128; else 1.
    Always 1 for fp16 activations."""
    if act_dtype != "bfloat16":
        return 1.0
    parts = [scales] if isinstance(scales, torch.Tensor) else scales
    present = np.zeros(256, dtype=bool)  # only which byte values occur matters: one histogram per part
    for part in parts:
        present |= np.bincount(as_e4m3(part).contiguous().view(torch.uint8).numpy().reshape(-1), minlength=256) > 0
    v = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float16) * S0E5M3_MULTIPLIER
    v = v[torch.from_numpy(present) & (v != 0)]
    if torch.isnan(v).any():
        return 1.0
    m = v.max().item() if v.numel() else -math.inf
    if not (0 < m < VLLM_RESCALE_TARGET):
        return 1.0
    return 2.0 ** math.floor(math.log2(VLLM_RESCALE_TARGET / m))


def nvfp4_scales_to_s0e5m3(scale: torch.Tensor, *, engine: str, sf: float = 1.0) -> torch.Tensor:
    """E4M3 block scales -> uint8 S0E5M3 bytes (same shape, no permutation).

    vllm: fp16(s) [* sf] * 128, values below 2 (tiny, zero or negative) become 0.
    sglang: fp16(s) * 128 with the sign dropped; no rescale, no clamp.
    Each output byte depends on its input byte alone, so the rule is evaluated once over all 256
    bytes and applied as a table lookup (several times faster on a [2048, 256] expert scale)."""
    table = _s0e5m3_table(engine, sf)
    src = as_e4m3(scale).view(torch.uint8)
    transposed = src.dim() >= 2 and not src.is_contiguous() and src.transpose(-1, -2).is_contiguous()
    base = src.transpose(-1, -2) if transposed else src.contiguous()  # keep a transposed view's layout
    out = base.clone()
    fp4_kernels.lookup(out.reshape(-1).numpy(), table)
    return out.transpose(-1, -2) if transposed else out


@functools.lru_cache(maxsize=16)
def _s0e5m3_table(engine: str, sf: float) -> np.ndarray:
    """The forward rule over all 256 E4M3 bytes (built once per engine and rescale factor)."""
    return _s0e5m3_values(torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn), engine=engine, sf=sf).numpy()


def _s0e5m3_values(scale: torch.Tensor, *, engine: str, sf: float) -> torch.Tensor:
    v = scale.to(torch.float16)
    if engine == "vllm":
        if sf != 1.0:
            v = (v.float() * sf).to(torch.float16)
        v = v * S0E5M3_MULTIPLIER
        v = torch.where(v < S0E5M3_MIN, torch.zeros_like(v), v)
    elif engine == "sglang":
        if sf != 1.0:
            raise ValueError("the sglang layout has no rescale factor (sf must be 1)")
        v = v * S0E5M3_MULTIPLIER
    else:
        raise ValueError(f"unknown engine {engine!r}; expected 'vllm' or 'sglang'")
    return half_to_s0e5m3(v)


def s0e5m3_to_nvfp4_scales(b: torch.Tensor, *, sf: float = 1.0) -> torch.Tensor:
    """S0E5M3 bytes -> E4M3 block scales (float8_e4m3fn). Exact for every byte the forward produced
    from a non-negative scale that was not clamped; compare bytes to find the lost ones.
    Byte-wise, so applied as a 256-entry table like the forward."""
    codes = torch.arange(256, dtype=torch.uint8)
    table = (s0e5m3_to_half(codes).float() / (S0E5M3_MULTIPLIER * sf)).to(torch.float8_e4m3fn).view(torch.uint8)
    return torch.from_numpy(table.numpy()[b.contiguous().view(torch.uint8).numpy()]).view(torch.float8_e4m3fn)


def nvfp4_global_to_marlin(g: torch.Tensor, *, engine: str, act_dtype: str, sf: float = 1.0) -> torch.Tensor:
    """ModelOpt global scale(s) -> the processed global the kernel multiplies by: g * 2**(B-7) / sf,
    in float32 for vllm and in the activation dtype for sglang (which has no sf)."""
    if act_dtype not in ACT_EXPONENT_BIAS:
        raise ValueError(f"unknown activation dtype {act_dtype!r}; expected one of {sorted(ACT_EXPONENT_BIAS)}")
    bias = ACT_EXPONENT_BIAS[act_dtype]
    bad = ~(torch.isfinite(g) & (g > 0))
    if bad.any():
        first = torch.nonzero(bad.reshape(-1))[0].item()
        raise ValueError(f"NVFP4 global scales must be finite and > 0; {int(bad.sum())} of {g.numel()} are not "
                         f"(first at flat index {first}: {g.reshape(-1)[first].item()})")
    if engine == "vllm":
        return g.float() * (2.0 ** (bias - 7)) / sf
    if engine == "sglang":
        return g.to(getattr(torch, act_dtype)) * (2.0 ** (bias - 7))
    raise ValueError(f"unknown engine {engine!r}; expected 'vllm' or 'sglang'")


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
