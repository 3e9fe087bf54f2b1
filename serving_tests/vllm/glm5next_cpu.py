"""The engine's own way through the CPU platform for GLM-5.3-Flash (Glm5NextForCausalLM and
Glm5NextForConditionalGeneration: KDA linear attention, a mamba-style state, beside MLA) in vLLM's whole-model
builds (serving_tests/vllm/harness_differential.py and harness_draft.py pass `cache_config(model_config)` to the
VllmConfig they build; the same set-up serves the source's model and the conversion's).

- Prefix caching off: vLLM's own `--no-enable-prefix-caching` (CacheConfig(enable_prefix_caching=False)). The
  hybrid hook (model_executor/models/config.py MambaModelConfig) sets `mamba_block_size = block_size` because prefix
  caching is on by default; the CPU platform then turns prefix caching off for any MLA model ("MLA is enabled on a
  non-GPU platform; forcing chunked prefill and prefix caching to be disabled", platforms/cpu.py
  check_and_update_config), and VllmConfig's own check refuses the pair ("--mamba-block-size can only be set with
  --enable-prefix-caching"). With the flag the hook sets `mamba_block_size = max_model_len` and mamba cache mode
  "none", which is what the CPU platform leaves anyway. Qwen3-Next and Nemotron-H (hybrid, no MLA) never meet it.
  The flag changes the KV and state caches' bookkeeping only: no parameter, loader or weight processing reads it.
"""

from __future__ import annotations

__all__ = ["cache_config"]


def cache_config(model_config):
    """`CacheConfig(enable_prefix_caching=False)` for a hybrid MLA model (GLM-5.3-Flash); else None (vLLM's default)."""
    from vllm.config import CacheConfig

    if model_config.is_hybrid and model_config.use_mla:
        return CacheConfig(enable_prefix_caching=False)
    return None
