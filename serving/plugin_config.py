"""What both plugins' `marlin_fp4` configs share (no engine import): the engine-facing answers that do not
depend on the engine, the activation dtype table, and the per-expert tensors a conversion keeps only so
that it can be reversed (compressed-tensors' globals), which both plugins must give a place to load into."""

from __future__ import annotations

import torch

from ..core.checkpoint.tensor_io import act_torch_dtype
from ..core.record.converted_config import ConvertedQuantConfig
from ..core.sources.source_formats import reciprocal_global
from ..core.targets.engines import QUANT_METHOD

__all__ = ["MarlinFp4ConfigMixin", "drop_kept_globals", "keep_globals_as_engine", "register_kept_globals"]

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

    # The engine hands the model's fused-module mapping (`qkv_proj` -> q/k/v_proj) to the config it built:
    # vLLM assigns it (configure_quant_config) or updates it in place (SupportsQuant), SGLang passes it to
    # from_config. The inner config matches its per-layer excludes through it, so it is the inner's own
    # dict that this name reads and writes (a copy taken at construction stays empty).
    @property
    def packed_modules_mapping(self) -> dict:
        inner = getattr(self, "inner", None)
        if inner is None:
            return self.__dict__.setdefault("_packed_modules_mapping", {})
        if getattr(inner, "packed_modules_mapping", None) is None:
            inner.packed_modules_mapping = {}
        return inner.packed_modules_mapping

    @packed_modules_mapping.setter
    def packed_modules_mapping(self, mapping: dict) -> None:
        inner = getattr(self, "inner", None)
        if inner is None:
            self.__dict__["_packed_modules_mapping"] = mapping
        else:
            inner.packed_modules_mapping = mapping

    def __getattr__(self, name: str):
        """Any attribute this config does not have is the inner config's: a model reads the quantisation config's
        fields while it builds and loads (vLLM 0.34's DeepSeek-V4.1 reads `weight_block_size` to name the dense
        FP8 scales, models/deepseek_v41/nvidia/model.py _linear_scale_param_name, and to pad the shared experts,
        _pad_shared_expert_weight), and must read what the engine's own config for the source would answer.
        Only called where normal lookup fails; never for dunder names (copy, pickle)."""
        inner = self.__dict__.get("inner")
        if inner is None or name.startswith("__"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(inner, name)

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
    if not reciprocal_global(spec.source_format):
        return
    for name in _CT_KEPT:
        # fp32, as the engines' compressed-tensors methods create them (a model builds under its bf16 default)
        register(layer, f"w13_{name}", torch.zeros(experts, 2, dtype=torch.float32), attrs, loader)
        register(layer, f"w2_{name}", torch.zeros(experts, dtype=torch.float32), attrs, loader)


def drop_kept_globals(layer) -> None:
    """After loading, where the engine's own method keeps none of them: no memory while serving."""
    for name in _CT_KEPT:
        for stack in ("w13", "w2"):
            if hasattr(layer, f"{stack}_{name}"):
                delattr(layer, f"{stack}_{name}")


def keep_globals_as_engine(layer) -> None:
    """After loading, where the engine's own compressed-tensors method keeps the source's globals as
    parameters (vLLM: `w13_weight_global_scale` [E, 2] and `w13_input_global_scale`, fp32, as loaded):
    the same parameters under the same names (the kernel reads neither)."""
    for stack in ("w13", "w2"):
        kept = getattr(layer, f"{stack}_ct_weight_global_scale", None)
        if kept is not None:
            delattr(layer, f"{stack}_ct_weight_global_scale")
            layer.register_parameter(f"{stack}_weight_global_scale", kept)
