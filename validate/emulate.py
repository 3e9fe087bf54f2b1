"""What the Marlin kernel computes from the packed tensors, emulated in fp32 (docs/spec/MARLIN_FP4.md §3.3-3.5).

NVFP4: the kernel expands FP4 codes without the exponent-bias correction (x 2**-B), decodes the
S0E5M3 scale byte (fp16: half bits = byte << 7; bf16: exponent 0x80 | ((byte >> 3) & 0xF), mantissa
(byte & 7) << 4, which is right only for bytes >= 0x80) and multiplies by the processed global.
MXFP4: bf16 bits = byte << 7, so byte 0 -> +0 and 0xFF -> +Inf. W4A8 scales carry +6 (removed here;
the FP8 activation quantization itself is not emulated).
"""

from __future__ import annotations

import torch

from ..core.checkpoint.tensor_model import Quant, Role
from ..formats.constants import ACT_EXPONENT_BIAS, MXFP4_GROUP, NVFP4_GROUP, W4A8_E8M0_OFFSET
from ..formats.e2m1 import e2m1_to_float, unpack_nibbles
from ..formats.e4m3 import s0e5m3_to_half
from ..formats.marlin.scales import unpermute_scale_columns
from ..formats.marlin.weight import from_marlin_weight
from ..formats.mxfp4 import dequantize_mxfp4
from ..formats.nvfp4 import dequantize_nvfp4
from ..formats.padded_layout import decode_rank_blocks

__all__ = ["GEMM_REL_ERROR_MAX", "gemm_errors", "kernel_scale_values", "marlin_dequantize", "source_dequantize"]

# Fail the GEMM spot check above this relative (Frobenius) error. With byte-exact tensors the
# emulated product equals the source product except for the rounding of SGLang's global to the
# activation dtype (<= 2**-8 relative for bf16: 8 significant bits); anything above 1% means wrong weights or scales.
GEMM_REL_ERROR_MAX = 1e-2


def _bf16_s0e5m3(b: torch.Tensor) -> torch.Tensor:
    bits = ((0x80 | ((b.to(torch.int32) >> 3) & 0xF)) << 7) | ((b.to(torch.int32) & 7) << 4)
    return bits.to(torch.int16).view(torch.bfloat16).float()


def kernel_scale_values(mscale: torch.Tensor, quant: Quant, act_dtype: str, w4a8: bool) -> torch.Tensor:
    """Marlin scale bytes [..., G, N] (permuted) -> float32 [..., N, G] as the kernel sees them."""
    b = unpermute_scale_columns(mscale.contiguous().view(torch.uint8), w4a8=w4a8 and quant is Quant.MXFP4)
    if quant is Quant.NVFP4:
        z = b == 0
        v = s0e5m3_to_half(b).float() if act_dtype == "float16" else _bf16_s0e5m3(b)
        v = torch.where(z, torch.zeros_like(v), v)
    else:
        if w4a8:
            b = b - W4A8_E8M0_OFFSET
        bits = b.to(torch.int32) << 7
        v = bits.to(torch.int16).view(torch.bfloat16).float()
    return v.transpose(-1, -2)


def marlin_dequantize(qweight, mscale, mglobal, *, quant: Quant, act_dtype: str, w4a8: bool,
                      n: int, k: int) -> torch.Tensor:
    """int32 [K/16, 2N] + Marlin scales + processed global -> float32 [n, k], as the kernel would."""
    packed = from_marlin_weight(qweight, w4a8=w4a8 and quant is Quant.MXFP4)[..., :n, : k // 2]
    values = e2m1_to_float(unpack_nibbles(packed))
    scales = kernel_scale_values(mscale, quant, act_dtype, w4a8)[..., :n, :]
    group = NVFP4_GROUP if quant is Quant.NVFP4 else MXFP4_GROUP
    scales = scales[..., : k // group]
    blocks = values.reshape(*values.shape[:-1], -1, group)
    if quant is Quant.NVFP4:
        bias = ACT_EXPONENT_BIAS[act_dtype]
        g = mglobal.float().reshape(()) if mglobal is not None else torch.tensor(1.0)
        out = (blocks * 2.0 ** -bias) * scales.unsqueeze(-1) * g
    else:
        out = blocks * scales.unsqueeze(-1)
    return out.reshape(values.shape)


def source_dequantize(p) -> torch.Tensor:
    """ProjectionTensors -> float32 [N, K] (the checkpoint's meaning of the numbers)."""
    if p.quant is Quant.NVFP4:
        g = p.global_scale if p.global_scale is not None else torch.tensor(1.0)
        return dequantize_nvfp4(p.weight.view(torch.uint8), p.scale_bytes.view(torch.float8_e4m3fn), g)
    return dequantize_mxfp4(p.weight.view(torch.uint8), p.scale_bytes)


def gemm_errors(case) -> tuple[float, float]:
    src = case.source
    n, k = src.proj.n, src.proj.k
    gen = torch.Generator().manual_seed(case.seed)
    x = torch.randn(case.rows, k, generator=gen).to(getattr(torch, case.target.act_dtype)).float()
    w_src = source_dequantize(src)
    def dequantize(q, s, n, k):
        return (marlin_dequantize(q, s, case.mglobal, quant=src.quant, act_dtype=case.target.act_dtype, w4a8=case.target.w4a8,
                                  n=n, k=k),)

    if case.tiles is None:
        (w_m,) = dequantize(case.qweight, case.mscale, n, k)
    else:  # each rank's kernel sees its own block (formats/padded_layout.py)
        (w_m,) = decode_rank_blocks((case.qweight, case.mscale), down=src.proj.role is Role.DOWN, t=case.tiles,
                                    decode=dequantize)
    y_src = (x @ w_src.T).double()
    y_m = (x @ w_m.T).double()
    diff = y_m - y_src
    if not torch.isfinite(y_m).all() or not torch.isfinite(y_src).all():
        return float("inf"), float("inf")
    ref = y_src.norm().item()
    err = diff.norm().item()
    rel = err / ref if ref > 0 else (0.0 if err == 0 else float("inf"))
    return rel, diff.abs().max().item()

