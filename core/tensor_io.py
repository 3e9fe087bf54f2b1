"""The one table between safetensors dtype strings and torch dtypes."""

from __future__ import annotations

import torch

__all__ = ["TORCH_DTYPES", "safetensors_dtype"]

TORCH_DTYPES = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2, "F8_E8M0": torch.float8_e8m0fnu, "I16": torch.int16, "U16": torch.uint16,
    "F16": torch.float16, "BF16": torch.bfloat16, "I32": torch.int32, "U32": torch.uint32, "F32": torch.float32,
    "I64": torch.int64, "U64": torch.uint64, "F64": torch.float64,
}
_BY_TORCH = {v: k for k, v in TORCH_DTYPES.items()}


def safetensors_dtype(t: torch.Tensor) -> str:
    return _BY_TORCH[t.dtype]
