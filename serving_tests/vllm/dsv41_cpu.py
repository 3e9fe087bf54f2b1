"""CPU stand-ins for the steps of vLLM 0.34's CUDA DeepSeek-V4.1 model (`models/deepseek_v41/nvidia`) that a CPU
cannot run while the model is built and its weights are loaded and processed, beyond DeepSeek-V4's
(serving_tests/vllm/dsv4_cpu.py). Its construction, parameters, weight loading and processing are vLLM's own;
nothing a test compares comes from a stand-in:
- the quantisation config class for `deepseek_v4_fp8`: `get_quantization_config` gives the V4.1 class
  (`vllm.models.deepseek_v41.DeepseekV4FP8Config`, "the v4 one extended to accept model_type deepseek_v41 and its
  32x32 MXFP8 linear layout") on CUDA and ROCm, and the V4 class elsewhere, whose override hook does not know
  model_type deepseek_v41 (vLLM then builds plain `fp8` for a V4.1 checkpoint). Here the CPU gets CUDA's class.
- the MXFP8 linear kernel lookup (the 32x32 FP8 dense linears, served as MXFP8 W8A8): vLLM lists none for the CPU
  platform; on sm_120 it picks Marlin MXFP8, whose weight processing is a CUDA op (`gptq_marlin_repack`, 8 bit).
  Here the CPU gets vLLM's own software kernel from its CUDA list, `EmulationMxfp8LinearKernel` (dequantises each
  linear to BF16 in torch at load). The same method and kernel in both models: what is compared for these linears
  is that torch function of the bytes each model loaded, never Marlin MXFP8's tile order. The grouped `wo_a` (a
  batched MXFP8 GEMM) gets the same kernel, which is sm_120's own pick there: vLLM lists DeepGemmMxfp8BmmLinearKernel
  ("DeepGEMM MXFP8 BMM requires Blackwell", family 100) then EmulationMxfp8LinearKernel for CUDA, none elsewhere.
- Engram: built with `EngramConfig(cpu_offload=False)` (`--engram-config '{"cpu_offload": false}'`, the tables in
  device memory): vLLM's default offload keeps the same parameters in pinned host memory, which needs CUDA
  (`pin_memory`, UVA); the parameters, their loader and their bytes are the same either way. While a V4.1 model is
  built, the current device index reads 0 and its properties an RTX PRO 6000's SM count (188): the Engram table
  keeps the SM count for its lookup kernels' grid (forward only).
"""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

__all__ = ["as_sm120_device", "engram_config", "use_cuda_quant_config", "use_mxfp8_emulation"]

SM120_SMS = 188  # RTX PRO 6000 Blackwell: 188 streaming multiprocessors


def use_cuda_quant_config() -> None:
    """What `get_quantization_config("deepseek_v4_fp8")` imports on the CPU platform is CUDA's V4.1 class."""
    import vllm.models.deepseek_v4 as v4
    from vllm.models.deepseek_v41 import DeepseekV4FP8Config as CudaConfig

    v4.DeepseekV4FP8Config = CudaConfig


def use_mxfp8_emulation() -> None:
    """The MXFP8 linear kernel for the CPU platform: vLLM's own emulation kernel (module header says why)."""
    from vllm.model_executor.kernels.linear import _POSSIBLE_MXFP8_KERNELS, EmulationMxfp8LinearKernel
    from vllm.model_executor.kernels.linear.mxfp8.Mxfp8LinearKernel import Mxfp8LinearLayerConfig
    from vllm.model_executor.layers.quantization import modelopt
    from vllm.platforms import current_platform

    kernels = _POSSIBLE_MXFP8_KERNELS.setdefault(current_platform._enum, [])
    if EmulationMxfp8LinearKernel not in kernels:
        kernels.append(EmulationMxfp8LinearKernel)
    shipped = modelopt.init_mxfp8_linear_kernel
    if getattr(shipped, "_dsv41_cpu", False):
        return

    def init_mxfp8_linear_kernel(*, weight_shape, bmm_batch_size=None):
        if bmm_batch_size is None:
            return shipped(weight_shape=weight_shape)
        return EmulationMxfp8LinearKernel(Mxfp8LinearLayerConfig(weight_shape=weight_shape,
                                                                 bmm_batch_size=bmm_batch_size))

    init_mxfp8_linear_kernel._dsv41_cpu = True
    modelopt.init_mxfp8_linear_kernel = init_mxfp8_linear_kernel


def engram_config(model_config):
    """The Engram config the harness builds V4.1 with (header says why); None for a model without Engram layers
    (vLLM refuses an Engram config there)."""
    from vllm.config.engram import EngramConfig, model_has_engram_layers

    return EngramConfig(cpu_offload=False) if model_has_engram_layers(model_config) else None


@contextmanager
def as_sm120_device(model_class):
    """While a DeepSeek-V4.1 model is built, loaded and processed: device index 0, an sm_120 card's SM count."""
    import torch

    if model_class is None or model_class.__module__.split(".")[:3] != ["vllm", "models", "deepseek_v41"]:
        yield
        return
    saved = torch.accelerator.current_device_index, torch.cuda.get_device_properties
    torch.accelerator.current_device_index = lambda: 0
    torch.cuda.get_device_properties = lambda device=None: SimpleNamespace(multi_processor_count=SM120_SMS,
                                                                           major=12, minor=0)
    try:
        yield
    finally:
        torch.accelerator.current_device_index, torch.cuda.get_device_properties = saved
