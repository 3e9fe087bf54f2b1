"""Runs inside a spawned gloo rank for serving_tests/test_draft_differential.py: vLLM builds the MTP DRAFT model of
a checkpoint twice, as its speculative-decoding proposer does (llm_base_proposer.py `_get_model`: `get_model`
with the target's VllmConfig, whose `quant_config` is the target's, and `speculative_config.draft_model_config`,
the target's config with the draft architecture: SpeculativeConfig.hf_config_override), once from the source
(vLLM's own method for it) and once from the conversion (the plugin), and compares every parameter and buffer by
name, dtype, shape and bytes. The set-up and CPU substitutions are harness_differential.py's (test_differential.py
lists them), and one more: the CPU platform's packing of UNQUANTISED routed experts (`CPUUnquantizedExperts.
process_weights_after_loading`, a vllm._C op the CPU wheel lacks; a CUDA GPU keeps them as loaded) is skipped,
in both drafts alike (the drafts' BF16 MTP experts are the first unquantised MoE these harnesses build)."""

from __future__ import annotations

import os

import harness_differential
from differential_state import draft_diff

# the speculative method whose draft a model type ships: DeepSeek-V4.1's `mtp.{0,1,2}` stages are a DSpark draft
# (vLLM 0.34 config/speculative.py: "V4.1 has no classic-MTP draft ... method=mtp on V4.1 is rejected"), built as
# DSparkV41DraftModel (v1/worker/gpu/spec_decode/dspark/config.py adapt_draft_model_config)
DRAFT_METHOD = {"deepseek_v41": ("dspark", 3)}


def _draft(path: str, dtype: str):
    from vllm.config import KernelConfig, ModelConfig, ParallelConfig, SpeculativeConfig, VllmConfig

    target = ModelConfig(model=path, dtype=dtype, skip_tokenizer_init=True, enforce_eager=True)
    parallel = ParallelConfig()
    method, tokens = DRAFT_METHOD.get(target.hf_config.model_type, ("mtp", 1))
    spec = SpeculativeConfig(method=method, num_speculative_tokens=tokens, target_model_config=target,
                             target_parallel_config=parallel)
    # a DSpark draft runs under Model Runner V2 only (V1: "does not support: dspark"), which a CUDA server with
    # Triton picks by itself; without Triton (this CPU) vLLM 0.33 falls back to V1: V2, while the config is made
    saved = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")
    if method == "dspark":
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    try:
        vllm_config = VllmConfig(model_config=target, parallel_config=parallel, speculative_config=spec,
                                 kernel_config=KernelConfig(moe_backend="marlin"),
                                 engram_config=harness_differential.engram_config(target),
                                 **({"cache_config": c} if (c := harness_differential.cache_config(target)) else {}))
    finally:
        if saved is None:
            os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
        else:
            os.environ["VLLM_USE_V2_MODEL_RUNNER"] = saved
    return harness_differential._load(path, vllm_config, spec.draft_model_config,
                                      harness_differential.cuda_draft_class(spec.draft_model_config))


def _diff_drafts(*, source: str, converted: str, dtype: str, fmt: str, text_only: bool = False) -> dict:
    engine_model = _draft(source, dtype)  # SOURCE_LINE: the engine's own load
    return draft_diff(engine_model, _draft(converted, dtype))


def _keep_unquantised_experts_as_loaded() -> None:
    try:
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    except ImportError:  # a release without the CPU experts class: nothing to skip
        return
    CPUUnquantizedExperts.process_weights_after_loading = lambda self, layer: None


def run(rank: int, world: int, *, cases: dict) -> dict:
    _keep_unquantised_experts_as_loaded()
    harness_differential._diff = _diff_drafts  # harness_differential.run's set-up, the draft model instead
    return harness_differential.run(rank, world, cases=cases)
