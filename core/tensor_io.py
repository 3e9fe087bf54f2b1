"""safetensors dtype strings -> torch dtypes, from the one dtype table (core/dtypes.py)."""

from __future__ import annotations

import torch

from dsv4_convert.core.dtypes import DTYPES

__all__ = ["TORCH_DTYPES", "safetensors_dtype"]

TORCH_DTYPES = {name: getattr(torch, torch_name) for name, (_, torch_name) in DTYPES.items()}
_BY_TORCH = {v: k for k, v in TORCH_DTYPES.items()}


def safetensors_dtype(t: torch.Tensor) -> str:
    return _BY_TORCH[t.dtype]
