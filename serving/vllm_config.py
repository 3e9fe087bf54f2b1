"""quant_method `marlin_fp4` for vLLM (imported only by vllm_plugin.register()).

`VllmMarlinFp4Config` serves every non-expert layer with vLLM's own config built from the
checkpoint's `original_quantization_config` (DeepSeek-V4: `DeepseekV4FP8Config`), and the FP4
routed / MTP experts with the methods of vllm_methods.py and vllm_gpt_oss.py.
"""

from __future__ import annotations

import torch
import vllm
from vllm.model_executor.layers.fused_moe import RoutedExperts
from vllm.model_executor.layers.quantization import get_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config
from vllm.model_executor.models.gpt_oss import GptOssRoutedExperts

from dsv4_convert.formats.tiles import GROUP_SIZE
from dsv4_convert.serving.config import (
    QUANT_METHOD,
    PluginConfigError,
    check_layout,
    expert_container,
    parse_quant_config,
)
from dsv4_convert.serving.vllm_gpt_oss import PrepackedGptOssMxfp4MarlinMoE
from dsv4_convert.serving.vllm_methods import PrepackedMxfp4MarlinMoE, PrepackedNvFp4MarlinMoE

__all__ = ["VllmMarlinFp4Config"]

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


class VllmMarlinFp4Config(QuantizationConfig):
    """quant_method `marlin_fp4` for vLLM: our experts, vLLM's own config for everything else."""

    def __init__(self, spec, inner: QuantizationConfig | None):
        super().__init__()
        self.spec = spec
        self.inner = inner
        self.packed_modules_mapping = (
            getattr(inner, "packed_modules_mapping", {}) if inner is not None else {}
        )

    @classmethod
    def from_config(cls, config: dict) -> VllmMarlinFp4Config:
        spec = parse_quant_config(config)
        check_layout(spec, engine="vllm", engine_version=vllm.__version__)
        original = spec.original_quantization_config
        inner = None
        if original is not None:
            inner = get_quantization_config(_inner_method(original)).from_config(original)
        return cls(spec, inner)

    def get_name(self):
        return QUANT_METHOD

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [_DTYPES[self.spec.act_dtype]]

    @classmethod
    def get_min_capability(cls) -> int:
        return 80

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []

    def apply_vllm_mapper(self, hf_to_vllm_mapper):
        if self.inner is not None:
            self.inner.apply_vllm_mapper(hf_to_vllm_mapper)

    def get_quant_method(self, layer, prefix: str):
        if isinstance(layer, RoutedExperts):
            container = expert_container(self.spec, prefix, num_hidden_layers=_num_hidden_layers())
            if container is not None:
                if isinstance(layer, GptOssRoutedExperts):
                    if self.spec.format_of(container) != "mxfp4":
                        raise PluginConfigError(f"{container}: gpt-oss experts are MXFP4; this checkpoint "
                                                f"records {self.spec.format_of(container)}")
                    return PrepackedGptOssMxfp4MarlinMoE(layer.moe_config, spec=self.spec, container=container)
                if self.spec.format_of(container) == "mxfp4":
                    return PrepackedMxfp4MarlinMoE(layer.moe_config, spec=self.spec, container=container)
                nvfp4 = ModelOptNvFp4Config(
                    is_checkpoint_nvfp4_serialized=True,
                    kv_cache_quant_algo=None,
                    exclude_modules=[],
                    group_size=GROUP_SIZE["nvfp4"],
                )
                return PrepackedNvFp4MarlinMoE(nvfp4, layer.moe_config, spec=self.spec, container=container)
        return None if self.inner is None else self.inner.get_quant_method(layer, prefix)


def _hf_config():
    try:
        from vllm.config import get_current_vllm_config

        return get_current_vllm_config().model_config.hf_config
    except Exception:  # noqa: BLE001 - no current vllm config yet: decide without hf_config
        return None


def _num_hidden_layers():
    return getattr(_hf_config(), "num_hidden_layers", None)


def _inner_method(original: dict) -> str:
    """The vLLM method name for the original block, as vLLM itself resolves it (DeepSeek-V4 `fp8`
    becomes `deepseek_v4_fp8` through that config's override hook)."""
    from vllm.models.deepseek_v4 import DeepseekV4FP8Config

    hf = _hf_config()
    if getattr(hf, "model_type", "deepseek_v4") == "deepseek_v4" and original.get("quant_method") in (
        "fp8",
        "deepseek_v4_fp8",
    ):
        return "deepseek_v4_fp8"
    return DeepseekV4FP8Config.override_quantization_method(original, None, hf) or original["quant_method"]
