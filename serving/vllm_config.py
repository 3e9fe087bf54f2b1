"""quant_method `marlin_fp4` for vLLM (imported only by vllm_plugin.register()).

`VllmMarlinFp4Config` serves every non-expert layer with the config vLLM itself builds for the source's
own quantisation block (config.json's, or hf_quant_config.json's when config.json had none), resolved
by vLLM's own lookup: ModelOpt NVFP4 -> `modelopt_fp4`, MIXED_PRECISION -> `modelopt_mixed`,
compressed-tensors, DeepSeek-V4 `fp8` -> `deepseek_v4_fp8`. The FP4 routed / MTP experts get the
methods of vllm_methods.py and vllm_gpt_oss.py.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import vllm
from vllm.model_executor.layers.fused_moe import RoutedExperts
from vllm.model_executor.layers.quantization import get_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config
from vllm.model_executor.models.gpt_oss import GptOssRoutedExperts

from ..formats.tiles import GROUP_SIZE
from .config import (
    PluginConfigError,
    checked_source,
    expert_container,
)
from .plugin_config import MarlinFp4ConfigMixin
from .vllm_gpt_oss import PrepackedGptOssMxfp4MarlinMoE
from .vllm_methods import PrepackedMxfp4MarlinMoE, PrepackedNvFp4MarlinMoE

__all__ = ["VllmMarlinFp4Config", "vllm_inner_method"]


class VllmMarlinFp4Config(MarlinFp4ConfigMixin, QuantizationConfig):
    """quant_method `marlin_fp4` for vLLM: our experts, vLLM's own config for everything else."""

    @classmethod
    def from_config(cls, config: dict) -> VllmMarlinFp4Config:
        spec, block = checked_source(config, engine="vllm", engine_version=vllm.__version__)
        if block is None:
            return cls(spec, None)
        name, resolved = vllm_inner_method(block, _hf_config() or SimpleNamespace(model_type=spec.source_model_type))
        if name == "modelopt_mixed" and "quantized_layers" not in resolved and spec.original_hf_quant_config:
            resolved = copy.deepcopy(spec.original_hf_quant_config)  # vLLM reads hf_quant_config.json then
        return cls(spec, get_quantization_config(name).from_config(resolved), name)

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
        from vllm.config import get_current_vllm_config_or_none

        current = get_current_vllm_config_or_none()
        return getattr(getattr(current, "model_config", None), "hf_config", None)
    except Exception:  # noqa: BLE001 - no current vllm config yet: decide from the recorded model_type
        return None


def _num_hidden_layers():
    return getattr(_hf_config(), "num_hidden_layers", None)


def vllm_inner_method(block: dict, hf_config) -> tuple[str, dict]:
    """(method name, the block as vLLM hands it to that method's from_config): vLLM's own lookup, run on
    the source's block: `_normalize_quantization_config` (ModelOpt quant_algo -> quant_method), then
    `ModelConfig._verify_quantization`'s ordered walk over every method's override hook. Both are
    called on stand-ins that hold only the attributes they read."""
    from vllm.config.model import ModelConfig
    from vllm.transformers_utils.model_arch_config_convertor import ModelArchConfigConvertorBase

    normalized = ModelArchConfigConvertorBase._normalize_quantization_config(
        None, SimpleNamespace(quantization_config=copy.deepcopy(block)))
    probe = SimpleNamespace(quantization=None, hf_config=hf_config, allow_deprecated_quantization=True,
                            model_arch_config=SimpleNamespace(quantization_config=normalized))
    ModelConfig._verify_quantization(probe)
    if probe.quantization == "compressed-tensors" and "config_groups" in normalized:
        heads = getattr(hf_config, "num_attention_heads", None)  # what get_quant_config adds
        normalized["total_num_heads"] = heads
        normalized["total_num_kv_heads"] = getattr(hf_config, "num_key_value_heads", None) or heads
    return probe.quantization, normalized
