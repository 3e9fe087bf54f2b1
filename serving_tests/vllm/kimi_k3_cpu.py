"""What vLLM's Kimi-K3 model (models/kimi_k3/nvidia, the class a CUDA user gets; the registry picks it off ROCm) needs
to be built, loaded and processed on a CPU; the same in the source's model and the conversion's, never a compared
tensor (serving_tests/vllm/harness_differential.py applies it):
- `VLLM_KIMI_K3_GEMM_AR=0`, vLLM's own switch for the GEMM + all-reduce fusion (KimiLinearModel's
  maybe_init_gemm_rs_ar imports the cute_dsl kernels, "NCCL symmetric-memory multicast"; the log line vLLM prints
  names this variable to disable it): a forward-pass kernel choice, no parameter.
- prefix caching off (`--no-enable-prefix-caching`, a launch flag): with it on, vLLM aligns the hybrid KDA / MLA
  model's Mamba block size to the attention block size of the attention backend it finds, and on the CPU platform
  (its CPU_MLA backend) that size fails vLLM's own check ("--mamba-block-size can only be set with
  --enable-prefix-caching"); the cache layout creates no parameter.
- `torch.cuda.Stream` / `Event` placeholders (KimiLinearModel's aux stream, KimiMoE's down-projection stream and
  events: scheduling only): serving_tests/vllm/dsv4_cpu.py's stand-in, already applied to every rank.
"""

from __future__ import annotations

import os

__all__ = ["kimi_k3_cache_config", "use_cpu_kimi_k3"]


def use_cpu_kimi_k3() -> None:
    os.environ["VLLM_KIMI_K3_GEMM_AR"] = "0"


def kimi_k3_cache_config(model_config):
    """The cache config to build Kimi-K3 with (prefix caching off), or None: every other family keeps vLLM's default."""
    if model_config.hf_config.model_type not in ("kimi_k3", "kimi_k31"):
        return None
    from vllm.config import CacheConfig

    return CacheConfig(enable_prefix_caching=False)
