"""Runs inside each spawned gloo rank for the vLLM tests (see test_vllm_plugin.py for the list of CPU
substitutions and why each one is there)."""

from __future__ import annotations

import contextlib
import os

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch
from common import compare_params
from cpu_platform import allow_x86_without_triton
from layer_cases import FINAL, case_tensors

import synth

allow_x86_without_triton()  # vLLM 0.34 on an x86 CPU (cpu_platform.py says why)

PREFIX = "model.layers.0.ffn.experts"  # vLLM's module name for checkpoint `layers.0.ffn.experts`


def _reference_repack(b_q_weight, size_k, size_n, num_bits, is_a_8bit=False, **_):
    """Substitute for the CUDA op `ops.gptq_marlin_repack`: the project's `to_marlin_weight`, pinned to
    the engines' bytes by tests/formats/test_golden.py. Runs only in the engine path (a)."""
    from dsv4_convert.formats.marlin.weight import to_marlin_weight

    assert num_bits == 4 and tuple(b_q_weight.shape) == (size_k // 8, size_n)
    return to_marlin_weight(b_q_weight.t().contiguous().view(torch.uint8), w4a8=is_a_8bit)


@contextlib.contextmanager
def vllm_cpu(*, world: int, rank: int, ep: bool, dtype: torch.dtype):
    from vllm import _custom_ops as ops
    from vllm.config import KernelConfig, ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.parallel_state import model_parallel_is_initialized
    from vllm.model_executor.layers.fused_moe.experts import marlin_moe

    ops.gptq_marlin_repack = _reference_repack
    # the Marlin experts class refuses a machine without a CUDA sm80+ GPU; the backend choice is
    # what --moe-backend marlin asks for on sm_120
    for cls in vars(marlin_moe).values():
        if isinstance(cls, type) and "_supports_current_device" in vars(cls):
            cls._supports_current_device = staticmethod(lambda: True)

    def fresh_config():  # one per layer: a config registers each layer name once
        return VllmConfig(
            kernel_config=KernelConfig(moe_backend="marlin"),
            parallel_config=ParallelConfig(tensor_parallel_size=world, enable_expert_parallel=ep),
        )

    with set_current_vllm_config(fresh_config()):
        if not model_parallel_is_initialized():
            init_distributed_environment(
                world_size=world, rank=rank, local_rank=rank, backend="gloo", distributed_init_method="env://"
            )
            initialize_model_parallel(tensor_model_parallel_size=world)
    yield fresh_config


def make_layer(fresh_config, quant_config, *, experts, hidden, inter, dtype):
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.fused_moe.layer import FusedMoEFactory
    from vllm.utils.torch_utils import set_default_torch_dtype

    # under the model's dtype, as vLLM's model loader builds every layer (a tensor created without a
    # dtype is then bf16: the condition that rounded the plugin's fp32 globals, issue #26 item 5)
    with set_current_vllm_config(fresh_config()), set_default_torch_dtype(dtype):
        runner = FusedMoEFactory(
            num_experts=experts,
            top_k=2,
            hidden_size=hidden,
            intermediate_size=inter,
            params_dtype=dtype,
            quant_config=quant_config,
            prefix=PREFIX,
            ckpt_names=("w1", "w2", "w3"),
            swiglu_limit=10.0,
        )
    return runner.routed_experts


def load_like_dsv4(layer, tensors, *, experts):
    """Feed checkpoint tensors the way vLLM's DeepseekV4 load_weights does: its weights mapper (names,
    `.scale` suffixes), the E8M0 -> uint8 view, the expert params mapping, then `weight_loader`."""
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

    # the CUDA model's mapper (what runs on sm_120); the CPU model's renames `.input_scale`
    from vllm.models.deepseek_v4.nvidia.model import _make_deepseek_v4_weights_mapper

    mapper = _make_deepseek_v4_weights_mapper("fp4")
    mapping = RoutedExperts.build_expert_params_mapping("w1", "w2", "w3", experts, routed_experts_prefix="")
    params = dict(layer.named_parameters())
    missing = []
    for ckpt_name, tensor in tensors.items():
        name = mapper._map_name(ckpt_name)
        if "weight_scale" in name and tensor.dtype == torch.float8_e8m0fnu:
            tensor = tensor.view(torch.uint8)
        for param_name, weight_name, expert_id, shard_id in mapping:
            if weight_name not in name:
                continue
            local = name[name.index(weight_name) :].replace(weight_name, param_name).removeprefix("experts.")
            if local not in params:
                missing.append(ckpt_name)  # vLLM's loader would raise KeyError here
                break
            params[local].weight_loader(
                params[local], tensor, local, shard_id=shard_id, expert_id=expert_id, return_success=True
            )
            break
    return missing


def engine_config(fmt):
    from vllm.models.deepseek_v4 import DeepseekV4FP8Config

    cfg = DeepseekV4FP8Config.from_config(synth.DSV4_FP8)
    cfg._resolved_expert_dtype = "fp4"  # read from hf_config by vLLM; no model config in this test
    cfg._resolved_moe_quant_algo = "NVFP4" if fmt == "nvfp4" else ""  # ditto (`moe_quant_algo`)
    return cfg


def run_case(
    rank,
    world,
    *,
    fmt,
    act_dtype,
    ep,
    experts,
    hidden,
    inter,
    convert_for="vllm",
    small_scales=(),
    checkpoints: list | None = None,
    padded: dict | None = None,
    w4a8: bool = False,
    kernel_a8: bool | None = None,
) -> dict:
    with w4a8_fp8(w4a8 if kernel_a8 is None else kernel_a8):
        return _run_case(rank, world, fmt=fmt, act_dtype=act_dtype, ep=ep, experts=experts, hidden=hidden,
                         inter=inter, convert_for=convert_for, small_scales=small_scales, checkpoints=checkpoints,
                         padded=padded, w4a8=w4a8)


@contextlib.contextmanager
def w4a8_fp8(on: bool):
    """vLLM's W4A8 Marlin: VLLM_MARLIN_INPUT_DTYPE=fp8, which vLLM accepts only on sm_89 / sm_12x; the
    CPU platform reports the sm_12x family (the documented target)."""
    from vllm.platforms import current_platform

    if not on:
        yield
        return
    saved = os.environ.get("VLLM_MARLIN_INPUT_DTYPE")
    os.environ["VLLM_MARLIN_INPUT_DTYPE"] = "fp8"
    cls = type(current_platform)
    family = cls.__dict__.get("is_device_capability_family")
    cls.is_device_capability_family = classmethod(lambda c, family, device_id=0: family == 120)
    try:
        yield
    finally:
        if saved is None:
            del os.environ["VLLM_MARLIN_INPUT_DTYPE"]
        else:
            os.environ["VLLM_MARLIN_INPUT_DTYPE"] = saved
        if family is None:
            del cls.is_device_capability_family
        else:
            cls.is_device_capability_family = family


def _run_case(rank, world, *, fmt, act_dtype, ep, experts, hidden, inter, convert_for, small_scales, checkpoints,
              padded, w4a8) -> dict:
    from vllm.model_executor.layers.quantization import get_quantization_config
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    dtype = getattr(torch, act_dtype)
    src, conv, qc, _ = case_tensors(fmt, "vllm", act_dtype=act_dtype, experts=experts, hidden=hidden, inter=inter,
                                    convert_for=convert_for, small_scales=small_scales, padded=padded,
                                    checkpoints=checkpoints, w4a8=w4a8)
    with vllm_cpu(world=world, rank=rank, ep=ep, dtype=dtype) as fresh:
        engine = make_layer(
            fresh, engine_config(fmt), experts=experts, hidden=hidden, inter=inter, dtype=dtype
        )
        from vllm.config import set_current_vllm_config

        engine_skipped = load_like_dsv4(engine, src, experts=experts)
        with set_current_vllm_config(fresh()):  # vLLM's model loader processes inside its config
            engine.quant_method.process_weights_after_loading(engine)
        from dsv4_convert.serving.config import PluginConfigError

        try:
            plugin = make_layer(
                fresh,
                get_quantization_config(qc["quant_method"]).from_config(qc),
                experts=experts,
                hidden=hidden,
                inter=inter,
                dtype=dtype,
            )
        except PluginConfigError as e:
            return {"refused": str(e), "engine_method": type(engine.quant_method).__name__}
        missing = load_like_dsv4(plugin, conv, experts=experts)
        with set_current_vllm_config(fresh()):
            plugin.quant_method.process_weights_after_loading(plugin)
    return {
        "engine_method": type(engine.quant_method).__name__,
        "plugin_method": type(plugin.quant_method).__name__,
        "local_experts": int(plugin.w13_weight.shape[0]),
        "shapes": {n: list(getattr(plugin, n).shape) for n in FINAL[fmt]},
        "rescale": getattr(plugin.quant_method, "rank_rescale_factors", {}),
        "engine_skipped": sorted(set(engine_skipped)),
        "skipped": sorted(set(missing)),
        "diff": compare_params(engine, plugin, FINAL[fmt]),
        # every parameter either layer holds (the input scales vLLM's Marlin path sets to None included)
        "params": {"engine": _dtypes(engine), "plugin": _dtypes(plugin)},
    }


def _dtypes(layer) -> dict:
    return {n: [str(p.dtype), list(p.shape)] for n, p in layer.named_parameters()}


def run_cases(rank, world, *, cases):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    return {c["id"]: run_case(rank, world, **{k: v for k, v in c.items() if k != "id"}) for c in cases}
