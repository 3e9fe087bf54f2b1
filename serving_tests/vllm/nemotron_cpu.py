"""CPU stand-ins for Nemotron-H (non-gated relu2 experts, Mamba-2 layers) in vLLM's whole-model builds
(serving_tests/vllm/harness_differential.py calls `use_cpu_nemotron_h()` once per rank; the same stand-in
serves the source's model and the conversion's, and none of them is a compared tensor).

- vLLM's `FusedMoEConfig.__post_init__` refuses a non-gated MoE (`is_act_and_mul=False`) on any platform but
  CUDA, XPU and ROCm ("is_act_and_mul=False is supported only for CUDA, XPU and ROCm for now"): the one
  platform question that check asks, `current_platform.is_cuda_alike()` in fused_moe/config.py, answers
  True there (the served target is a CUDA sm_120 GPU); every other platform answer in that module and
  everywhere else is the CPU platform's own.
"""

from __future__ import annotations

__all__ = ["use_cpu_nemotron_h"]


class _CudaAlikePlatform:
    """The CPU platform, except that it says it is CUDA-alike (the non-gated MoE platform check only)."""

    def __init__(self, platform):
        self._platform = platform

    def is_cuda_alike(self) -> bool:
        return True

    def __getattr__(self, name):
        return getattr(self._platform, name)


def use_cpu_nemotron_h() -> None:
    from vllm.model_executor.layers.fused_moe import config

    if not isinstance(config.current_platform, _CudaAlikePlatform):
        config.current_platform = _CudaAlikePlatform(config.current_platform)
