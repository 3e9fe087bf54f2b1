"""CPU stand-in for the one SGLang call that the MLA families (DeepSeek-R1/V3/V3.2, Kimi-K2) reach and a CPU
cannot answer; the model's construction, its parameters and its weight loading are SGLang's own:
- `get_device()` in SGLang's rotary-embedding variants -> "cpu": DeepseekScalingRotaryEmbedding (YaRN, used by
  MLA and by V3.2's indexer) asks for the accelerator to place its cos/sin cache and raises "No accelerator
  (CUDA, XPU, HPU, NPU, MUSA, MPS) or platform plugin is available." on CPU. The cache is a buffer computed
  from the config, not a checkpoint tensor.
"""

from __future__ import annotations


def use_cpu_rope_device() -> None:
    import sglang.srt.layers.rotary_embedding.rope_variant as rope_variant

    rope_variant.get_device = lambda device_id=None: "cpu"
