"""What vLLM's Kimi-K3 model (models/kimi_k3/nvidia, the class a CUDA user gets; the registry picks it off ROCm) needs
to be built, loaded and processed on a CPU; the same in the source's model and the conversion's, never a compared
tensor (serving_tests/vllm/harness_differential.py applies it):
- `VLLM_KIMI_K3_GEMM_AR=0`, vLLM's own switch for the GEMM + all-reduce fusion (KimiLinearModel's
  maybe_init_gemm_rs_ar imports the cute_dsl kernels, "NCCL symmetric-memory multicast"; the log line vLLM prints
  names this variable to disable it): a forward-pass kernel choice, no parameter.
- prefix caching off: vLLM's own `--no-enable-prefix-caching`, as for every hybrid MLA model (serving_tests/vllm/
  glm5next_cpu.py `cache_config` says why; Kimi-K3's KDA + MLA is one).
- `torch.cuda.Stream` / `Event` placeholders (KimiLinearModel's aux stream, KimiMoE's down-projection stream and
  events: scheduling only): serving_tests/vllm/dsv4_cpu.py's stand-in, already applied to every rank.
"""

from __future__ import annotations

import os

__all__ = ["use_cpu_kimi_k3"]


def use_cpu_kimi_k3() -> None:
    os.environ["VLLM_KIMI_K3_GEMM_AR"] = "0"

