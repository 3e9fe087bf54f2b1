"""gpt-oss MXFP4 experts through the vLLM plugin (docs/SERVING.md "gpt-oss").

The converter writes gpt-oss experts per expert as `<experts>.<e>.gate_proj|up_proj|down_proj.weight`
/ `.weight_scale` in Marlin order, gate and up DE-interleaved (two tensors), and keeps the biases
`gate_up_proj_bias` [E, 2I] (gate/up interleaved) and `down_proj_bias` [E, H] as source bytes.
vLLM's own gpt-oss Marlin path packs w13 from the interleaved rows [g0, u0, g1, u1, ...] and runs
`MoEActivation.SWIGLUOAI`. This method instead holds w13 as [gates; ups] (the rows of vLLM's w13 in
the order `perm = [0, 2, 4, ..., 2*I_p - 2, 1, 3, ..., 2*I_p - 1]`, I_p the rank's padded I) and runs
`SWIGLUOAI_UNINTERLEAVE`, which vLLM computes as gate * sigmoid(alpha * gate) * (up + beta) with
gate clamped above and up on both sides at the limit: with vLLM's own SWIGLUOAI constants (alpha,
limit from `SwigluOAIAndMul`, beta = 1) it is SWIGLUOAI's formula on the de-interleaved halves.

Load route (the one engine-facing piece): vLLM's `GptOssModel._load_weights_other` (what a
`marlin_fp4` gpt-oss checkpoint goes through) maps `down_proj.weight|weight_scale` to its per-expert
"streamed" names but drops `gate_proj` / `up_proj`. `install_name_route` wraps its
`_get_streamed_expert_info` so that the per-expert names of *this plugin's* parameters (marked
`dsv4_prepacked`) go to vLLM's expert `weight_loader` with the shard ids w1 / w3 / w2, which slice
Marlin tensors on their N axis as for every other plugin checkpoint; every other name, and every
other model's parameters, take vLLM's own route unchanged. The biases come through vLLM's own fused
bias code (`param.copy_` of the rank's interleaved slice), so they are created at the unpadded
per-rank sizes and de-interleaved, padded and Marlin-permuted here after loading.
"""

from __future__ import annotations

import inspect
import re

import torch
from vllm.model_executor.layers.activation import SwigluOAIAndMul
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.quantization.utils.layer_utils import replace_parameter
from vllm.model_executor.layers.quantization.utils.marlin_utils import marlin_permute_bias
from vllm.model_executor.models import gpt_oss

from .vllm_methods import PrepackedMxfp4MarlinMoE

__all__ = ["PrepackedGptOssMxfp4MarlinMoE", "deinterleave_w13_bias", "install_name_route", "swigluoai_constants"]

# `<prefix>.mlp.experts.<e>.` + the converter's gate/up names, or vLLM's mapped down_proj names
_NAME = re.compile(
    r"^(?P<prefix>.+)\.mlp\.experts\.(?P<e>\d+)\."
    r"(?:(?P<proj>gate_proj|up_proj)\.weight|w2_weight)(?P<scale>_scale)?$"
)
_SHARD = {"gate_proj": "w1", "up_proj": "w3", None: "w2"}


def swigluoai_constants() -> tuple[float, float]:
    """(alpha, limit) of vLLM's SWIGLUOAI (`SwigluOAIAndMul`'s defaults: what swigluoai_and_mul runs)."""
    p = inspect.signature(SwigluOAIAndMul.__init__).parameters
    return float(p["alpha"].default), float(p["limit"].default)


def _converted_route(name: str, params_dict: dict) -> tuple[int, str, str] | None:
    m = _NAME.match(name)
    if m is None:
        return None
    stack = "w2" if m["proj"] is None else "w13"
    for base in ("", "base_layer."):
        fused = f"{m['prefix']}.mlp.experts.{base}routed_experts.{stack}_weight{m['scale'] or ''}"
        param = params_dict.get(fused)
        if param is not None:
            return (int(m["e"]), fused, _SHARD[m["proj"]]) if getattr(param, "dsv4_prepacked", False) else None
    return None


def install_name_route() -> None:
    """Wrap `GptOssModel._get_streamed_expert_info` once (idempotent): our parameters' per-expert
    names first, vLLM's own parsing for everything else."""
    cls = gpt_oss.GptOssModel
    current = cls.__dict__["_get_streamed_expert_info"].__func__
    if getattr(current, "dsv4_route", False):
        return

    def info(name, params_dict):
        return _converted_route(name, params_dict) or current(name, params_dict)

    info.dsv4_route = True
    cls._get_streamed_expert_info = staticmethod(info)


def deinterleave_w13_bias(bias: torch.Tensor, i_pad: int) -> torch.Tensor:
    """[E, 2*i] interleaved (g0, u0, g1, u1, ...) -> [E, 2*i_pad] = [gates, 0-pad; ups, 0-pad]."""
    e, i = bias.shape[0], bias.shape[1] // 2
    out = torch.zeros(e, 2, i_pad, dtype=bias.dtype)
    out[:, 0, :i], out[:, 1, :i] = bias[:, 0::2], bias[:, 1::2]
    return out.reshape(e, 2 * i_pad)


def _marlin_bias(bias: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """vLLM's prepare_moe_mxfp4_layer_for_marlin bias step: cast, then marlin_permute_bias per expert."""
    bias = bias.to(dtype)
    return torch.stack([marlin_permute_bias(b) for b in bias]) if bias.shape[0] else bias


class PrepackedGptOssMxfp4MarlinMoE(PrepackedMxfp4MarlinMoE):
    """gpt-oss MXFP4 experts in Marlin order with gate/up de-interleaved, biases, SWIGLUOAI_UNINTERLEAVE."""

    def __init__(self, moe, activation_key=None, *, spec, container: str):
        super().__init__(moe, activation_key=activation_key, spec=spec, container=container)
        if moe.activation != MoEActivation.SWIGLUOAI or not moe.has_bias:
            raise ValueError(f"{container}: expected vLLM's gpt-oss experts (swigluoai, biases), got "
                             f"{moe.activation.value}, has_bias={moe.has_bias}")
        install_name_route()

    def create_weights(self, layer, num_experts, hidden_size, intermediate_size_per_partition, params_dtype,
                       **extra_weight_attrs):
        super().create_weights(layer, num_experts, hidden_size, intermediate_size_per_partition, params_dtype,
                               **extra_weight_attrs)
        for name in ("w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale"):
            getattr(layer, name).dsv4_prepacked = True
        h, i = self.unpadded_sizes  # vLLM's fused bias loader copies the rank's unpadded slice
        for name, shape in (("w13_bias", (num_experts, 2 * i)), ("w2_bias", (num_experts, h))):
            layer.register_parameter(name, torch.nn.Parameter(torch.zeros(shape, dtype=torch.bfloat16),
                                                              requires_grad=False))
        # same math as SWIGLUOAI on w13 = [gates; ups] (module docstring)
        self.moe.activation = layer.activation = MoEActivation.SWIGLUOAI_UNINTERLEAVE

    def get_fused_moe_quant_config(self, layer):
        config = super().get_fused_moe_quant_config(layer)
        if config is not None:
            config.gemm1_alpha, config.gemm1_clamp_limit = swigluoai_constants()
            config.gemm1_beta = 1.0
        return config

    def process_weights_after_loading(self, layer) -> None:
        dtype = layer.params_dtype
        w13 = deinterleave_w13_bias(layer.w13_bias.data, self.intermediate_size)
        w2 = torch.zeros(layer.w2_bias.shape[0], self.hidden_size, dtype=layer.w2_bias.dtype)
        w2[:, : layer.w2_bias.shape[1]] = layer.w2_bias.data
        replace_parameter(layer, "w13_bias", _marlin_bias(w13, dtype))
        replace_parameter(layer, "w2_bias", _marlin_bias(w2, dtype))
        super().process_weights_after_loading(layer)
