"""The byte-wise rules of Marlin's FP4 scales, on numpy arrays (docs/spec/MARLIN_FP4.md §3), without torch:
the converter's CPU path and the torch API (formats/marlin/scales.py) both use these tables.

Every NVFP4 rule here maps one E4M3 byte to one output byte, so it is evaluated once over all 256
bytes and applied as a lookup:
  s0e5m3_table  E4M3 block scale -> the target's S0E5M3 byte (vLLM: rescale by sf, x128, values
                below 2 become 0; SGLang: x128, sign dropped)
  inexact_bytes which E4M3 bytes the S0E5M3 byte does not hold exactly (the only ones that can be lost)
  rescale_factor  vLLM's power-of-two factor, from which byte values occur in a stacked tensor
and the scale column permutation (`scale_perm`, `permute_scales`) and the processed NVFP4 global
(`global_to_marlin`). fp16 arithmetic is numpy's IEEE half (what torch computes on CPU too);
bf16 is rounded to nearest even from float32 bits, as torch does.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..constants import (
    ACT_EXPONENT_BIAS,
    E4M3_NAN_BYTES,
    S0E5M3_MIN,
    S0E5M3_MULTIPLIER,
    VLLM_RESCALE_TARGET,
)
from . import compiled_kernels

__all__ = ["E4M3_VALUES", "scale_perm", "permute_scales", "s0e5m3_table", "inexact_bytes", "rescale_factor",
           "possible_rescale_factors", "global_to_marlin"]

_QUAD = (0, 2, 1, 3)
_SINGLE = (0, 1, 8, 9, 16, 17, 24, 25)
_NO_TABLE = np.empty(0, np.uint8)


def _e4m3_values() -> np.ndarray:
    """float32 value of each E4M3 (e4m3fn) byte: S.EEEE.MMM, bias 7, subnormals at E = 0, NaN at
    S.1111.111, no infinity. Every value is exact in float32 and in float16."""
    b = np.arange(256)
    e, m = (b >> 3) & 0xF, (b & 7).astype(np.float64)
    mag = np.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * 2.0 ** (e - 7))
    mag = np.where(np.isin(b, E4M3_NAN_BYTES), np.nan, mag)
    out = np.where(b & 0x80, -mag, mag).astype(np.float32)
    out.setflags(write=False)
    return out


E4M3_VALUES = _e4m3_values()


@functools.lru_cache(maxsize=2)
def scale_perm(w4a8: bool) -> np.ndarray:
    """Source column (within one block) for each output column: 64 entries (16-bit activations: an
    8x8 transpose per 64 columns, then the [0,2,1,3] quad interleave), or 32 for W4A8 (vLLM's
    `scale_perm_single`). Read-only."""
    if w4a8:
        perm = [2 * i + _SINGLE[m] for i in range(4) for m in range(8)]
    else:
        perm = []
        for q in range(64):
            p = 4 * (q // 4) + _QUAD[q % 4]
            perm.append(8 * (p % 8) + p // 8)
    out = np.array(perm, dtype=np.int64)
    out.setflags(write=False)
    return out


def permute_scales(src: np.ndarray, *, w4a8: bool = False, table: np.ndarray | None = None) -> np.ndarray:
    """Scale bytes [B, N, G] (as stored, one row per output channel) -> Marlin's [B, G, N]: the
    transpose, the column permutation and `table` ([256] uint8, optional) in one compiled pass."""
    perm = scale_perm(w4a8)
    if src.shape[1] % perm.size:
        raise ValueError(f"scale columns N={src.shape[1]} must be a multiple of {perm.size} for the Marlin "
                         "scale permutation")
    out = np.empty((src.shape[0], src.shape[2], src.shape[1]), np.uint8)
    compiled_kernels.permute_scales(src, perm, _NO_TABLE if table is None else table, out)
    return out


def _half(v) -> np.ndarray:
    return np.asarray(v, dtype=np.float16)


@functools.lru_cache(maxsize=64)
def _processed(clamp: bool, sf: float) -> np.ndarray:
    """float16 value the target stores for each E4M3 byte, before the S0E5M3 truncation: fp16(s) [* sf]
    * 128; with `clamp` (core/targets/engines.py EngineFacts.scale_clamp) values below 2 become 0."""
    v = E4M3_VALUES.astype(np.float16)  # exact
    with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN are part of the rule
        if sf != 1.0:
            v = (v.astype(np.float32) * np.float32(sf)).astype(np.float16)
        v = v * _half(S0E5M3_MULTIPLIER)
        if clamp:
            v = np.where(v < _half(S0E5M3_MIN), _half(0), v)
    return v.astype(np.float16)


@functools.lru_cache(maxsize=64)
def s0e5m3_table(*, clamp: bool, sf: float = 1.0) -> np.ndarray:
    """[256] uint8: E4M3 byte -> S0E5M3 byte = bits 14..7 of the processed half (sign dropped; the low
    7 mantissa bits are zero for every x128-scaled E4M3 value). NaN bytes give 0xFF as torch's
    conversion does; they are refused before any conversion. Read-only."""
    v = _processed(clamp, sf)
    bits = v.view(np.uint16).astype(np.uint32) & 0x7FFF
    out = np.where(np.isnan(v), np.uint8(0xFF), (bits >> 7).astype(np.uint8))  # torch's NaN half is 0x7FFF
    out.setflags(write=False)
    return out


@functools.lru_cache(maxsize=64)
def inexact_bytes(*, clamp: bool, sf: float = 1.0) -> np.ndarray:
    """[256] bool: E4M3 bytes whose S0E5M3 byte is not exactly their value x sf x 128: negatives
    (sign dropped, or clamped to 0), tiny values clamped to 0, values pushed past the half range to
    inf, and NaN. Every other byte comes back exactly from the reverse (byte << 7 as half, / (128 sf),
    an exact value whatever the float -> E4M3 rounding), so a scale tensor holding none of these
    bytes loses nothing; this is the cheap test before the exact lost set (convert/transform.py
    `lost_scales`, which runs the reverse itself). Read-only."""
    half = s0e5m3_table(clamp=clamp, sf=sf).astype(np.uint16) << 7
    back = half.view(np.float16).astype(np.float64)
    value = E4M3_VALUES.astype(np.float64)
    out = ~((np.arange(256) & 0x80 == 0) & (back == value * sf * S0E5M3_MULTIPLIER))
    out.setflags(write=False)
    return out


def rescale_factor(present: np.ndarray, act_dtype: str) -> float:
    """vLLM >= 0.20's power-of-two factor for one stacked tensor, from `present` ([256] bool: which
    E4M3 bytes occur in it): 2**floor(log2(448*128 / m)) where m is the largest non-zero x128 value,
    if m < 448*128; else 1. Always 1 for fp16 activations (and when a NaN scale occurs)."""
    if act_dtype != "bfloat16":
        return 1.0
    with np.errstate(invalid="ignore"):
        v = E4M3_VALUES.astype(np.float16) * _half(S0E5M3_MULTIPLIER)
    v = v[np.asarray(present, dtype=bool) & (v != 0)]
    if np.isnan(v).any():
        return 1.0
    m = float(v.max()) if v.size else -math.inf
    if not (0 < m < VLLM_RESCALE_TARGET):
        return 1.0
    return 2.0 ** math.floor(math.log2(VLLM_RESCALE_TARGET / m))


@functools.lru_cache(maxsize=4)
def possible_rescale_factors(act_dtype: str) -> frozenset[float]:
    """Every factor `rescale_factor` can give for `act_dtype`: the factor depends only on the largest byte
    present, so one byte at a time covers them all (bf16: 2**0 .. 2**17; fp16: 1). A recorded factor
    outside this set was not written by a conversion, and a plugin acting on it re-encodes every scale wrongly
    (an infinite one turns them all to 0)."""
    out = set()
    for b in range(256):
        present = np.zeros(256, dtype=bool)
        present[b] = True
        out.add(rescale_factor(present, act_dtype))
    return frozenset(out)


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, rounded to nearest even (NaN -> 0x7FC0, as torch)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), rounded)


def global_to_marlin(g: np.ndarray, *, fp32_global: bool, act_dtype: str, sf: float = 1.0) -> np.ndarray:
    """Finite, positive float32 ModelOpt global(s) -> the processed global the kernel multiplies by,
    g * 2**(B-7) / sf: float32 with `fp32_global` (vLLM); else rounded to the activation dtype first
    and returned as that dtype's bytes (float16, or bfloat16 bit patterns as uint16; SGLang, sf = 1)."""
    if act_dtype not in ACT_EXPONENT_BIAS:
        raise ValueError(f"unknown activation dtype {act_dtype!r}; expected one of {sorted(ACT_EXPONENT_BIAS)}")
    factor = np.float32(2.0 ** (ACT_EXPONENT_BIAS[act_dtype] - 7))
    g = np.asarray(g, dtype=np.float32)
    with np.errstate(over="ignore"):
        if fp32_global:
            return g * factor / np.float32(sf)
        if sf != 1.0:
            raise ValueError("a global kept in the activation dtype has no rescale factor (sf must be 1)")
        if act_dtype == "float16":
            return g.astype(np.float16) * _half(factor)
        rounded = (_bf16_bits(g).astype(np.uint32) << 16).view(np.float32)
        return _bf16_bits(rounded * factor)  # exact (or inf): a power of two in float32's range
