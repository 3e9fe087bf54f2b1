"""The CPU stand-in of its own that vLLM 0.34's CUDA MiniMax-M3 model (`models/minimax_m3/nvidia/model.py`) needs while it is built:
its dense / shared-expert MLP (`MiniMaxM3MLP.__init__`) imports `models/minimax_m3/nvidia/ops/dense_gemm1_mxfp8` to ask
`can_fuse_gemm1` whether a fused CuTe DSL MXFP8 GEMM replaces gate_up_proj + activation. That module, and the `ops`
package's `__init__` (which imports the CuTe DSL index-decode kernel), import `cutlass` and `cuda.bindings`
(nvidia-cutlass-dsl: CUDA only, not in a CPU wheel's environment). Here:
- the `ops` package is registered without running its `__init__` (its other modules still import from vLLM's own
  directory, unchanged);
- `dense_gemm1_mxfp8` is its answer on the served card: `can_fuse_gemm1` returns False (the shipped function returns
  False first of all unless `current_platform.is_device_capability_family(100)`; an RTX PRO 6000 is sm_120, family
  120), `MIN_TOKENS` is never read then.
The fused kernel owns no parameter: the model's parameters, their loaders and processing are vLLM's own either way.
vLLM 0.33.0's MiniMax-M3 MLP does not import the module (nothing is stood in there). M3.1's MXFP8 linears take the
MXFP8 emulation kernel DeepSeek-V4.1's do (serving_tests/vllm/dsv41_cpu.py use_mxfp8_emulation says why).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

__all__ = ["stand_in_cute_dsl_ops"]

_OPS = "vllm.models.minimax_m3.nvidia.ops"


def stand_in_cute_dsl_ops() -> None:
    """Idempotent; a no-op where vLLM has no MiniMax-M3 `ops` package or `cutlass` imports (a CUDA install)."""
    if _OPS in sys.modules or importlib.util.find_spec("cutlass") is not None:
        return
    parent = importlib.util.find_spec("vllm.models.minimax_m3.nvidia")
    if parent is None or not (Path(parent.origin).parent / "ops" / "dense_gemm1_mxfp8.py").exists():
        return
    ops = types.ModuleType(_OPS)
    ops.__path__ = [str(Path(parent.origin).parent / "ops")]
    fused = types.ModuleType(f"{_OPS}.dense_gemm1_mxfp8")
    fused.can_fuse_gemm1 = lambda gate_up_proj, down_proj, act_fn: False  # sm_120: not capability family 100
    ops.dense_gemm1_mxfp8 = fused
    sys.modules[_OPS], sys.modules[fused.__name__] = ops, fused
