"""Runs inside a spawned gloo rank for serving_tests/test_differential.py (its header lists the
substitutions): for each case, vLLM builds the whole model twice under the model's dtype, as its model
loader does (`initialize_model` under `set_default_torch_dtype`, the model's own `load_weights`, then
`process_weights_after_loading` over every module): once from the source checkpoint (vLLM's own
quantisation method for it) and once from the conversion (the plugin); every parameter and buffer of
the two is compared by name, dtype, shape and bytes. Substitutions: test_differential.py's header (this file
applies them), and for Nemotron-H serving_tests/vllm/nemotron_cpu.py (the non-gated MoE platform check).

DeepSeek-V4 (serving_tests/vllm/dsv4_cpu.py, each with its reason there): the CUDA model class is built
(`models/deepseek_v4/nvidia`, what a CUDA user gets; the CPU platform's registry gives a different CPU model);
while it is built, loaded and processed the device capability reads 12.0 (sm_120) and FlashInfer's SM120 DSV4
specialisation lookup answers present (they pick the attention class, which owns no parameter of its own);
`torch.cuda.Stream` / `Event` are placeholders (forward-pass scheduling); the FP8 block-linear kernel lookup
gives vLLM's sm_120 choice, CUTLASS block FP8 (weight processing in torch; CPU lists only AMX kernels)."""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch
from common import checkpoint_tensors
from differential_state import model_state, run_diff_cases, state_diff, zero_fill
from dsv4_cpu import as_sm120, cuda_model_class, use_cpu_stand_ins
from dsv41_cpu import as_sm120_device, engram_config, use_cuda_quant_config, use_mxfp8_emulation
from glm5next_cpu import cache_config
from harness_gpt_oss_rows import engine_rows_as_plugin
from harness_models import _marlin_runs_here
from kimi_k3_cpu import use_cpu_kimi_k3
from minimax_m3_cpu import stand_in_cute_dsl_ops
from mla_cpu import use_cpu_reference_kernels
from nemotron_cpu import use_cpu_nemotron_h
from qwen4_exp_cpu import use_cpu_qwen4_exp


def _model(path: str, dtype: str, text_only: bool = False):
    from vllm.config import KernelConfig, ModelConfig, VllmConfig

    model_config = ModelConfig(model=path, dtype=dtype, skip_tokenizer_init=True, enforce_eager=True,
                               language_model_only=text_only)
    vllm_config = VllmConfig(model_config=model_config, kernel_config=KernelConfig(moe_backend="marlin"),
                             engram_config=engram_config(model_config),  # DeepSeek-V4.1: dsv41_cpu.py
                             **({"cache_config": c} if (c := cache_config(model_config)) else {}))  # glm5next_cpu.py
    model_class = cuda_model_class(model_config.hf_config)  # DeepSeek-V4 / V4.1, DSA: serving_tests/vllm/dsv4_cpu.py
    return _load(path, vllm_config, model_config, model_class)


def cuda_draft_class(draft_model_config):
    """The draft class a CUDA user gets where the registry's differs on the CPU platform (dsv4_cpu.py): DeepSeek-V4.1's
    DSpark draft (the registry's `vllm.models.deepseek_v41` entry already picks it off ROCm); None otherwise."""
    if draft_model_config.hf_config.architectures == ["DSparkV41DraftModel"]:
        from vllm.models.deepseek_v41.nvidia.dspark import DSparkDeepseekV4ForCausalLM

        return DSparkDeepseekV4ForCausalLM
    return None


def _load(path: str, vllm_config, model_config, model_class=None):
    """vLLM's model loader's steps: build under the model's dtype and config, the model's own `load_weights`,
    then `process_weights_after_loading` over every module (parameters zero-filled first: zero_fill says why)."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import initialize_model, process_weights_after_loading
    from vllm.utils.torch_utils import set_default_torch_dtype

    with set_current_vllm_config(vllm_config), set_default_torch_dtype(model_config.dtype), as_sm120(model_class), \
            as_sm120_device(model_class):
        model = initialize_model(vllm_config=vllm_config, model_config=model_config, model_class=model_class)
        zero_fill(model)
        model.load_weights(checkpoint_tensors(path))
        process_weights_after_loading(model, model_config, torch.device("cpu"))
    return model


def _diff(*, source: str, converted: str, dtype: str, fmt: str, text_only: bool = False) -> dict:
    engine = model_state(_model(source, dtype, text_only))
    if fmt == "mxfp4-gptoss":  # the plugin's one documented difference: w13 rows [gates; ups]
        engine = engine_rows_as_plugin(engine)
    plugin = model_state(_model(converted, dtype, text_only))
    return state_diff(engine, plugin)


def _native_static_fp8_quant(input, scale=None, num_token_padding=None, scale_ub=None,
                             use_per_token_if_dynamic=False, output=None, group_shape=None):
    """`ops.scaled_fp8_quant` with a given per-tensor scale (what FP8 linear processing calls to requantise a
    fused layer's shards to one scale), through vLLM's own torch path for it, QuantFP8.forward_native."""
    from vllm.model_executor.layers.quantization.input_quant_fp8 import QuantFP8
    from vllm.model_executor.layers.quantization.utils.quant_utils import GroupShape

    assert scale is not None and scale.numel() == 1 and output is None, "only the static per-tensor form"
    quantised, _ = QuantFP8(static=True, group_shape=GroupShape.PER_TENSOR).forward_native(input, scale)
    return quantised, scale


def run(rank: int, world: int, *, cases: dict) -> dict:
    """cases: id -> {"source", "converted": checkpoint paths, "dtype": the model dtype}; a case whose build or load
    raises reports {"error"} (the test fails on it)."""
    from harness_vllm import _reference_repack
    from vllm import _custom_ops as ops
    from vllm.config import ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.layers import utils as layer_utils
    from vllm.plugins import load_general_plugins

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    load_general_plugins()
    _marlin_runs_here()
    use_cpu_reference_kernels()  # MLA families: serving_tests/vllm/mla_cpu.py
    use_cpu_nemotron_h()  # non-gated MoE platform check: serving_tests/vllm/nemotron_cpu.py (nemotron)
    use_cpu_qwen4_exp()  # vLLM 0.33's QSA FlashAttention check: serving_tests/vllm/qwen4_exp_cpu.py
    use_cpu_stand_ins()  # DeepSeek-V4's CUDA model: serving_tests/vllm/dsv4_cpu.py
    use_cuda_quant_config()  # DeepSeek-V4.1's quantisation config class: serving_tests/vllm/dsv41_cpu.py
    use_mxfp8_emulation()  # DeepSeek-V4.1's MXFP8 dense linears: serving_tests/vllm/dsv41_cpu.py
    use_cpu_kimi_k3()  # Kimi-K3's GEMM + all-reduce switch: serving_tests/vllm/kimi_k3_cpu.py
    stand_in_cute_dsl_ops()  # MiniMax-M3's CuTe DSL fused-MLP module: serving_tests/vllm/minimax_m3_cpu.py
    ops.gptq_marlin_repack = _reference_repack
    ops.scaled_fp8_quant = _native_static_fp8_quant  # its CUDA op static_scaled_fp8_quant (FP8 layers, both models)
    # the CPU platform packs unquantised weights for its own GEMM (a CUDA GPU keeps them as loaded)
    layer_utils.dispatch_cpu_unquantized_gemm = lambda layer, remove_weight: None
    with set_current_vllm_config(VllmConfig(parallel_config=ParallelConfig(tensor_parallel_size=world))):
        init_distributed_environment(world_size=world, rank=rank, local_rank=rank, backend="gloo",
                                     distributed_init_method="env://")
        initialize_model_parallel(tensor_model_parallel_size=world)
    return run_diff_cases(cases, _diff)
