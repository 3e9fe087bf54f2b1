"""Runs inside each spawned gloo rank for test_vllm_gpt_oss.py (its header lists the substitutions)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch
from common import byte_diff
from harness_vllm import vllm_cpu

PREFIX = "model.layers.0.mlp.experts"


def _read(path: str) -> dict:
    from safetensors import safe_open

    out = {}
    for shard in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys() if ".mlp.experts." in k})
    return out


def _layer(fresh, quant_config, hf):
    """One gpt-oss MoE layer built as vLLM's gpt-oss MLPBlock builds it."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.fused_moe.layer import FusedMoEFactory
    from vllm.model_executor.models.gpt_oss import GptOssRoutedExperts

    with set_current_vllm_config(fresh()):
        return FusedMoEFactory(
            num_experts=hf["num_local_experts"], top_k=hf["num_experts_per_tok"], hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"], renormalize=True, quant_config=quant_config, prefix=PREFIX,
            apply_router_weight_on_input=False, has_bias=True, activation="swigluoai",
            routed_experts_cls=GptOssRoutedExperts, params_dtype=torch.bfloat16,
        )


def _load(runner, tensors, *, hf, qc, ep):
    """vLLM's own GptOssForCausalLM -> GptOssModel.load_weights on a model that holds only this layer:
    the model's weights mapper, the `model.` prefix AutoWeightsLoader strips, then GptOssModel's code."""
    from vllm.model_executor.models.gpt_oss import GptOssForCausalLM, GptOssModel

    model = GptOssModel.__new__(GptOssModel)
    torch.nn.Module.__init__(model)
    model.config = SimpleNamespace(intermediate_size=hf["intermediate_size"], quantization_config=qc,
                                   num_local_experts=hf["num_local_experts"])
    model.parallel_config = SimpleNamespace(enable_expert_parallel=ep)
    block = torch.nn.Module()
    block.mlp = torch.nn.Module()
    block.mlp.experts = runner
    model.layers = torch.nn.ModuleList([block])
    mapper = GptOssForCausalLM.hf_to_vllm_mapper
    weights = [(mapper._map_name(n).removeprefix("model."), t) for n, t in tensors.items()]
    loaded = GptOssModel.load_weights(model, weights)
    return sorted(n.removeprefix("layers.0.mlp.experts.") for n in loaded)


def _unpermute_bias(b):
    from vllm.model_executor.layers.quantization.utils.marlin_utils import marlin_permute_bias

    idx = marlin_permute_bias(torch.arange(b.shape[-1], dtype=torch.float32)).long()
    out = torch.empty_like(b)
    out[..., idx] = b
    return out


def run(rank, world, *, src: str, conv: str, ep: bool) -> dict:
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.fused_moe.oracle import mxfp4 as mxfp4_oracle
    from vllm.model_executor.layers.quantization import get_quantization_config
    from vllm.model_executor.layers.quantization.mxfp4 import GptOssMxfp4Config
    from vllm.model_executor.layers.quantization.utils.marlin_utils import marlin_permute_bias
    from vllm.plugins import load_general_plugins

    from dsv4_convert.core.targets.target import MarlinTarget
    from dsv4_convert.formats.marlin import mxfp4_to_marlin

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    load_general_plugins()
    hf = json.loads(Path(src, "config.json").read_text())
    src_qc = hf["quantization_config"]
    qc = json.loads(Path(conv, "config.json").read_text())["quantization_config"]
    with vllm_cpu(world=world, rank=rank, ep=ep, dtype=torch.bfloat16) as fresh:
        # without a model config there is no user MoE activation override to read (none is set in
        # the documented launch); vLLM's oracle reads model_config.quantization_config for it
        mxfp4_oracle._user_moe_activation_override = lambda: None
        engine = _layer(fresh, GptOssMxfp4Config.from_config(src_qc), hf)
        engine_loaded = _load(engine, _read(src), hf=hf, qc=src_qc, ep=ep)
        e = engine.routed_experts
        before = {n: getattr(e, n).data.clone() for n in ("w13_weight", "w13_weight_scale", "w13_bias")}
        with set_current_vllm_config(fresh()):
            e.quant_method.process_weights_after_loading(e)
        plugin = _layer(fresh, get_quantization_config(qc["quant_method"]).from_config(qc), hf)
        plugin_loaded = _load(plugin, _read(conv), hf=hf, qc=qc, ep=ep)
        p = plugin.routed_experts
        with set_current_vllm_config(fresh()):
            p.quant_method.process_weights_after_loading(p)
            outputs = _emulated_outputs(e, p, hidden=hf["hidden_size"])

    # vLLM's w13 rows are interleaved (g0, u0, g1, u1, ...) over the rank's padded 2 * I_p rows; the
    # plugin's are [g0 .. g_{I_p-1}; u0 .. u_{I_p-1}]: row j of ours is row perm[j] of vLLM's
    rows = before["w13_weight"].shape[1]
    perm = torch.cat([torch.arange(0, rows, 2), torch.arange(1, rows, 2)])
    expected_w13, expected_s13 = mxfp4_to_marlin(
        before["w13_weight"][:, perm], before["w13_weight_scale"][:, perm], target=MarlinTarget(engine="vllm")
    )
    # the engine's bias after its Marlin step, un-permuted, de-interleaved, Marlin-permuted again
    engine_b13 = _unpermute_bias(e.w13_bias.data)[:, perm]
    expected_b13 = torch.stack([marlin_permute_bias(b) for b in engine_b13])
    from dsv4_convert.serving.vllm_gpt_oss import swigluoai_constants

    cfg = p.quant_method.moe_quant_config
    return {
        "engine_method": type(e.quant_method).__name__,
        "plugin_method": type(p.quant_method).__name__,
        "engine_activation": e.activation.value,
        "plugin_activation": p.activation.value,
        "kernel_activation": p.quant_method.moe.activation.value,
        "act_constants": [cfg.gemm1_alpha, cfg.gemm1_beta, cfg.gemm1_clamp_limit],
        "vllm_swigluoai": list(swigluoai_constants()),
        "engine_loaded": engine_loaded,
        "plugin_loaded": plugin_loaded,
        "local_experts": int(p.w13_weight.shape[0]),
        "shapes": {n: list(getattr(p, n).shape) for n in ("w13_weight", "w2_weight", "w13_bias", "w2_bias")},
        "diff": {
            "w13_weight (vs vLLM's rows de-interleaved, project codec)": byte_diff(p.w13_weight.data, expected_w13),
            "w13_weight_scale (vs vLLM's source rows de-interleaved, project codec)":
                byte_diff(p.w13_weight_scale.data, expected_s13.view(p.w13_weight_scale.dtype)),
            "w13_weight_scale (vs vLLM's final scale, de-interleaved)": _final_scale_diff(e, p, perm),
            "w2_weight": byte_diff(p.w2_weight.data, e.w2_weight.data),
            "w2_weight_scale": byte_diff(p.w2_weight_scale.data, e.w2_weight_scale.data),
            "w13_bias (vLLM's, de-interleaved)": byte_diff(p.w13_bias.data, expected_b13),
            "w2_bias": byte_diff(p.w2_bias.data, e.w2_bias.data),
        },
        "control": {  # the same comparisons with the identity in place of perm
            "w13_weight": byte_diff(p.w13_weight.data, mxfp4_to_marlin(
                before["w13_weight"], before["w13_weight_scale"], target=MarlinTarget(engine="vllm"))[0]),
            "w13_bias": byte_diff(p.w13_bias.data, e.w13_bias.data),
        },
        "emulated_max_abs_diff": outputs,
        "bias_nonzero": bool(before["w13_bias"].abs().sum() > 0),
    }


def _emulated_outputs(e, p, *, hidden: int) -> dict:
    """Each local expert's output on the same tokens, from the final Marlin tensors of both paths
    (validate/emulate.py's dequantisation as the kernel reads the bytes, float32 GEMMs, the biases
    taken back from their Marlin permutation): vLLM's path with its SWIGLUOAI (`SwigluOAIAndMul`,
    interleaved), the plugin's with vLLM's SWIGLUOAI_UNINTERLEAVE math (`SiluAndMulWithClamp` with
    the constants the plugin sets). Returns {"max_abs_diff": .., "max_abs_out": ..}."""
    from vllm.model_executor.layers.activation import SiluAndMulWithClamp, SwigluOAIAndMul

    from dsv4_convert.core.checkpoint.tensor_model import Quant
    from dsv4_convert.validate.emulate import marlin_dequantize

    cfg = p.quant_method.moe_quant_config
    acts = {"engine": SwigluOAIAndMul().forward_native,
            "plugin": SiluAndMulWithClamp(cfg.gemm1_clamp_limit, cfg.gemm1_alpha, cfg.gemm1_beta).forward_native}
    h_pad, n13 = e.w13_weight.shape[1] * 16, e.w13_weight.shape[2] // 2
    kw = dict(quant=Quant.MXFP4, act_dtype="bfloat16", w4a8=False)
    x = torch.nn.functional.pad(torch.randn(8, hidden, generator=torch.Generator().manual_seed(0)), (0, h_pad - hidden))
    diff = top = 0.0
    for i in range(e.w13_weight.shape[0]):
        out = {}
        for side, layer in (("engine", e), ("plugin", p)):
            w13 = marlin_dequantize(layer.w13_weight.data[i], layer.w13_weight_scale.data[i], None, n=n13, k=h_pad, **kw)
            w2 = marlin_dequantize(layer.w2_weight.data[i], layer.w2_weight_scale.data[i], None, n=h_pad,
                                   k=n13 // 2, **kw)
            y = x @ w13.T + _unpermute_bias(layer.w13_bias.data[i]).float()
            out[side] = (acts[side](y) @ w2.T + _unpermute_bias(layer.w2_bias.data[i]).float())[:, :hidden]
        diff = max(diff, float((out["engine"] - out["plugin"]).abs().max()))
        top = max(top, float(out["engine"].abs().max()))
    return {"max_abs_diff": diff, "max_abs_out": top}


def _final_scale_diff(e, p, perm):
    """vLLM's own final w13 scale bytes (its marlin_permute_scales + mxfp4_marlin_process_scales) taken
    back to source rows with the project's inverse codec, de-interleaved, against the plugin's."""
    from dsv4_convert.core.targets.target import MarlinTarget
    from dsv4_convert.formats.marlin import marlin_to_mxfp4

    t = MarlinTarget(engine="vllm")
    n, k = e.w13_weight.shape[2] // 2, e.w13_weight.shape[1] * 16
    ew, es = marlin_to_mxfp4(e.w13_weight.data, e.w13_weight_scale.data, target=t, n=n, k=k)
    pw, ps = marlin_to_mxfp4(p.w13_weight.data, p.w13_weight_scale.data, target=t, n=n, k=k)
    return byte_diff(pw, ew[:, perm]) or byte_diff(ps, es[:, perm])
