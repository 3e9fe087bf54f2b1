"""Runs inside each spawned gloo rank for the SGLang tests (see test_sglang_plugin.py for the list of
CPU substitutions and why each one is there)."""

from __future__ import annotations

import contextlib
import os

import synth
import torch
from common import compare_params

PREFIX = "model.layers.0.mlp.experts"  # SGLang's module name for checkpoint `layers.0.ffn.experts`
FINAL = {
    "mxfp4": ["w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale"],
    "nvfp4": [
        "w13_weight",
        "w2_weight",
        "w13_weight_scale",
        "w2_weight_scale",
        "w13_weight_scale_2",
        "w2_weight_scale_2",
    ],
}


def _reference_repack(b_q_weight, perm, size_k, size_n, num_bits, **_):
    """Substitute for SGLang's JIT CUDA `gptq_marlin_repack` (FP4, no act-order): the project's
    `to_marlin_weight`, pinned to the engines' bytes by tests/formats/test_golden.py."""
    from dsv4_convert.formats.marlin_weight import to_marlin_weight

    assert num_bits == 4 and perm.numel() == 0
    assert tuple(b_q_weight.shape) == (size_k // 8, size_n)
    packed = b_q_weight.t().contiguous().view(torch.uint8)  # [N, K/2], nibble order unchanged
    return to_marlin_weight(packed)


def _dummy_workspace(device, max_blocks_per_sm=1):
    """Substitute for `marlin_make_workspace` (reads CUDA SM count); runtime-only, never compared."""
    return torch.zeros(1, dtype=torch.int, device=device)


@contextlib.contextmanager
def sglang_cpu(*, world: int, rank: int, ep: bool, dtype: torch.dtype):
    from sglang.srt.layers.quantization import marlin_utils, marlin_utils_fp4
    from sglang.srt.runtime_context import get_context, get_parallel, override_platform

    marlin_utils_fp4.gptq_marlin_repack = _reference_repack
    marlin_utils_fp4.marlin_make_workspace = _dummy_workspace
    marlin_utils.marlin_make_workspace = _dummy_workspace
    ov = get_context().override_server_args(
        tp_size=world,
        ep_size=world if ep else 1,
        moe_runner_backend="marlin",
        dtype=str(dtype).removeprefix("torch."),
    )
    ov.install()
    from sglang.srt.layers.moe.utils import initialize_moe_config

    initialize_moe_config()  # what the scheduler does after publish: reads --moe-runner-backend
    ranks = {"tp_rank": rank, "moe_ep_rank": rank if ep else 0, "moe_tp_rank": 0 if ep else rank}
    get_parallel().override_permanently(**ranks)
    try:
        with override_platform(is_sm120=True):
            yield
    finally:
        ov.restore()


def make_layer(quant_config, *, experts: int, hidden: int, inter: int, dtype: torch.dtype):
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

    return FusedMoE(
        num_experts=experts,
        hidden_size=hidden,
        intermediate_size=inter,
        layer_id=0,
        top_k=2,
        params_dtype=dtype,
        quant_config=quant_config,
        prefix=PREFIX,
    )


def load_like_dsv4(layer, tensors: dict[str, torch.Tensor], *, experts: int) -> list[str]:
    """Feed checkpoint tensors to the layer the way SGLang's DeepseekV4ForCausalLM.load_weights does:
    its own name remap, FusedMoE.make_expert_params_mapping, then each parameter's weight_loader.
    Returns the checkpoint names that found no parameter (SGLang skips those)."""
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.models.deepseek_v4 import DeepseekV4ForCausalLM

    mapping = FusedMoE.make_expert_params_mapping(
        ckpt_gate_proj_name="gate_proj",
        ckpt_down_proj_name="down_proj",
        ckpt_up_proj_name="up_proj",
        num_experts=experts,
    )
    params = {f"{PREFIX}.{n}": p for n, p in layer.named_parameters()}
    skipped = []
    for ckpt_name, tensor in tensors.items():
        name = DeepseekV4ForCausalLM.remap_weight_name_to_dpsk_hf_format(ckpt_name)
        for param_name, weight_name, expert_id, shard_id in mapping:
            if weight_name not in name:
                continue
            resolved = name.replace(weight_name, param_name)
            if resolved not in params:
                skipped.append(ckpt_name)
                break
            param = params[resolved]
            param.weight_loader(param, tensor, resolved, shard_id=shard_id, expert_id=expert_id)
            break
    return skipped


def engine_config(fmt: str):
    from sglang.srt.layers.quantization.fp8 import Fp8Config
    from sglang.srt.layers.quantization.modelopt_quant import ModelOptFp4Config

    if fmt == "mxfp4":
        cfg = Fp8Config.from_config(synth.DSV4_FP8)
        cfg.is_fp4_experts = True  # what SGLang's loader sets for DeepSeek-V4 FP4 experts
        return cfg
    return ModelOptFp4Config(is_checkpoint_nvfp4_serialized=True, group_size=16, exclude_modules=[])


def plugin_config(qc: dict):
    from sglang.srt.layers.quantization import get_quantization_config

    return get_quantization_config(qc["quant_method"]).from_config(qc)


def run_case(
    rank: int,
    world: int,
    *,
    fmt: str,
    act_dtype: str,
    ep: bool,
    experts: int,
    hidden: int,
    inter: int,
    convert_for: str = "sglang",
    small_scales: bool = False,
    checkpoints: list | None = None,
) -> dict:
    """One scenario on this rank: (a) the engine's own method on the source, (b) the plugin on the
    converted tensors; returns the byte comparison of every final expert parameter."""
    os.environ["HF_HUB_OFFLINE"] = "1"  # ServerArgs(model_path="dummy") must not look for a model online
    from sglang.srt.plugins import load_plugins

    from dsv4_convert.formats.marlin import MarlinTarget

    load_plugins()
    dtype = getattr(torch, act_dtype)
    src = synth.source_experts(
        fmt,
        experts=experts,
        hidden=hidden,
        inter=inter,
        small_scales_for=tuple(range(experts)) if small_scales else (),
    )
    target = MarlinTarget(engine=convert_for, act_dtype=act_dtype)
    conv = synth.converted_experts(src, fmt, target, experts=experts)
    qc = synth.quant_config(
        fmt,
        MarlinTarget(engine="sglang", act_dtype=act_dtype),
        rescale=synth.rescale_factors(src, target, range(experts)),
    )
    if checkpoints is not None:  # the real converter's output (dsv4-convert synth + *-to-marlin)
        src, _ = synth.load_checkpoint_experts(checkpoints[0])
        conv, qc = synth.load_checkpoint_experts(checkpoints[1])
    with sglang_cpu(world=world, rank=rank, ep=ep, dtype=dtype):
        engine = make_layer(engine_config(fmt), experts=experts, hidden=hidden, inter=inter, dtype=dtype)
        engine_skipped = load_like_dsv4(engine, src, experts=experts)
        engine.quant_method.process_weights_after_loading(engine)

        plugin = make_layer(plugin_config(qc), experts=experts, hidden=hidden, inter=inter, dtype=dtype)
        skipped = load_like_dsv4(plugin, conv, experts=experts)
        plugin.quant_method.process_weights_after_loading(plugin)
    return {
        "engine_method": type(engine.quant_method).__name__,
        "plugin_method": type(plugin.quant_method).__name__,
        "local_experts": int(plugin.w13_weight.shape[0]),
        "engine_skipped": sorted(set(engine_skipped)),
        "skipped": sorted(set(skipped)),
        "diff": compare_params(engine, plugin, FINAL[fmt]),
    }


def run_cases(rank: int, world: int, *, cases: list[dict]) -> dict:
    return {c["id"]: run_case(rank, world, **{k: v for k, v in c.items() if k != "id"}) for c in cases}
