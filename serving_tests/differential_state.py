"""What the differential proof compares, engine-free: a built model's whole state (every parameter and
buffer, by name), and the difference between the engine's and the plugin's (serving_tests/test_differential.py)."""

from __future__ import annotations

import torch
from common import byte_diff

__all__ = ["draft_diff", "model_state", "run_diff_cases", "scratch_bytes", "state_diff", "zero_fill"]

# Buffers the engine allocates with torch.empty and fills only in a forward pass (scratch: never loaded, not persistent):
# compared by name, dtype and shape, not by their arbitrary bytes
SCRATCH = {
    # vLLM 0.33.0's QSA attention (vllm/models/qwen4_exp/nvidia/qsa.py): the indexer's packed top-k selection per
    # token, `register_buffer("topk_indices_buffer", torch.empty(...), persistent=False)`; 0.34 keeps it off the state
    "vllm": ("topk_indices_buffer",),
}


def scratch_bytes(engine: str, name: str, what: str) -> bool:
    """Whether a difference `what` (common.byte_diff) of `name` is only the bytes of one of `engine`'s scratch buffers."""
    return name.rsplit(".", 1)[-1] in SCRATCH.get(engine, ()) and "bytes differ" in what


def model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer by its full name (vLLM and SGLang hold no other tensor a kernel reads
    that a checkpoint fills; workspaces are allocated, not loaded)."""
    state = {name: p.data for name, p in model.named_parameters(remove_duplicate=False)}
    state.update({name: b for name, b in model.named_buffers(remove_duplicate=False) if b is not None})
    return state


def zero_fill(model: torch.nn.Module) -> None:
    """Before loading: every parameter zeroed, in both models. The engines create parameters with
    torch.empty, so a region no checkpoint tensor fills (a tensor the synthetic source lacks, padding)
    would otherwise hold whatever memory it got and differ from run to run."""
    with torch.no_grad():
        for p in model.parameters():
            data = p.data
            data.reshape(-1).view(torch.uint8).zero_() if data.is_contiguous() else data.zero_()


def state_diff(engine: dict[str, torch.Tensor], plugin: dict[str, torch.Tensor]) -> dict:
    """{"only_engine", "only_plugin": names one model has and the other lacks, "differ": {name: what
    differs (dtype, shape or the first differing byte)}, "compared": how many names both hold}."""
    both = sorted(set(engine) & set(plugin))
    differ = {n: d for n in both if (d := byte_diff(plugin[n], engine[n])) is not None}
    return {"only_engine": sorted(set(engine) - set(plugin)), "only_plugin": sorted(set(plugin) - set(engine)),
            "differ": differ, "compared": len(both), "compared_names": both}


def draft_diff(engine_model: torch.nn.Module, plugin_model: torch.nn.Module) -> dict:
    """state_diff of two draft models (serving_tests/test_draft_differential.py), with what the draft test also
    reports of the engine's: the draft class the engine built and the quantisation methods it gave."""
    out = state_diff(model_state(engine_model), model_state(plugin_model))
    out["draft_class"] = type(engine_model).__name__
    out["methods"] = sorted({type(m.quant_method).__name__ for m in engine_model.modules()
                             if getattr(m, "quant_method", None) is not None})
    return out


def run_diff_cases(cases: dict, diff) -> dict:
    """{case id: diff(**case)}, or {"error": "<Type>: <message>"} where building or loading raised."""
    out = {}
    for case_id, case in cases.items():
        try:
            out[case_id] = diff(**case)
        except Exception as e:  # noqa: BLE001 - reported to the test, which fails the case on it
            import traceback

            out[case_id] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
    return out
