"""The one vLLM CPU-platform substitution of the engine tests that is about the test machine, not the plugin.

vLLM 0.34.0's `CpuPlatform.check_and_update_config` raises "vLLM on x86 CPUs requires Triton (triton-cpu)"
where 0.33.0 only warned. These tests never run a model step: they build vLLM's real layers and run its
weight loaders and `process_weights_after_loading`, none of which needs Triton; a GPU server (what users
run, with CUDA Triton) never reaches this CPU check. So the check is lifted here, in the test harness, and
not in the plugin: the plugin must not change how vLLM treats a real deployment. Only that one check is
lifted: `HAS_TRITON` reads True during `check_and_update_config` alone (its only use there is that check),
and everything else in the method runs as shipped.
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

__all__ = ["allow_x86_without_triton"]


def allow_x86_without_triton() -> None:
    """Idempotent; a no-op on vLLM releases without the check (0.33) and where Triton is installed."""
    import vllm.triton_utils as triton_utils
    from vllm.platforms.cpu import CpuPlatform

    if triton_utils.HAS_TRITON or getattr(CpuPlatform, "_dsv4_triton_lifted", False):
        return
    shipped = CpuPlatform.check_and_update_config.__func__

    def check_and_update_config(cls, vllm_config) -> None:
        triton_utils.HAS_TRITON = True  # read lazily by the shipped method, for its x86 check only
        try:
            shipped(cls, vllm_config)
        finally:
            triton_utils.HAS_TRITON = False

    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)
    CpuPlatform._dsv4_triton_lifted = True
