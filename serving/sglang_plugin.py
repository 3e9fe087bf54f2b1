"""SGLang entry point (`sglang.srt.plugins`): registers the `marlin_fp4` quantization method.

SGLang calls `register()` from `load_plugins()` in every process. It does nothing when SGLang is not
installed, and registering twice leaves the registry as it was (SGLang's loader already guards
against double loads; this guards against direct calls too).
"""

from __future__ import annotations

import logging

from ..core.targets.engines import QUANT_METHOD, registration_log_line

__all__ = ["register"]

logger = logging.getLogger("dsv4_convert.serving")


def register() -> bool:
    """Add `marlin_fp4` to SGLang's quantization registries. Returns True when it is registered."""
    try:
        import sglang
        from sglang.srt.layers import quantization as sgl_quant
    except ImportError:
        return False
    from .sglang_methods import SglangMarlinFp4Config

    registries = [sgl_quant.QUANTIZATION_METHODS]
    if hasattr(sgl_quant, "CPU_QUANTIZATION_METHODS"):
        registries.append(sgl_quant.CPU_QUANTIZATION_METHODS)
    if all(reg.get(QUANT_METHOD) is SglangMarlinFp4Config for reg in registries):
        return True
    for reg in registries:
        reg[QUANT_METHOD] = SglangMarlinFp4Config
    logger.info(registration_log_line("sglang", sglang.__version__))
    return True
