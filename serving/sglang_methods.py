"""SGLang classes for pre-packed Marlin FP4 experts (imported only by sglang_plugin.register()).

`SglangMarlinFp4Config` serves every non-expert layer with SGLang's own method built from the
checkpoint's `original_quantization_config` (DeepSeek-V4: `Fp8Config`), and the FP4 routed / MTP
experts with the two methods below. Each subclasses SGLang's own Marlin MoE method, creates the
parameters in their final Marlin shapes, loads them with SGLang's expert `weight_loader`, and skips
the repack; `apply` is inherited unchanged.
"""

from __future__ import annotations

import copy
import logging
import re
from functools import partial

import sglang
import torch
from sglang.srt.layers.linear import LinearBase
from sglang.srt.layers.moe import get_moe_runner_backend
from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE, FusedMoeWeightScaleSupported
from sglang.srt.layers.quantization import get_quantization_config, marlin_utils
from sglang.srt.layers.quantization.base_config import QuantizationConfig
from sglang.srt.layers.quantization.fp8 import Fp8Config, Fp8MoEMethod
from sglang.srt.layers.quantization.modelopt_quant import (
    ModelOptFp4Config,
    ModelOptFp8Config,
    ModelOptNvFp4FusedMoEMethod,
)
from sglang.srt.layers.quantization.mxfp4_marlin_moe import Mxfp4MarlinMoEMethod
from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod
from sglang.srt.utils import set_weight_attrs

from ..core.checkpoint.tensor_io import act_torch_dtype
from ..core.sources.source_formats import reciprocal_global
from ..core.targets.engines import ENGINES, QUANT_METHOD
from ..formats.tiles import GROUP_SIZE, roundup
from .config import (
    PluginConfigError,
    checked_source,
    expert_container,
    rank_param_sizes,
)
from .params import register_marlin_params, register_param, same_bytes_loader
from .plugin_config import (
    MarlinFp4ConfigMixin,
    drop_kept_globals,
    register_kept_globals,
)
from .sglang_gpt_oss import bias_copy, gpt_oss_biases_for_marlin, install_gpt_oss_route

__all__ = ["PrepackedMxfp4MarlinMoEMethod", "PrepackedNvFp4MarlinMoEMethod", "SglangMarlinFp4Config",
           "sglang_inner_method"]

_register = partial(register_param, set_weight_attrs=set_weight_attrs)
logger = logging.getLogger("dsv4_convert.serving")

_GROUP = FusedMoeWeightScaleSupported.GROUP.value
_TENSOR = FusedMoeWeightScaleSupported.TENSOR.value


def _require_marlin_runner():
    if not get_moe_runner_backend().is_marlin():
        raise PluginConfigError(
            f"a {QUANT_METHOD} checkpoint holds Marlin-packed experts; start SGLang with "
            f"--moe-runner-backend marlin (got {get_moe_runner_backend()})"
        )


def _rank_sizes(spec, container: str, layer, hidden_size: int, intermediate_size_per_partition: int):
    """(H, I) of this rank's parameters: SGLang passes the unpadded sizes to create_weights (its MXFP4
    Marlin method pads inside); a `--tp/--ep` checkpoint records the padded ones for exactly this split. The tile
    rule is the gated or non-gated one, as the layer is (`moe_runner_config.is_gated`)."""
    gated = getattr(getattr(layer, "moe_runner_config", None), "is_gated", True)
    return rank_param_sizes(spec, container, "sglang", hidden=hidden_size, i_shard=intermediate_size_per_partition,
                            moe_tp=getattr(layer, "moe_tp_size", 1), ep=getattr(layer, "moe_ep_size", 1), gated=gated)


class PrepackedMxfp4MarlinMoEMethod(Mxfp4MarlinMoEMethod):
    """MXFP4 experts already in Marlin order: w13 [E, H/16, 4I] int32, scales [E, H/32, 2I] E8M0."""

    def __init__(self, fp8_method, prefix: str, *, spec, container: str):
        super().__init__(fp8_method, prefix=prefix)
        self.spec, self.container = spec, container

    def create_weights(
        self,
        layer,
        num_experts,
        hidden_size,
        intermediate_size_per_partition,
        params_dtype,
        **extra_weight_attrs,
    ):
        _require_marlin_runner()
        h, i = _rank_sizes(self.spec, self.container, layer, hidden_size, intermediate_size_per_partition)
        layer._dsv4_mxfp4_backend = None
        self.hidden_pad = h - layer.hidden_size  # apply() pads the activations to the weights' H
        e = num_experts
        extra_weight_attrs.pop("weight_loader")  # gpt-oss passes weight_loader_fused: ours are per expert
        with_bias = extra_weight_attrs.pop("with_bias", False)
        loader = same_bytes_loader(layer.weight_loader)
        attrs = {**extra_weight_attrs, "is_transposed": True}
        register_marlin_params(layer, _register, experts=e, hidden=h, intermediate=i, group=32,
                               scale_dtype=torch.float8_e8m0fnu, attrs=attrs, loader=loader,
                               scale_attrs={"quant_method": _GROUP})
        if with_bias:  # gpt-oss: SGLang's Mxfp4MoEMethod shapes, filled by its own gpt-oss bias loading
            install_gpt_oss_route(PrepackedMxfp4MarlinMoEMethod)
            _register(layer, "w13_weight_bias", torch.zeros(e, 2 * i, dtype=torch.bfloat16), {}, bias_copy)
            _register(layer, "w2_weight_bias", torch.zeros(e, h, dtype=torch.bfloat16), {}, bias_copy)

    def process_weights_after_loading(self, layer) -> None:
        # No repack: the tensors are already what SGLang's prepare_moe_mxfp4_layer_for_marlin produces.
        # gpt-oss (gemm1_alpha set): SGLang de-interleaves w13 to [gates; ups] before its repack, which
        # is the converter's w1 / w3 order, so only the biases (loaded interleaved) need SGLang's steps.
        if self.runner.config.gemm1_alpha is not None:
            if not hasattr(layer, "w13_weight_bias"):
                raise PluginConfigError("interleaved (gpt-oss style) MXFP4 experts without biases are not supported")
            gpt_oss_biases_for_marlin(layer)
        layer.workspace = marlin_utils.marlin_make_workspace(layer.w13_weight.device, 4)
        layer._dsv4_mxfp4_backend = "marlin"


class PrepackedNvFp4MarlinMoEMethod(ModelOptNvFp4FusedMoEMethod):
    """NVFP4 experts already in Marlin order, with SGLang's S0E5M3 scale bytes and act-dtype globals."""

    def __init__(self, quant_config, act_dtype: torch.dtype, *, spec, container: str):
        _require_marlin_runner()
        super().__init__(quant_config)
        self.act_dtype = act_dtype
        self.spec, self.container = spec, container

    def create_weights(
        self,
        layer,
        num_experts,
        hidden_size,
        intermediate_size_per_partition,
        params_dtype,
        **extra_weight_attrs,
    ):
        if params_dtype != self.act_dtype:
            raise PluginConfigError(
                f"this checkpoint's NVFP4 globals are stored in {self.act_dtype} but the server runs {params_dtype}; "
                f"start SGLang with --dtype {str(self.act_dtype).removeprefix('torch.')} or re-convert"
            )
        # SGLang never pads gated NVFP4 experts: this refuses any shape that would need it
        h, i = _rank_sizes(self.spec, self.container, layer, hidden_size, intermediate_size_per_partition)
        layer.intermediate_size_per_partition = intermediate_size_per_partition
        layer.params_dtype = params_dtype
        layer.quant_config = self.quant_config
        layer.w13_blockscale_swizzled = layer.w2_blockscale_swizzled = None
        e = layer.num_local_experts
        loader = same_bytes_loader(extra_weight_attrs.pop("weight_loader"))
        attrs = {**extra_weight_attrs, "is_transposed": True}
        # gated experts: w13 = gate | up; non-gated (Nemotron-H, relu2): up alone, and one global per
        # expert, as SGLang's own method creates them (`num_shards = 2 if is_gated else 1`); its Marlin
        # preparation pads a non-gated I with zeros (core/targets/engines.py, the non-gated NVFP4 PadRule), which SGLang's
        # loader gives a buffer of that size (zero tail) with no repack: the Marlin tiles of the padding
        # are the last N tiles of w13 and the last K tiles of w2
        gated = layer.moe_runner_config.is_gated
        shards, per_expert = (2, (e, 2)) if gated else (1, (e,))
        i = i if gated else roundup(i, ENGINES["sglang"].padding.pad_rule("nvfp4", gated=False).i_multiple)
        register_marlin_params(layer, _register, experts=e, hidden=h, intermediate=i, group=16,
                               scale_dtype=torch.float8_e4m3fn, attrs=attrs, loader=loader,
                               scale_attrs={"quant_method": _GROUP}, w13_shards=shards)
        tensor_attrs = {**extra_weight_attrs, "quant_method": _TENSOR}
        # processed globals (what the kernel multiplies by) and the original ModelOpt globals
        _register(
            layer, "w13_weight_global_scale", torch.zeros(per_expert, dtype=params_dtype), tensor_attrs, loader
        )
        _register(layer, "w2_weight_global_scale", torch.zeros(e, dtype=params_dtype), tensor_attrs, loader)
        _register(layer, "w13_weight_scale_2", torch.zeros(per_expert, dtype=torch.float32), tensor_attrs, loader)
        _register(layer, "w2_weight_scale_2", torch.zeros(e, dtype=torch.float32), tensor_attrs, loader)
        for name, shape in (
            ("w13_input_scale", (layer.num_experts, shards)),
            ("w2_input_scale", (layer.num_experts,)),
        ):
            p = _register(layer, name, torch.ones(shape, dtype=torch.float32), tensor_attrs, loader)
            p._sglang_require_global_experts = True
        register_kept_globals(layer, _register, self.spec, e, tensor_attrs, loader)

    def process_weights_after_loading(self, layer) -> None:
        # SGLang keeps only the gate's global for w13 (as in its own Marlin branch) and stores the
        # processed global in the activation dtype, shape [E].
        g13 = layer.w13_weight_global_scale.data  # non-gated: [E], one global per expert, kept as loaded
        if g13.dim() == 2:  # gated: [E, 2], the gate's kept
            if not torch.equal(g13[:, 0].view(torch.int16), g13[:, 1].view(torch.int16)):
                logger.warning(
                    "dsv4-convert: gate and up global scales differ for %s; SGLang uses the gate's "
                    "(as it does for unconverted checkpoints)",
                    getattr(layer, "layer_name", "experts"),
                )
            g13 = g13[:, 0]
        layer.w13_weight_scale_2 = torch.nn.Parameter(g13.contiguous(), requires_grad=False)
        layer.w2_weight_scale_2 = torch.nn.Parameter(
            layer.w2_weight_global_scale.data.clone(), requires_grad=False
        )
        del layer.w13_weight_global_scale, layer.w2_weight_global_scale
        if reciprocal_global(self.spec.source_format):
            # SGLang's own Marlin path for this source (CompressedTensorsW4A16Nvfp4MoE) keeps no input scale
            del layer.w13_input_scale, layer.w2_input_scale
        drop_kept_globals(layer)
        layer.workspace = marlin_utils.marlin_make_workspace(layer.w13_weight.device, 4)


class SglangMarlinFp4Config(MarlinFp4ConfigMixin, QuantizationConfig):
    """quant_method `marlin_fp4` for SGLang: our experts, the engine's own method for everything else."""

    @classmethod
    def from_config(cls, config: dict) -> SglangMarlinFp4Config:
        spec, block = checked_source(config, engine="sglang", engine_version=sglang.__version__)
        if block is None:
            return cls(spec, None)
        # only hf_quant_config.json had one, or the converter found config.json's stale (serves_from)
        from_file = spec.original_quantization_config is None or spec.serves_from is not None
        name, resolved = sglang_inner_method(block, from_file=from_file)
        # what SGLang's get_quant_config adds before from_config (it passes both to ours too)
        resolved.update({k: config[k] for k in ("packed_modules_mapping", "hf_config") if k in config})
        inner = _inner_class(name, resolved, from_file).from_config(resolved)
        if isinstance(inner, Fp8Config):
            # what SGLang's model loader sets for a DSv4 checkpoint with FP4 experts
            inner.is_fp4_experts = True
            return SglangMarlinFp4OverFp8Config(spec, inner, name)
        return cls(spec, inner, name)

    def apply_weight_name_mapper(self, hf_to_sglang_mapper) -> None:
        # the model's checkpoint -> module name mapper (Nemotron-H: `backbone.` -> `model.`), which SGLang's
        # loader applies to the config it built: the inner config's excludes are checkpoint names too
        if self.inner is not None:
            self.inner.apply_weight_name_mapper(hf_to_sglang_mapper)

    def get_scaled_act_names(self) -> list[str]:
        return self.inner.get_scaled_act_names() if self.inner is not None else []

    def can_fuse_shared_expert(self) -> bool:
        """No: SGLang fuses a DeepSeek-V3 / GLM-5 shared expert into the routed FusedMoE as one more expert, by
        default for 256 routed + 1 shared on sm_80 and newer, unless the config says it cannot (deepseek_v2.py
        shared_experts_fusion_disable_reason -> deepseek_common/utils.py quant_blocks_shared_experts_fusion). The
        conversion holds the routed experts alone in Marlin order; the shared expert keeps the source's own format
        and method, so it cannot join those buffers."""
        return False

    def _num_hidden_layers(self):
        try:
            from sglang.srt.runtime_context import process_model_config

            return process_model_config().hf_config.num_hidden_layers
        except Exception:  # noqa: BLE001 - no published model config (e.g. tests): MTP by prefix only
            return None

    def get_quant_method(self, layer, prefix: str):
        if isinstance(layer, FusedMoE):
            container = expert_container(self.spec, prefix, num_hidden_layers=self._num_hidden_layers())
            if container is not None:
                fmt = self.spec.format_of(container)
                if fmt == "mxfp4":
                    fp8_method = Fp8MoEMethod(self.inner) if isinstance(self.inner, Fp8Config) else None
                    return PrepackedMxfp4MarlinMoEMethod(fp8_method, prefix=prefix, spec=self.spec,
                                                         container=container)
                nvfp4 = ModelOptFp4Config(
                    is_checkpoint_nvfp4_serialized=True, group_size=GROUP_SIZE["nvfp4"], exclude_modules=[]
                )
                return PrepackedNvFp4MarlinMoEMethod(nvfp4, act_torch_dtype(self.spec.act_dtype), spec=self.spec,
                                                     container=container)
        if self.inner is None:
            return None
        if self.inner_method == "modelopt_fp4" and _NEXTN_DRAFT.search(prefix):
            # SGLang builds a NextN / MTP draft (_NEXTN_DRAFT) with no quant config when the target's is
            # modelopt_fp4: the draft layer the converter copied gets the same methods
            return UnquantizedLinearMethod() if isinstance(layer, LinearBase) else None
        return self.inner.get_quant_method(layer, prefix)


class SglangMarlinFp4OverFp8Config(SglangMarlinFp4Config, Fp8Config):
    """Ours over a block-FP8 source (DeepSeek-V4): an Fp8Config holding the inner's state, as SGLang's own
    HybridFp8NvFp4Config is. SGLang's DeepSeek-V4 model keeps `wo_a` in FP8 only when the model's config
    is an Fp8Config with 128x128 blocks (`wo_a_fp8_gemm_enabled`) and dequantises it to bf16 otherwise."""

    def __init__(self, spec, inner, inner_method=None):
        super().__init__(spec, inner, inner_method)  # Fp8Config's defaults, then the inner's values
        self.__dict__.update({k: v for k, v in vars(inner).items() if k not in ("spec", "inner", "inner_method")})


# the draft modules SGLang builds with no quant config for a serialized modelopt_fp4 target: DeepseekModelNextN /
# Glm4MoeModelNextN at `model.decoder`; Qwen3.5's and Qwen4-Exp's MTP model (qwen3_5_mtp.py _mtp_quant_config:
# "Serialized Qwen3.5 ModelOpt checkpoints keep embedded MTP weights in BF16") at `mtp`. Not Qwen4-Exp's head
# `model.shared_head.head`, which DeepSeek's NextN draft quantises under the same name
_NEXTN_DRAFT = re.compile(r"^model\.decoder\.|^mtp\.")


def sglang_inner_method(block: dict, *, from_file: bool) -> tuple[str, dict]:
    """(method name, the block as SGLang hands it to from_config): SGLang's own lookup on the source's
    block (ModelConfig._parse_quant_hf_config and _verify_quantization's override walk). `from_file`:
    the block is hf_quant_config.json's, which SGLang reads only when config.json has none."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.layers.quantization import QUANTIZATION_METHODS

    resolved = copy.deepcopy(block)
    if from_file:
        method_cfg = ModelConfig._parse_modelopt_quant_config(None, resolved) or {}
    else:
        if resolved.get("quant_method", "modelopt") == "modelopt":
            resolved.update(ModelConfig._parse_modelopt_quant_config(None, {"quantization": resolved}) or {})
        method_cfg = resolved
    name = str(method_cfg.get("quant_method", "")).lower()
    for method in QUANTIZATION_METHODS.values():
        override = method.override_quantization_method(method_cfg, None)
        if override:
            name = override
            break
    return name, resolved


def _inner_class(name: str, resolved: dict, from_file: bool):
    """The class SGLang's get_quant_config builds: from hf_quant_config.json, ModelOpt FP8 / FP4 by
    quant_algo (model_loader/weight_utils.py); otherwise the resolved method's class."""
    if from_file and name.startswith("modelopt"):
        algo = str((resolved.get("quantization") or resolved).get("quant_algo") or "")
        if algo == "FP8" or name == "modelopt_fp8":
            return ModelOptFp8Config
        if "FP4" in algo:
            return ModelOptFp4Config
    return get_quantization_config(name)
