"""Runs inside a spawned gloo rank for serving_tests/test_engine_refusals.py's Kimi-K3 cases on SGLang 0.5.23, with the
set-up of harness_differential.py (its header lists the CPU substitutions; kimi_k3_cpu.py Kimi-K3's): SGLang builds a
checkpoint's model with its own construction and runs the model's own `load_weights` (no post-processing), and reports
what the refusals are about: the method each routed-experts layer got, and how many bytes of each of its parameters
the load wrote (parameters are zero-filled first, as in the differential proof)."""

from __future__ import annotations

import harness_differential


def _experts_after_load(*, source: str, converted: str | None = None, dtype: str, fmt: str,
                        text_only: bool = False) -> dict:
    import torch
    from common import checkpoint_tensors
    from differential_state import zero_fill
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.loader import _get_quantization_config, _initialize_model
    from sglang.srt.model_loader.utils import set_default_torch_dtype

    harness_differential.use_capability_of(fmt)
    path = converted or source
    model_config = ModelConfig(path, dtype=dtype)
    quant = _get_quantization_config(model_config, LoadConfig())
    with set_default_torch_dtype(model_config.dtype):
        model = _initialize_model(model_config, LoadConfig(), quant)
        zero_fill(model)
        out = {"config": type(quant).__name__, "methods": {}, "nonzero": {}}
        for name, module in model.named_modules():
            if name.endswith(".experts"):
                out["methods"][name] = type(module.quant_method).__name__
        if converted is None:  # the source: SGLang's own load of it
            model.load_weights(checkpoint_tensors(path))
            out["nonzero"] = {n: int((p.data.reshape(-1).view(torch.uint8) != 0).sum()) if p.dim() else None
                              for n, p in model.named_parameters() if ".experts." in n}
    return out


def run(rank: int, world: int, *, cases: dict) -> dict:
    """cases: id -> {"source", "converted" (None: load the source), "dtype", "fmt"}."""
    harness_differential._diff = _experts_after_load  # the same set-up (harness_differential.run)
    return harness_differential.run(rank, world, cases=cases)
