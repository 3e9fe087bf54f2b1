"""Runs inside a spawned gloo rank for serving_tests/test_families.py (its header lists the substitutions): the
whole model of a family, built by vLLM from the checkpoint's own config.json, loaded through the
model's own `load_weights` (its weight-name mapping) with the plugin; vLLM's own config for the source
names the method it would give each non-expert module."""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch
from common import checkpoint_tensors, model_summary, module_methods, run_model_cases
from cpu_platform import allow_x86_without_triton
from mla_cpu import use_cpu_reference_kernels

allow_x86_without_triton()  # vLLM 0.34 on an x86 CPU (cpu_platform.py says why)


def _marlin_runs_here() -> None:
    """The Marlin experts class refuses a machine without a CUDA sm80+ GPU; the backend is what
    `--moe-backend marlin` asks for on sm_120. vLLM lists no NVFP4 linear kernel for the CPU platform:
    its own emulation kernel is listed, so NVFP4 linear layers can be created (never run here)."""
    from vllm.model_executor.kernels.linear import _POSSIBLE_NVFP4_KERNELS, EmulationNvFp4LinearKernel
    from vllm.model_executor.layers.fused_moe.experts import marlin_moe
    from vllm.platforms import current_platform

    for cls in vars(marlin_moe).values():
        if isinstance(cls, type) and "_supports_current_device" in vars(cls):
            cls._supports_current_device = staticmethod(lambda: True)
    _POSSIBLE_NVFP4_KERNELS.setdefault(current_platform._enum, []).append(EmulationNvFp4LinearKernel)
    _marlin_fp4_linear_runs_here()
    # the CPU platform packs unquantised weights for its own GEMM with a vllm._C op this CPU wheel
    # lacks (a CUDA GPU keeps them as loaded)
    from vllm.model_executor.layers import utils as layer_utils

    layer_utils.dispatch_cpu_unquantized_gemm = lambda layer, remove_weight: None


def _marlin_fp4_linear_runs_here() -> None:
    """Weight-only FP4 dense layers (ModelOpt W4A16_NVFP4, compressed-tensors NVFP4A16 / MXFP4A16): vLLM forces its
    Marlin FP4 linear kernel, whose availability check (`is_fp4_marlin_supported`: a CUDA GPU of capability 7.5+)
    answers False on a CPU; it answers what the sm_120 GPU answers, and the MXFP4 one is listed for the CPU platform
    (CUDA lists it too). Their weight processing is vLLM's own (its repack op is the one test_differential.py
    substitutes); the same method processes those layers in both models."""
    from vllm.model_executor.kernels import linear
    from vllm.model_executor.kernels.linear.mxfp4.marlin import MarlinMxFp4LinearKernel
    from vllm.model_executor.kernels.linear.nvfp4 import marlin as nvfp4_marlin
    from vllm.model_executor.layers.quantization.utils import marlin_utils_fp4
    from vllm.platforms import current_platform

    marlin_utils_fp4.is_fp4_marlin_supported = nvfp4_marlin.is_fp4_marlin_supported = lambda: True
    linear._POSSIBLE_MXFP4_KERNELS.setdefault(current_platform._enum, []).append(MarlinMxFp4LinearKernel)


def _vllm_config(path: str):
    from vllm.config import KernelConfig, ModelConfig, VllmConfig

    model_config = ModelConfig(model=path, dtype="bfloat16", skip_tokenizer_init=True, enforce_eager=True)
    return VllmConfig(model_config=model_config, kernel_config=KernelConfig(moe_backend="marlin"))


def _build_and_load(path: str, *, source: str | None, process: bool) -> dict:
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import initialize_model, process_weights_after_loading
    from vllm.utils.torch_utils import set_default_torch_dtype

    vllm_config = _vllm_config(path)
    model_config, quant = vllm_config.model_config, vllm_config.quant_config
    with set_current_vllm_config(vllm_config), set_default_torch_dtype(model_config.dtype):
        model = initialize_model(vllm_config=vllm_config)
        methods = module_methods(model)
        source_quant = _vllm_config(source).quant_config if source else None
        loaded = model.load_weights(checkpoint_tensors(path))
        params = {name for name, _ in model.named_parameters()}  # before processing derives new ones
        if process:
            process_weights_after_loading(model, model_config, torch.device("cpu"))
        summary = model_summary(quant, model, methods, source_quant)  # the source's config asks inside it
    return {**summary, "not_loaded": sorted(params - set(loaded)),
            # parameters whose tensor the source does not have either (module and name, e.g. `q_norm.weight`)
            "absent_from_source": sorted(n for n in params - set(loaded) if source and not any(
                t.endswith("." + ".".join(n.split(".")[-2:])) for t, _ in checkpoint_tensors(source)))}


def run(rank: int, world: int, *, cases: dict) -> dict:
    """cases: id -> {"path": checkpoint, "source": compare with the engine's own config for it, "process":
    run process_weights_after_loading}. A case whose config or load raises reports {"error": ...}."""
    from vllm.config import ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.plugins import load_general_plugins

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    load_general_plugins()
    _marlin_runs_here()
    use_cpu_reference_kernels()  # serving_tests/vllm/mla_cpu.py (fam-mla)
    with set_current_vllm_config(VllmConfig(parallel_config=ParallelConfig(tensor_parallel_size=world))):
        init_distributed_environment(world_size=world, rank=rank, local_rank=rank, backend="gloo",
                                     distributed_init_method="env://")
        initialize_model_parallel(tensor_model_parallel_size=world)
    return run_model_cases(cases, _build_and_load)
