"""CPU stand-ins for the steps of vLLM's CUDA DeepSeek-V4 model that a CPU cannot run while the model is built
and its weights are loaded and processed. The model built is the class a CUDA user gets
(models/deepseek_v4/nvidia/model.py; vLLM's CPU platform would pick its CPU model, models/deepseek_v4/cpu, a
different model: its own attention class and weights mapper). Its construction, parameters, weight loading and
processing are vLLM's own; nothing a test compares comes from a stand-in:
- the DSA models (DeepSeek-V3.2, GLM-5.x) are built with the class a CUDA user gets too, `models/deepseek_v32/nvidia/
  model.py`'s DeepseekV32ForCausalLM (the CPU registry gives deepseek_v2.py's generic class), under the same
  capability stand-in (GLM-5's low-latency GEMM table has no entry for 12.0: none is installed, as on sm_120).
- the device capability -> 12.0 (sm_120, the GPU this project serves), while a DeepSeek-V4 model is built,
  loaded and processed: the model picks its attention class by it (FlashInfer's SM120 sparse MLA) and that
  class its FP8 einsum recipe (a forward-pass setting).
- FlashInfer's SM120 DSV4 decode specialisation lookup -> present (FlashInfer is not installed here; the
  lookup gates the attention class, which creates no parameter of its own: all come from DeepseekV4Attention).
- `torch.cuda.Stream` / `torch.cuda.Event` -> a placeholder object: DeepseekV4Model makes three auxiliary CUDA
  streams for its attention's parallel input GEMMs, each attention layer four events to order them
  (scheduling only, no tensor).
- the FP8 block-linear kernel lookup (attention, shared experts: `DeepseekV4FP8Config`'s block FP8) -> the
  kernel vLLM picks on sm_120, `CutlassFp8BlockScaledMMKernel` (its CUDA list: FlashInfer's DeepGEMM and
  DeepGEMM need sm_90/sm_100, CUTLASS block FP8 runs on sm_120): on the CPU platform vLLM lists only its AMX
  kernels ("requires AMX tile support"). Its weight processing is the block kernels' shared torch code
  (`process_fp8_weight_block_strategy`); only its GEMM (never run here) is CUDA. The same method in both models.
"""

from __future__ import annotations

from contextlib import contextmanager


class _NoStream:
    """What the model keeps of a CUDA stream or event here: nothing (they are used only in a forward pass)."""


def use_cpu_stand_ins() -> None:
    import torch
    from vllm.model_executor.kernels import linear
    from vllm.model_executor.kernels.linear.scaled_mm.cutlass import CutlassFp8BlockScaledMMKernel
    from vllm.platforms import PlatformEnum

    torch.cuda.Stream = torch.cuda.Event = _NoStream
    CutlassFp8BlockScaledMMKernel.is_supported = classmethod(lambda cls, compute_capability=None: (True, None))
    linear._POSSIBLE_FP8_BLOCK_KERNELS[PlatformEnum.CPU] = [CutlassFp8BlockScaledMMKernel]


def cuda_model_class(hf_config):
    """The class a CUDA user gets where the CPU registry gives another one (DeepSeek-V4 / V4.1; the DSA models
    DeepSeek-V3.2 and GLM-5.x: `vllm/models/deepseek_v32/__init__.py` picks `nvidia/model.py`'s DeepseekV32ForCausalLM
    on CUDA, deepseek_v2.py's generic classes elsewhere), or None (every other family: the registry's class). V4.1's
    registry entry (`vllm.models.deepseek_v41`) already picks the CUDA class off ROCm; named here so that it is
    built, loaded and processed as on sm_120 too (as_sm120)."""
    if hf_config.model_type in _DSA_MODEL_TYPES:
        from vllm.models.deepseek_v32.nvidia.model import DeepseekV32ForCausalLM

        return DeepseekV32ForCausalLM
    if hf_config.model_type == "deepseek_v41":
        from vllm.models.deepseek_v41.nvidia.vl_model import DeepseekV41ForCausalLM

        return DeepseekV41ForCausalLM
    if hf_config.model_type != "deepseek_v4":
        return None
    from vllm.models.deepseek_v4.nvidia.model import DeepseekV4ForCausalLM

    return DeepseekV4ForCausalLM


_DSA_MODEL_TYPES = ("deepseek_v32", "glm_moe_dsa")  # "GLM-5.2 (glm_moe_dsa) reuses the CUDA DSA module"


@contextmanager
def as_sm120(model_class):
    """While `model_class` (a DeepSeek-V4 CUDA model; None: nothing changes) is built, loaded and processed."""
    if model_class is None:
        yield
        return
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability
    from vllm.utils import flashinfer

    saved = current_platform.__dict__.get("get_device_capability"), flashinfer.has_flashinfer_sparse_mla_sm120_config
    current_platform.get_device_capability = lambda device_id=0: DeviceCapability(12, 0)
    flashinfer.has_flashinfer_sparse_mla_sm120_config = lambda num_q_heads, top_k: True
    try:
        yield
    finally:
        if saved[0] is None:
            del current_platform.get_device_capability
        else:
            current_platform.get_device_capability = saved[0]
        flashinfer.has_flashinfer_sparse_mla_sm120_config = saved[1]
