"""Runs inside a spawned gloo rank for serving_tests/test_draft_differential.py: SGLang builds the MTP DRAFT model of
a checkpoint twice, as its draft worker does (`ModelConfig(..., is_draft_model=True)`, which renames the
architecture to the draft's: DeepseekV3ForCausalLMNextN, Qwen3NextForCausalLMMTP, ...; the quantisation lookup
`_get_quantization_config`, `_initialize_model`, the model's own `load_weights` and every module's
`process_weights_after_loading`), once from the source and once from the conversion, and compares every
parameter and buffer. The set-up and CPU substitutions are harness_differential.py's."""

from __future__ import annotations

import harness_differential
import torch
from common import checkpoint_tensors
from differential_state import model_state, state_diff, zero_fill


def _draft(path: str, dtype: str):
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.loader import DefaultModelLoader, _get_quantization_config, _initialize_model
    from sglang.srt.model_loader.utils import set_default_torch_dtype

    model_config = ModelConfig(path, dtype=dtype, is_draft_model=True)
    quant = _get_quantization_config(model_config, LoadConfig())
    with set_default_torch_dtype(model_config.dtype):
        model = _initialize_model(model_config, LoadConfig(), quant)
        zero_fill(model)
        DefaultModelLoader.load_weights_and_postprocess(model, checkpoint_tensors(path), torch.device("cpu"))
    return model


def _diff_drafts(*, source: str, converted: str, dtype: str, fmt: str, text_only: bool = False) -> dict:
    torch.cuda.get_device_capability = lambda device=None: harness_differential.CAPABILITY.get(fmt, harness_differential.SM120)
    engine_model = _draft(source, dtype)
    out = state_diff(model_state(engine_model), model_state(_draft(converted, dtype)))
    out["draft_class"] = type(engine_model).__name__
    out["methods"] = sorted({type(m.quant_method).__name__ for m in engine_model.modules()
                             if getattr(m, "quant_method", None) is not None})
    return out


def run(rank: int, world: int, *, cases: dict) -> dict:
    harness_differential._diff = _diff_drafts  # harness_differential.run's set-up, the draft model instead
    return harness_differential.run(rank, world, cases=cases)
