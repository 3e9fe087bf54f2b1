"""CPU stand-in for Qwen3.8-Flash-Next (Qwen4-Exp) in vLLM 0.33.0's whole-model builds (serving_tests/vllm/
harness_differential.py calls `use_cpu_qwen4_exp()` once per rank; the same stand-in serves the source's model and the
conversion's, and it produces no compared tensor).

- vLLM 0.33.0's QSA attention implementation (vllm/models/qwen4_exp/nvidia/qsa.py Qwen4ExpQSAImpl.__init__) refuses
  to be built without FlashAttention's varlen kernel ("Qwen4Exp QSA requires FlashAttention"), which the CPU wheel
  lacks and a CUDA sm_120 GPU, the served target, has: its one question, `is_flash_attn_varlen_func_available()` as
  that module imported it, answers True. The implementation object owns no parameter or buffer (the layer's KV
  cache is allocated by the engine at serve time). vLLM 0.34.0 asks no such question at build time.
"""

from __future__ import annotations

__all__ = ["use_cpu_qwen4_exp"]


def use_cpu_qwen4_exp() -> None:
    try:  # the model module first: it and qsa.py import each other
        from vllm.models.qwen4_exp.nvidia import (
            model,  # noqa: F401
            qsa,
        )
    except ImportError:  # a release without Qwen4-Exp
        return
    if hasattr(qsa, "is_flash_attn_varlen_func_available"):  # vLLM 0.33.0 only
        qsa.is_flash_attn_varlen_func_available = lambda: True
