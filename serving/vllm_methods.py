"""vLLM MoE methods for pre-packed Marlin FP4 experts (imported only through vllm_config.py, which
vllm_plugin.register() imports).

The FP4 routed / MTP experts are served by the two methods below. Each subclasses vLLM's own MoE method that runs the
Marlin backend, creates the parameters in their final Marlin shapes, loads them with vLLM's expert
`weight_loader`, skips the repack and builds the same Marlin kernel; `apply` is inherited unchanged.
"""

from __future__ import annotations

import logging
from functools import partial

import torch
import vllm
from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import Mxfp4MoeBackend
from vllm.model_executor.layers.fused_moe.oracle.nvfp4 import NvFp4MoeBackend
from vllm.model_executor.layers.fused_moe.routed_experts import FusedMoeWeightScaleSupported
from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4FusedMoE
from vllm.model_executor.layers.quantization.mxfp4 import Mxfp4MoEMethod
from vllm.model_executor.layers.quantization.utils import marlin_utils
from vllm.model_executor.layers.quantization.utils.layer_utils import replace_parameter
from vllm.model_executor.utils import set_weight_attrs

from ..core.checkpoint.tensor_io import act_torch_dtype
from ..core.sources.source_formats import FORMATS, reciprocal_global
from ..core.targets.engines import ENGINES, QUANT_METHOD, release_for
from ..formats.marlin.scales import (
    nvfp4_global_to_marlin,
    nvfp4_scales_to_s0e5m3,
    s0e5m3_to_nvfp4_scales,
    vllm_rescale_factor,
)
from ..formats.tiles import GROUP_SIZE
from .config import (
    PluginConfigError,
    rank_param_sizes,
)
from .params import register_marlin_params, register_param, same_bytes_loader, w4a8_w13_final
from .plugin_config import keep_globals_as_engine, register_kept_globals

__all__ = ["PrepackedMxfp4MarlinMoE", "PrepackedNvFp4MarlinMoE", "rank_rescale"]

_register = partial(register_param, set_weight_attrs=set_weight_attrs)
logger = logging.getLogger("dsv4_convert.serving")

_GROUP = FusedMoeWeightScaleSupported.GROUP.value
_TENSOR = FusedMoeWeightScaleSupported.TENSOR.value
_MARLIN_HINT = "start vLLM with --moe-backend marlin"
def _rank_sizes(spec, container, parallel, hidden_size, intermediate_size_per_partition, gated=True):
    """(H, I) of this rank's parameters: the unpadded sizes vLLM's layer has, or the padded ones a
    `--tp/--ep` checkpoint records for exactly this split (serving/config.py rank_param_sizes); `gated`: the
    layer's `is_act_and_mul` (the tile rule's w13 is gate | up, or up alone)."""
    return rank_param_sizes(spec, container, "vllm", hidden=hidden_size, i_shard=intermediate_size_per_partition,
                            moe_tp=parallel.tp_size, ep=parallel.ep_size, gated=gated)


def _create_marlin_params(layer, fmt, e, h, i, extra_weight_attrs, w4a8=False, w13_shards=2):
    loader = same_bytes_loader(extra_weight_attrs.pop("weight_loader"))
    for key in ("global_num_experts", "unpadded_hidden_size"):
        extra_weight_attrs.pop(key, None)
    attrs = {**extra_weight_attrs, "is_transposed": True}
    register_marlin_params(
        layer, _register, experts=e, hidden=h, intermediate=i, group=GROUP_SIZE[fmt],
        scale_dtype=torch.float8_e4m3fn if fmt == "nvfp4" else torch.uint8,  # E8M0 arrives viewed as uint8
        attrs=attrs, loader=loader, scale_attrs={"quant_method": _GROUP}, w4a8=w4a8, w13_shards=w13_shards,
    )
    return loader, extra_weight_attrs


def _check_w4a8(spec) -> None:
    """W4A8 (`--w4a8`) bytes use vLLM's fp8-activation tile layout and scale offset: they need the
    Marlin kernel vLLM builds with VLLM_MARLIN_INPUT_DTYPE=fp8, and W4A16 bytes need it unset. A release
    without W4A8 (the engine table: vLLM >= 0.34 removed it, and `get_marlin_input_dtype` with it) runs
    W4A16 only; check_layout already refused a W4A8 checkpoint there, before anything was built."""
    if not release_for("vllm", vllm.__version__).w4a8:
        return
    act = marlin_utils.get_marlin_input_dtype()  # what vLLM's repack and MarlinExperts read
    if spec.w4a8 and act != torch.float8_e4m3fn:
        raise PluginConfigError(
            "this checkpoint was converted with --w4a8 (MXFP4 weights for fp8 activations); start vLLM "
            "with VLLM_MARLIN_INPUT_DTYPE=fp8, or re-convert without --w4a8"
        )
    if not spec.w4a8 and act is not None:
        raise PluginConfigError(
            f"vLLM runs Marlin with {act} activations (VLLM_MARLIN_INPUT_DTYPE) but this checkpoint was "
            "converted for 16-bit activations; unset VLLM_MARLIN_INPUT_DTYPE, or re-convert with --w4a8"
        )


def _compressed_tensors(spec) -> bool:
    """vLLM builds its compressed-tensors MoE method for a compressed-tensors source (core/sources/source_formats.py
    rows with a `ct_format`), unless the model's architecture hook swaps the block for its native method (Kimi-K3's
    MXFP4: core/targets/engines.py native_ct)."""
    row = FORMATS.get(spec.source_format) if isinstance(spec.source_format, str) else None
    return ENGINES["vllm"].builds_ct_method(row.ct_format if row else None, spec.source_model_type)


def _ct_mxfp4_method():
    """vLLM's MoE method for a compressed-tensors MXFP4 source (imported on use, as vLLM itself imports it)."""
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe import (
        compressed_tensors_moe_w4a4_mxfp4 as ct,
    )
    return ct.CompressedTensorsW4A4Mxfp4MoEMethod


class PrepackedMxfp4MarlinMoE(Mxfp4MoEMethod):
    """MXFP4 experts already in Marlin order (what vLLM's prepare_moe_mxfp4_layer_for_marlin makes)."""

    def __init__(self, moe, activation_key=None, *, spec, container: str):
        super().__init__(moe, activation_key=activation_key)
        self.spec, self.container = spec, container
        if self.mxfp4_backend not in (Mxfp4MoeBackend.MARLIN, Mxfp4MoeBackend.BATCHED_MARLIN):
            raise PluginConfigError(
                f"{QUANT_METHOD} experts are Marlin-packed but vLLM chose the "
                f"{self.mxfp4_backend.value} MoE backend; {_MARLIN_HINT}"
            )
        _check_w4a8(spec)

    def maybe_roundup_sizes(self, hidden_size, intermediate_size_per_partition, act_dtype, moe_parallel_config):
        self.unpadded_sizes = (hidden_size, intermediate_size_per_partition)
        # vLLM rounds MXFP4 Marlin sizes up here and passes the result to create_weights; the unpadded sizes are only
        # seen here, so the layout is checked here, against the sizes vLLM's own method for the SOURCE gives
        # (core/targets/engines.py ct_padding): Mxfp4MoEMethod's I -> 128, H -> 256, but a compressed-tensors source
        # gets CompressedTensorsW4A4Mxfp4MoEMethod, which inherits FusedMoEMethodBase's (no MXFP4 padding)
        sizes = (hidden_size, intermediate_size_per_partition, act_dtype, moe_parallel_config)
        if _compressed_tensors(self.spec):
            engine = _ct_mxfp4_method().maybe_roundup_sizes(self, *sizes)
        else:
            engine = super().maybe_roundup_sizes(*sizes)
        ours = _rank_sizes(self.spec, self.container, moe_parallel_config, hidden_size,
                           intermediate_size_per_partition)
        if tuple(engine) != ours:
            raise PluginConfigError(
                f"{self.container}: vLLM {vllm.__version__} pads this layer's MXFP4 experts to H, I = "
                f"{tuple(engine)} per rank but the checkpoint holds {ours}; re-convert for this vLLM"
            )
        return engine

    def create_weights(
        self,
        layer,
        num_experts,
        hidden_size,
        intermediate_size_per_partition,
        params_dtype,
        **extra_weight_attrs,
    ):
        # sizes already checked (and, for a --tp/--ep checkpoint, padded) in maybe_roundup_sizes
        self.num_experts = layer.num_experts = num_experts
        layer.params_dtype = params_dtype
        self.intermediate_size, self.hidden_size = intermediate_size_per_partition, hidden_size
        _create_marlin_params(
            layer,
            "mxfp4",
            num_experts,
            hidden_size,
            intermediate_size_per_partition,
            dict(extra_weight_attrs),
            w4a8=self.spec.w4a8,
        )

    def process_weights_after_loading(self, layer) -> None:
        if self.spec.w4a8:
            replace_parameter(layer, "w13_weight", w4a8_w13_final(layer.w13_weight.data))
        for name in ("w13_weight_scale", "w2_weight_scale"):
            replace_parameter(layer, name, getattr(layer, name).data.view(torch.float8_e8m0fnu))
        if _compressed_tensors(self.spec) and release_for("vllm", vllm.__version__).keeps_moe_input_scales:
            for stack in ("w13", "w2"):  # vLLM's CT MXFP4 method keeps the checkpoint name too (move_parameter)
                layer.register_parameter(f"{stack}_weight_packed", getattr(layer, f"{stack}_weight"))
        self._build_moe_kernel(layer)  # no repack: build vLLM's Marlin kernel on the loaded tensors


def rank_rescale(
    scale_bytes: torch.Tensor, *, stored_sf: float, act_dtype: str
) -> tuple[float, torch.Tensor, int]:
    """vLLM picks its bf16 power-of-two factor over the experts *this rank* holds. Returns (rank_sf,
    bytes re-encoded for it, count of zero bytes that may have been clamped at conversion)."""
    scales = s0e5m3_to_nvfp4_scales(scale_bytes.view(torch.uint8), sf=stored_sf)
    sf = vllm_rescale_factor(scales, act_dtype)
    if sf == stored_sf:
        return sf, scale_bytes, 0
    new = nvfp4_scales_to_s0e5m3(scales, clamp=ENGINES["vllm"].scale_clamp, sf=sf).view(torch.float8_e4m3fn)
    zeros = int((scale_bytes.view(torch.uint8) == 0).sum()) if sf > stored_sf else 0
    return sf, new, zeros


class PrepackedNvFp4MarlinMoE(ModelOptNvFp4FusedMoE):
    """NVFP4 experts already in Marlin order, with vLLM's S0E5M3 scale bytes and fp32 globals / sf."""

    def __init__(self, quant_config, moe_config, *, spec, container: str):
        super().__init__(quant_config, moe_config)
        if self.nvfp4_backend != NvFp4MoeBackend.MARLIN:
            raise PluginConfigError(
                f"{QUANT_METHOD} experts are Marlin-packed but vLLM chose the "
                f"{self.nvfp4_backend.value} MoE backend; {_MARLIN_HINT}"
            )
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
        if params_dtype != act_torch_dtype(self.spec.act_dtype):
            raise PluginConfigError(
                f"this NVFP4 checkpoint was converted for {self.spec.act_dtype} activations "
                f"but vLLM runs {params_dtype}; use --dtype {self.spec.act_dtype} or re-convert"
            )
        # vLLM pads NVFP4 I per rank only inside its repack: the parameters of a --tp/--ep checkpoint
        # are created at the padded size here (layer.intermediate_size_per_partition stays unpadded,
        # as it does in vLLM's own path)
        h, i = _rank_sizes(self.spec, self.container, layer.moe_config.moe_parallel_config, hidden_size,
                           intermediate_size_per_partition, gated=self.moe.is_act_and_mul)
        layer.num_experts, layer.params_dtype, layer.quant_config = (
            num_experts,
            params_dtype,
            self.quant_config,
        )
        global_experts = extra_weight_attrs.get("global_num_experts", num_experts)
        e = num_experts
        pad = i - intermediate_size_per_partition  # zero scale bytes the padding holds by construction
        # gated experts: w13 = gate | up; non-gated (Nemotron-H, relu2): up alone, as vLLM's own method
        # creates it (`w13_num_shards = 2 if self.moe.is_act_and_mul else 1`)
        shards = 2 if self.moe.is_act_and_mul else 1
        self.padding_scale_bytes = {"w13": e * shards * pad * (h // 16), "w2": e * h * (pad // 16)}
        loader, attrs = _create_marlin_params(layer, "nvfp4", e, h, i, dict(extra_weight_attrs), w13_shards=shards)
        t = {**attrs, "quant_method": _TENSOR}
        # every global and input scale in fp32, as ModelOptNvFp4FusedMoE creates them: vLLM builds the
        # model under its dtype, so a tensor created without one would be bf16 and round the globals
        f32 = torch.float32
        _register(layer, "w13_weight_global_scale", torch.zeros(e, shards, dtype=f32), t, loader)  # processed
        _register(layer, "w2_weight_global_scale", torch.zeros(e, dtype=f32), t, loader)
        _register(layer, "w13_weight_scale_2", torch.zeros(e, shards, dtype=f32), t, loader)  # ModelOpt's globals
        _register(layer, "w2_weight_scale_2", torch.zeros(e, dtype=f32), t, loader)
        n_in = global_experts if self.use_global_sf else e
        _register(layer, "w13_input_scale", torch.ones(n_in, shards, dtype=f32), t, loader)
        _register(layer, "w2_input_scale", torch.ones(n_in, dtype=f32), t, loader)
        register_kept_globals(layer, _register, self.spec, e, t, loader)

    def process_weights_after_loading(self, layer) -> None:
        act = self.spec.act_dtype
        # leave exactly the parameters vLLM's own NVFP4 MoE method leaves for this release (the engine table;
        # check_layout refused any release it does not list before the layer was built)
        keeps = release_for("vllm", vllm.__version__).keeps_moe_input_scales
        self.rank_rescale_factors = {}
        for stack, gname in (("w13", "w13_weight_global_scale"), ("w2", "w2_weight_global_scale")):
            stored = self.spec.rescale_factors.get(f"{self.container}.{stack}", 1.0)
            processed = getattr(layer, gname).data
            processed = processed[:, 0] if processed.dim() == 2 else processed
            sf, new_bytes, zeros = rank_rescale(
                getattr(layer, f"{stack}_weight_scale").data, stored_sf=stored, act_dtype=act
            )
            zeros = max(0, zeros - getattr(self, "padding_scale_bytes", {}).get(stack, 0))
            self.rank_rescale_factors[stack] = (stored, sf)
            if sf != stored:
                # expert parallel: this rank's experts give another factor than the whole layer's
                replace_parameter(layer, f"{stack}_weight_scale", new_bytes)
                original = getattr(layer, f"{stack}_weight_scale_2").data
                original = original[:, 0] if original.dim() == 2 else original
                processed = nvfp4_global_to_marlin(original, fp32_global=ENGINES["vllm"].fp32_global, act_dtype=act, sf=sf)
                if zeros:
                    logger.warning(
                        "dsv4-convert: %s %s: %d scale bytes were 0 at conversion; with this rank's "
                        "rescale factor %g (stored %g) tiny source scales could have become non-zero",
                        self.container,
                        stack,
                        zeros,
                        sf,
                        stored,
                    )
            replace_parameter(layer, f"{stack}_weight_scale_2", processed.float().contiguous())
            delattr(layer, gname)
            if not (keeps and not reciprocal_global(self.spec.source_format)):
                replace_parameter(layer, f"{stack}_input_scale", None)
        keep_globals_as_engine(layer)  # compressed-tensors: vLLM's own method keeps the source's globals
        if keeps and reciprocal_global(self.spec.source_format):
            for stack in ("w13", "w2"):  # a second name of one parameter: no memory
                layer.register_parameter(f"{stack}_weight_packed", getattr(layer, f"{stack}_weight"))
        self._build_moe_kernel(layer)  # no repack: build vLLM's Marlin kernel on the loaded tensors
