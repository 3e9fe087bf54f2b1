"""CPU stand-ins for the steps of SGLang's DeepSeek-V4 model (models/deepseek_v4.py, the one class SGLang has
for it on every platform) that a CPU cannot run while its weights are loaded; its construction, parameters,
weight loading and `post_load_weights` are SGLang's own, and nothing a test compares comes from a stand-in:
- `DeepseekV4ForCausalLM._prewarm_mhc_kernels` -> nothing: at the end of `load_weights` it JIT-compiles and
  runs the mHC (hyper-connection) TileLang kernels once on dummy inputs, asking the CUDA SM count, so that no
  compile lands on the serving path (a warm-up; it reads parameters, writes none).
"""

from __future__ import annotations


def use_cpu_stand_ins() -> None:
    from sglang.srt.models.deepseek_v4 import DeepseekV4ForCausalLM

    DeepseekV4ForCausalLM._prewarm_mhc_kernels = lambda self: None
