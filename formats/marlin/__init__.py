"""The Marlin FP4 layout, one folder by role: `projection` (the projection-level API, source <-> Marlin tensors
for a target, on torch), `weight` / `scales` (the weight and scale layouts on torch, each with its inverse),
`reference_weight` / `reference_scales` (THE REFERENCE, numpy), `compiled_kernels` (numba) and `torch_route`.

The projection API is also reachable here (`from ...formats.marlin import nvfp4_to_marlin`), loaded on first
use: importing the numpy reference or the compiled kernels must not import torch (the CPU route never does)."""

from __future__ import annotations

import importlib

__all__ = ["marlin_to_mxfp4", "marlin_to_nvfp4", "mxfp4_source_for", "mxfp4_to_marlin", "nvfp4_source_for",
           "nvfp4_to_marlin"]


def __getattr__(name: str):
    # only the projection API: any other name (a submodule, `from . import compiled_kernels`) must fall
    # through to the import system, which loads that submodule without torch
    if name not in __all__ and name != "_pad_last2":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(".projection", __name__), name)
