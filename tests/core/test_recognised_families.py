"""The families of issue 35 that dsv4-convert recognises but does not serve yet (core/sources/families.py FAMILIES without
rows in core/targets/served.py): each architecture names its family, its releases' expert names (quoted from the engines'
weight mappings beside each FAMILIES entry) parse to that family's scheme with the right layer, expert and role,
and the gate refuses it because no serving test loads it, not because the architecture is unknown.

No substitutions: the naming table and the served table are the code under test; the configs are the two keys
(`architectures`, `model_type`) those tables read."""

from __future__ import annotations

import pytest

from dsv4_convert.core.sources.families import family_of
from dsv4_convert.core.sources.naming import parse_expert_name
from dsv4_convert.core.targets.served import entries, refusal

# (architecture, model_type, an expert tensor name of its releases, family, layer, expert, role)
RECOGNISED = [
    # GLM-5.3-Flash (glm5-next, glm5-next-vl), Qwen3.8-Flash-Next (qwen4-exp, qwen4-exp-text) and MiniMax-M3 / M3.1
    # (minimax-m3, minimax-m3-vl) are served now: tests/convert/test_families.py, serving_tests/differential.py
]


@pytest.mark.parametrize(("arch", "model_type", "name", "family", "layer", "expert", "role"), RECOGNISED,
                         ids=[r[0] for r in RECOGNISED])
def test_recognised_family_reads_its_names_and_is_refused_for_want_of_a_proof(arch, model_type, name, family, layer,
                                                                              expert, role):
    config = {"architectures": [arch], "model_type": model_type}
    fam = family_of(config)
    assert fam is not None and fam.name == family
    parsed = parse_expert_name(name)
    assert parsed is not None and parsed.scheme is fam.source_scheme, name
    assert (parsed.layer, parsed.expert, parsed.role) == (layer, expert, role)
    assert not entries(family)  # nothing proven: the gate refuses it
    for engine in ("sglang", "vllm"):
        why = refusal(config, "nvfp4-modelopt-hf", engine, {"quant_method": "modelopt", "quant_algo": "NVFP4"})
        assert why is not None and f"no serving test loads a {family} checkpoint" in why, why


def test_an_architecture_in_no_family_is_refused_as_unknown():
    """The walk above fails on a made-up architecture: no family, and the gate says so."""
    config = {"architectures": ["MadeUpMoeForCausalLM"], "model_type": "made_up"}
    assert family_of(config) is None
    assert "is in no model family" in refusal(config, "nvfp4-modelopt-hf", "vllm", None)
