"""vLLM entry point (`vllm.general_plugins`): registers the `marlin_fp4` quantization method.

vLLM calls `register()` from `load_general_plugins()` in every process. It does nothing when vLLM is
not installed, and registering twice leaves the registry as it was.
"""

from __future__ import annotations

import logging

from ..core.targets.engines import QUANT_METHOD, registration_log_line

__all__ = ["register"]

logger = logging.getLogger("dsv4_convert.serving")


def register() -> bool:
    """Register `marlin_fp4` with vLLM's quantization registry. Returns True when it is registered."""
    try:
        import vllm
        from vllm.model_executor.layers import quantization as vllm_quant
    except ImportError:
        return False
    from .vllm_config import VllmMarlinFp4Config

    if vllm_quant._CUSTOMIZED_METHOD_TO_QUANT_CONFIG.get(QUANT_METHOD) is VllmMarlinFp4Config:
        return True
    vllm_quant.register_quantization_config(QUANT_METHOD)(VllmMarlinFp4Config)
    logger.info(registration_log_line("vllm", vllm.__version__))
    return True
