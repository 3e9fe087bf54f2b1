"""Per-layer expert pruning: a layer whose experts a pruning replaced holds fewer expert weights than the others, and
the config lists which (core/sources/structure.py substituted_experts, the form vLLM 0.33 / 0.34 reads:
`approximate_experts`, or `compression_config.transform_config.expert_substitution`). The structure rules read the
per-layer count from it instead of calling the pruned experts missing; the serving verdict says that no engine
release serves FP4 experts pruned this way (core/targets/engine_config.py; serving_tests/test_engine_refusals.py
proves both engines' behaviour on such a replica).

Substitutions: the checkpoint is a `synth` Qwen3-MoE compressed-tensors NVFP4 replica whose layer 0 loses its last
expert in the model (dataclasses.replace of the projections) and in the config, as the producer writes it; no
public producer output of this form exists to use instead (the brief's search found none for compressed-tensors).
"""

from __future__ import annotations

import dataclasses

import pytest

from dsv4_convert.core.checkpoint.reader import open_checkpoint
from dsv4_convert.core.sources.structure import experts_incomplete, substituted_experts
from dsv4_convert.core.targets.engine_config import fix_hint, source_load_refusal
from dsv4_convert.core.targets.served import refusal
from tests.helpers.checks import synth

LAST = 3  # synth's 4 experts per layer


def _expert_substitution(layer: int, ids: list[int]) -> dict:
    """vLLM's version-1 `expert_substitution` block for one decoder layer (fused_moe/expert_substitution.py)."""
    return {"transform_config": {"expert_substitution": {
        "version": 1, "router_semantics": {"preserve_logical_expert_ids": True, "preserve_router_weights": True,
                                           "renormalize_after_substitution": False},
        "targets": {f"model.layers.{layer}.mlp.experts": {
            "weight_layout": "compact_retained_experts",
            "replacements": {str(i): {"format": "constant-v1", "tensors": {"value": f"novice.{layer}.{i}"}}
                             for i in ids}}}}}}


@pytest.fixture(scope="module")
def pruned(tmp_path_factory):
    """(checkpoint with layer 0's last expert gone, its config as written without any pruning field)."""
    src, _ = synth(tmp_path_factory.mktemp("pruned"), format="nvfp4-ct", family="qwen3-moe", layers=2)
    ckpt = open_checkpoint(src)
    gone = dataclasses.replace(ckpt, projections=[p for p in ckpt.projections
                                                  if not (p.layer == "0" and p.expert == LAST)])
    return gone, ckpt.config


@pytest.mark.parametrize("field", ["approximate_experts", "expert_substitution", "text_config"])
def test_a_layer_pruned_in_the_config_is_not_missing_experts(pruned, field):
    ckpt, config = pruned
    listed = {"approximate_experts": {**config, "approximate_experts": {"0": [LAST]}},
              "expert_substitution": {**config, "compression_config": _expert_substitution(0, [LAST])},
              "text_config": {**config, "text_config": {"approximate_experts": {"0": [LAST]}}}}[field]
    assert substituted_experts(listed, "0")[0] == {LAST} and substituted_experts(listed, "1")[0] == frozenset()
    assert list(experts_incomplete(dataclasses.replace(ckpt, config=listed))) == []
    # the serving verdict: neither engine serves it, each with its own reason, and the fix says what to serve instead
    why = {e: source_load_refusal(listed, e) for e in ("vllm 0.34", "vllm 0.33", "sglang 0.5.23")}
    assert all(w and "prunes experts per layer (1 layer(s), first 0)" in w for w in why.values()), why
    assert "quantized MoE weights" in why["vllm 0.34"] and "reads neither field" in why["sglang 0.5.23"]
    assert "pruned per layer" in fix_hint(listed)
    assert "cannot build this source itself" in refusal(listed, "nvfp4-ct", "vllm", listed["quantization_config"])


def test_walk_an_expert_missing_without_the_config_saying_so_is_still_missing(pruned):
    """Made-up cases the rule must still catch: no pruning field; the field names another layer; it names another
    expert of the same layer."""
    ckpt, config = pruned
    for wrong in (config, {**config, "approximate_experts": {"1": [LAST]}},
                  {**config, "approximate_experts": {"0": [0]}},
                  {**config, "compression_config": _expert_substitution(1, [LAST])}):
        (v,) = list(experts_incomplete(dataclasses.replace(ckpt, config=wrong)))
        assert v.tensor == "model.layers.0.mlp.experts" and f"missing experts {LAST}" in v.message, v
    assert source_load_refusal(config, "vllm") is None  # no pruning field: nothing to refuse for it
