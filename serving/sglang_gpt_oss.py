"""gpt-oss on SGLang through the plugin's MXFP4 Marlin method (serving/sglang_methods.py): the per-expert
loading route and the biases, as SGLang's own gpt-oss MXFP4 path treats them."""

from __future__ import annotations

import re

import torch
from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
from sglang.srt.layers.quantization import marlin_utils

__all__ = ["bias_copy", "gpt_oss_biases_for_marlin", "install_gpt_oss_route"]


def bias_copy(param, loaded_weight, weight_name=None, shard_id=None, expert_id=None):
    """What SGLang's FusedMoE.weight_loader does with a gpt-oss bias for quant_method "mxfp4" (its
    `expert_id is None` branch, keyed on that name): copy the rank's slice, cut by the model's loader."""
    param.data[:, : loaded_weight.shape[1]].copy_(loaded_weight)


def gpt_oss_biases_for_marlin(layer) -> None:
    """SGLang's bias steps for gpt-oss Marlin (deinterleave_moe_mxfp4_w13_for_marlin, then
    prepare_moe_mxfp4_layer_for_marlin's marlin_permute_bias per expert in the activation dtype)."""
    b13 = layer.w13_weight_bias.data
    e, n = b13.shape
    b13 = b13.view(e, n // 2, 2).permute(0, 2, 1).contiguous().view(e, n)
    dtype = getattr(layer, "orig_dtype", b13.dtype)
    for name, b in (("w13_weight_bias", b13), ("w2_weight_bias", layer.w2_weight_bias.data)):
        permuted = torch.stack([marlin_utils.marlin_permute_bias(b[x].to(dtype)) for x in range(e)])
        setattr(layer, name, torch.nn.Parameter(permuted, requires_grad=False))


_EXPERT_NAME = re.compile(r"\.mlp\.experts\.(\d+\.(gate_proj|up_proj|down_proj)\.(weight|weight_scale)|"
                          r"gate_up_proj_bias|down_proj_bias)$")


def install_gpt_oss_route(method_cls) -> None:
    """SGLang's GptOssForCausalLM loads a non-"mxfp4" checkpoint with `_load_normal_weights`, whose
    fused mapping silently skips per-expert names. Once: names of experts held by our method go to
    SGLang's per-expert mapping (as DeepSeek-V4 loads them; `method_cls`: the plugin's MXFP4 method) and the biases to SGLang's own gpt-oss
    bias loading (`_load_mxfp4_experts_weights`, which narrows per rank); everything else unchanged."""
    from sglang.srt.models.gpt_oss import GptOssForCausalLM

    original = GptOssForCausalLM._load_normal_weights
    if getattr(original, "_dsv4_route", False):
        return

    def _load_normal_weights(self, weights, is_nextn: bool, weight_name_mapping: dict, *args, **kwargs):
        rest, experts, biases = [], [], []
        for name, tensor in weights:
            m = _EXPERT_NAME.search(name)
            try:
                module = self.get_submodule(name[: m.start()] + ".mlp.experts") if m else None
            except AttributeError:  # a layer this rank does not hold: SGLang's own loader skips it
                module = None
            if not isinstance(getattr(module, "quant_method", None), method_cls):
                rest.append((name, tensor))
            elif name.endswith("_bias"):
                biases.append((name, tensor))
            else:
                experts.append((name, tensor, module))
        params = dict(self.named_parameters())
        for name, tensor, module in experts:
            for param_name, weight_name, expert_id, shard_id in FusedMoE.make_expert_params_mapping(
                ckpt_gate_proj_name="gate_proj", ckpt_down_proj_name="down_proj", ckpt_up_proj_name="up_proj",
                num_experts=module.num_experts,
            ):
                if weight_name in name:
                    resolved = name.replace(weight_name, param_name)
                    param = params[resolved]
                    param.weight_loader(param, tensor, resolved, shard_id=shard_id, expert_id=expert_id)
                    break
        if biases:
            self._load_mxfp4_experts_weights(biases)
        return original(self, rest, is_nextn, weight_name_mapping, *args, **kwargs)

    _load_normal_weights._dsv4_route = True
    GptOssForCausalLM._load_normal_weights = _load_normal_weights
