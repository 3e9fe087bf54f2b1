"""safetensors dtype strings -> torch dtypes, from the one dtype table (core/checkpoint/dtypes.py)."""

from __future__ import annotations

import torch

from .dtypes import ACT_DTYPE_NAMES, DTYPES

__all__ = ["TORCH_DTYPES", "act_torch_dtype", "safetensors_dtype"]

TORCH_DTYPES = {name: getattr(torch, torch_name) for name, (_, torch_name) in DTYPES.items()}
_BY_TORCH = {v: k for k, v in TORCH_DTYPES.items()}


def act_torch_dtype(act_dtype: str) -> torch.dtype:
    """An activation dtype name ("bfloat16", "float16") -> its torch dtype."""
    return TORCH_DTYPES[ACT_DTYPE_NAMES[act_dtype]]


def safetensors_dtype(t: torch.Tensor) -> str:
    return _BY_TORCH[t.dtype]
