"""What both plugins' `marlin_fp4` configs share (no engine import): the engine-facing answers that do not
depend on the engine, the activation dtype table, and the per-expert tensors a conversion keeps only so
that it can be reversed (compressed-tensors' globals), which both plugins must give a place to load into."""

from __future__ import annotations

import torch

from dsv4_convert.core.converted_config import ConvertedQuantConfig
from dsv4_convert.core.engines import QUANT_METHOD
from dsv4_convert.core.tensor_io import act_torch_dtype
from dsv4_convert.core.tensor_model import SourceFormat

__all__ = ["MarlinFp4ConfigMixin", "drop_kept_globals", "register_kept_globals"]

# compressed-tensors NVFP4 keeps its own weight global and the input global per expert projection
# (convert/plan.py writes `<proj>.ct_weight_global_scale` and `<proj>.input_global_scale`): the Marlin
# kernel reads neither, but every tensor of the checkpoint must find a parameter in the engine's loader
_CT_KEPT = ("ct_weight_global_scale", "input_global_scale")


class MarlinFp4ConfigMixin:
    """The `QuantizationConfig` answers that are the same in vLLM and SGLang."""

    spec: ConvertedQuantConfig

    def __init__(self, spec: ConvertedQuantConfig, inner=None, inner_method: str | None = None):
        super().__init__()  # the engine's QuantizationConfig, next in the MRO
        self.spec = spec
        self.inner = inner  # the engine's own config for every non-expert layer, or None
        self.inner_method = inner_method  # the name the engine resolved the source's block to
        self.packed_modules_mapping = getattr(inner, "packed_modules_mapping", None) or {}

    def get_name(self) -> str:
        return QUANT_METHOD

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [act_torch_dtype(self.spec.act_dtype)]

    @classmethod
    def get_min_capability(cls) -> int:
        return 80

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []


def register_kept_globals(layer, register, spec: ConvertedQuantConfig, experts: int, attrs: dict, loader) -> None:
    """Parameters for the per-expert tensors kept only for `marlin-to-source` (compressed-tensors)."""
    if spec.source_format != SourceFormat.NVFP4_CT.value:
        return
    for name in _CT_KEPT:
        register(layer, f"w13_{name}", torch.zeros(experts, 2), attrs, loader)
        register(layer, f"w2_{name}", torch.zeros(experts), attrs, loader)


def drop_kept_globals(layer) -> None:
    """After loading: the kernel never reads them, so they hold no memory while serving."""
    for name in _CT_KEPT:
        for stack in ("w13", "w2"):
            if hasattr(layer, f"{stack}_{name}"):
                delattr(layer, f"{stack}_{name}")
