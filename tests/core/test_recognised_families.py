"""Every family dsv4-convert recognises is served by a proof or refused with an engine's own reason (issue 35: the
families recognised last round without a proof are all served now), and an architecture in no family is refused as
unknown.

No substitutions: the family table and the served table are the code under test; the configs are the two keys
(`architectures`, `model_type`) those tables read."""

from __future__ import annotations

from dsv4_convert.core.sources.families import FAMILIES, family_of
from dsv4_convert.core.targets.served import REFUSED, entries, refusal


def test_every_family_is_served_or_refused_with_an_engines_reason():
    bare = [f.name for f in FAMILIES if not entries(f.name) and not any(r.family == f.name for r in REFUSED)]
    assert not bare, f"families with neither a served row nor an engine's refusal (core/targets/served.py): {bare}"


def test_an_architecture_in_no_family_is_refused_as_unknown():
    """A made-up architecture: no family, and the gate says so."""
    config = {"architectures": ["MadeUpMoeForCausalLM"], "model_type": "made_up"}
    assert family_of(config) is None
    assert "is in no model family" in refusal(config, "nvfp4-modelopt-hf", "vllm", None)
