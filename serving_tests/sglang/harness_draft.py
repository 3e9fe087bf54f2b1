"""Runs inside a spawned gloo rank for serving_tests/test_draft_differential.py: SGLang builds the MTP DRAFT model of
a checkpoint twice, as its draft worker does (`ModelConfig(..., is_draft_model=True)`, which renames the
architecture to the draft's: DeepseekV3ForCausalLMNextN, Qwen3NextForCausalLMMTP, ...; the quantisation lookup
`_get_quantization_config`, `_initialize_model`, the model's own `load_weights` and every module's
`process_weights_after_loading`), once from the source and once from the conversion, and compares every
parameter and buffer. The set-up and CPU substitutions are harness_differential.py's."""

from __future__ import annotations

import harness_differential
from differential_state import draft_diff


def _diff_drafts(*, source: str, converted: str, dtype: str, fmt: str, text_only: bool = False) -> dict:
    harness_differential.use_capability_of(fmt)
    engine_model = harness_differential._model(source, dtype, draft=True)  # SOURCE_LINE: the engine's own load
    return draft_diff(engine_model, harness_differential._model(converted, dtype, draft=True))


def run(rank: int, world: int, *, cases: dict) -> dict:
    harness_differential._diff = _diff_drafts  # harness_differential.run's set-up, the draft model instead
    return harness_differential.run(rank, world, cases=cases)
