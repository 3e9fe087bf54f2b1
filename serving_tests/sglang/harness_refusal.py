"""Runs inside a spawned gloo rank for serving_tests/test_engine_refusals.py: SGLang builds and loads a SOURCE
checkpoint alone, with exactly the engine set-up and model loader of harness_differential.py (its header lists
the CPU substitutions), and reports whether its own loader took it. No plugin and no conversion are involved:
a refusal row of core/targets/served.py says the engine cannot load the source itself."""

from __future__ import annotations

import harness_differential


def _load_source(*, source: str, converted: str | None = None, dtype: str, fmt: str, text_only: bool = False) -> dict:
    harness_differential.use_capability_of(fmt)
    model = harness_differential._model(source, dtype)
    return {"loaded": True, "parameters": sum(1 for _ in model.parameters())}


def run(rank: int, world: int, *, cases: dict) -> dict:
    """cases: id -> {"source", "dtype", "fmt"}; a case whose build or load raises reports {"error", "traceback"}."""
    harness_differential._diff = _load_source  # the same set-up (harness_differential.run), the source alone
    return harness_differential.run(rank, world, cases=cases)
