"""Runs inside each spawned gloo rank for test_sglang_gpt_oss.py (its header lists the substitutions)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import torch
from common import byte_diff
from harness_sglang import sglang_cpu

import synth

PREFIX = "model.layers.0.mlp.experts"
FINAL = ["w13_weight", "w13_weight_scale", "w13_weight_bias", "w2_weight", "w2_weight_scale", "w2_weight_bias"]


def _read(path: str) -> dict:
    return synth.load_checkpoint_experts(path, container=PREFIX)[0]


def _model(quant_config, hf):
    """A GptOssForCausalLM shell holding one MoE layer built with GptOssSparseMoeBlock's arguments."""
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.models.gpt_oss import GptOssForCausalLM

    experts = FusedMoE(
        num_experts=hf["num_local_experts"], top_k=hf["num_experts_per_tok"], layer_id=0,
        hidden_size=hf["hidden_size"], intermediate_size=hf["intermediate_size"], quant_config=quant_config,
        activation=hf.get("hidden_act", "silu"), gemm1_alpha=hf.get("hidden_act_alpha", 1.702),
        gemm1_clamp_limit=hf["swiglu_limit"], with_bias=True, prefix=PREFIX, params_dtype=torch.bfloat16,
        use_weight_loader_fused=quant_config.get_name() != "mxfp4",
    )
    m = GptOssForCausalLM.__new__(GptOssForCausalLM)
    torch.nn.Module.__init__(m)
    m.config = SimpleNamespace(**hf)
    m.quant_config = quant_config
    m.model = torch.nn.Module()
    m.model.start_layer, m.model.end_layer = 0, 1
    block = torch.nn.Module()
    block.mlp = torch.nn.Module()
    block.mlp.experts = experts
    m.model.layers = torch.nn.ModuleList([block])
    return m, experts


def _register_mxfp4_as_on_cuda():
    """SGLang registers quant_method "mxfp4" (Mxfp4Config) only when is_cpu/is_cuda/gfx95/xpu; this
    CPU build reports none of them, so the registry gets the entry a CUDA build has."""
    from sglang.srt.layers import quantization as sgl_quant
    from sglang.srt.layers.quantization.mxfp4 import Mxfp4Config

    sgl_quant.QUANTIZATION_METHODS.setdefault("mxfp4", Mxfp4Config)


def run(rank, world, *, src: str, conv: str, ep: bool) -> dict:
    os.environ["HF_HUB_OFFLINE"] = "1"
    from sglang.srt.layers.quantization import get_quantization_config
    from sglang.srt.models.gpt_oss import GptOssForCausalLM
    from sglang.srt.plugins import load_plugins

    load_plugins()
    _register_mxfp4_as_on_cuda()
    hf = json.loads(Path(src, "config.json").read_text())
    qc = json.loads(Path(conv, "config.json").read_text())["quantization_config"]
    with sglang_cpu(world=world, rank=rank, ep=ep, dtype=torch.bfloat16):
        em, e = _model(get_quantization_config("mxfp4").from_config(hf["quantization_config"]), hf)
        GptOssForCausalLM.load_weights(em, _read(src).items())
        e.quant_method.process_weights_after_loading(e)
        pm, p = _model(get_quantization_config(qc["quant_method"]).from_config(qc), hf)
        before = {n: t.data.clone() for n, t in p.named_parameters()}
        GptOssForCausalLM.load_weights(pm, _read(conv).items())
        unloaded = sorted(n for n, t in p.named_parameters() if torch.equal(t.data, before[n]))
        loaded_b13 = p.w13_weight_bias.data.clone()
        p.quant_method.process_weights_after_loading(p)
    # negative control: the loaded (interleaved) w13 bias given SGLang's Marlin bias permutation without
    # its de-interleave is not SGLang's final bias
    from sglang.srt.layers.quantization.marlin_utils import marlin_permute_bias

    no_deinterleave = torch.stack([marlin_permute_bias(b) for b in loaded_b13])
    return {
        "engine_method": type(e.quant_method).__name__,
        "plugin_method": type(p.quant_method).__name__,
        "local_experts": int(p.w13_weight.shape[0]),
        "shapes": {n: list(getattr(p, n).shape) for n in FINAL},
        "diff": {n: byte_diff(getattr(p, n).data, getattr(e, n).data) for n in FINAL},
        "unloaded": unloaded,
        "bias_nonzero": bool(e.w13_weight_bias.data.abs().sum() > 0),
        "w2_bias_zero": bool(e.w2_weight_bias.data.abs().sum() == 0),
        "gemm1_alpha": p.quant_method.runner.config.gemm1_alpha,
        "engine_gemm1_alpha": e.quant_method.moe_runner_config.gemm1_alpha,
        "negative_no_deinterleave": byte_diff(no_deinterleave, e.w13_weight_bias.data),
    }
