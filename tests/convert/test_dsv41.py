"""DeepSeek-V4.1-Flash end to end, as a user runs it, on its `synth --family deepseek-v41` replica (real V4.1 names,
dtypes and config layout at small sizes, synth/dsv41.py): recognised as the deepseek-v41 family in mxfp4-dsv4 with
its three DSpark draft stages, each held to its own expert count (`dspark_n_routed_experts`, fewer than the trunk's);
converted for both targets, the Engram tables, the vision tower and the DSpark-only tensors copied byte for byte;
the converted block keeps `expert_dtype` where vLLM's V4.1 config reads it; validated --against the source; and
`marlin-to-source` gives the source back byte for byte.

Substitutions: the checkpoint is the replica (synthetic values), not the released weights. The converter's gate is
lifted through DSV4_CONVERT_ALLOW_UNSERVABLE (tests/conftest.py) where the served table has no V4.1 row for a
target; validate then reports only `marlin.serving_methods`. The CLI command lines run in one CLI process, in order
(run_cli_batch: `main(argv)` each, as the console script runs it, its exit code, stdout and stderr), not one process
each: a process start costs more than these commands.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors import safe_open

from dsv4_convert.core.checkpoint.reader import open_checkpoint
from dsv4_convert.core.sources.source_formats import source_format
from dsv4_convert.core.sources.structure import RULES, experts_beyond_config, experts_incomplete, layer_experts
from dsv4_convert.core.targets.engines import ENGINES
from dsv4_convert.core.targets.served import entries
from tests.helpers.cli import restored_tree, run_cli_batch, tree_hashes

_SIZES = {"layers": 2, "experts": 8, "hidden": 256, "intermediate": 128, "shards": 2}
# what a conversion must copy as it is: Engram (FP8 tables, their E8M0 row scales), the vision tower and the
# DSpark-only draft tensors
_COPIED = (".engram.", "vision.", "aligner.", "image_", ".main_proj.", ".main_norm.", ".markov_head.",
           ".confidence_head.", ".bias_vl")


@pytest.fixture(scope="module")
def source(synth_source):
    return synth_source("mxfp4-dsv4", family="deepseek-v41", **_SIZES)


def test_recognised_with_three_draft_stages_of_their_own_size(source):
    ckpt = open_checkpoint(source)
    assert ckpt.format == source_format("mxfp4-dsv4")
    text = ckpt.config["text_config"]
    per_layer: dict[str, set[int]] = {}
    for p in ckpt.projections:
        per_layer.setdefault(p.layer, set()).add(p.expert)
    assert {k: len(v) for k, v in per_layer.items()} == {
        "0": text["n_routed_experts"], "1": text["n_routed_experts"],
        **{f"mtp.{s}": text["dspark_n_routed_experts"] for s in range(3)}}
    assert text["dspark_n_routed_experts"] < text["n_routed_experts"]
    assert not [v for rule in RULES for v in rule(ckpt)], "the replica breaks a structure rule"


def test_draft_layers_take_the_draft_expert_count(source):
    """layer_experts reads the count the engine allocates per layer; a draft stage that lacks one of its own experts
    is still reported, naming the field, and one with the trunk's count is beyond it."""
    config = open_checkpoint(source).config
    text = config["text_config"]
    assert layer_experts(config, "mtp.1") == (text["dspark_n_routed_experts"], "dspark_n_routed_experts")
    assert layer_experts(config, str(text["num_hidden_layers"])) == (text["dspark_n_routed_experts"],
                                                                     "dspark_n_routed_experts")
    assert layer_experts(config, "1") == (text["n_routed_experts"], "n_routed_experts")
    no_draft_field = {**config, "text_config": {k: v for k, v in text.items() if k != "dspark_n_routed_experts"}}
    assert layer_experts(no_draft_field, "mtp.0") == (text["n_routed_experts"], "n_routed_experts")

    ckpt = open_checkpoint(source)
    lacking = dataclasses.replace(ckpt, projections=[p for p in ckpt.projections
                                                     if not (p.layer == "mtp.2" and p.expert == 1)])
    found = list(experts_incomplete(lacking))
    assert [v.tensor for v in found] == ["mtp.2.ffn.experts"] and "dspark_n_routed_experts=" in found[0].message
    fewer = {**config, "text_config": {**text, "dspark_n_routed_experts": text["dspark_n_routed_experts"] - 1}}
    beyond = list(experts_beyond_config(dataclasses.replace(ckpt, config=fewer)))
    assert sorted(v.layer for v in beyond) == ["mtp.0", "mtp.1", "mtp.2"], beyond


def _tensors(root) -> dict[str, bytes]:
    index = json.loads((root / "model.safetensors.index.json").read_text())["weight_map"]
    out = {}
    for file in sorted(set(index.values())):
        with safe_open(root / file, "pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                out[name] = (str(t.dtype), tuple(t.shape), t.contiguous().view(-1).view(torch.uint8)
                             .numpy().tobytes())
    return out


TARGETS = ["sglang", "vllm"]


@pytest.fixture(scope="module")
def runs(source, tmp_path_factory) -> dict:
    """(target, step) -> the CLI's answer, and "dir": each target's conversion, validate and reverse, in one CLI
    process."""
    d = tmp_path_factory.mktemp("dsv41")
    steps = {}
    for t in TARGETS:
        out = d / t / "marlin"
        steps.update({(t, "convert"): ["mxfp4-to-marlin", source, out, "--target", t, "-q"],
                      (t, "validate"): ["validate", out, "--against", source, "--json"],
                      (t, "reverse"): ["marlin-to-source", out, d / t / "restored", "-q"]})
    return {**dict(zip(steps, run_cli_batch(list(steps.values()), d))), "dir": d}


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
def test_converts_copies_engram_vision_and_draft_parts_validates_and_reverses(source, runs, target):
    out = runs["dir"] / target / "marlin"
    assert runs[target, "convert"].returncode == 0, runs[target, "convert"].stderr
    src_t, out_t = _tensors(source), _tensors(out)
    copied = [n for n in src_t if any(k in n for k in _COPIED)]
    assert any(".engram.embed.scale" in n for n in copied) and any(n.startswith("vision.") for n in copied)
    assert {n: out_t.get(n) for n in copied} == {n: src_t[n] for n in copied}
    assert src_t["layers.1.engram.embed.weight"][0] == "torch.float8_e4m3fn"

    # SERVING.md says where the engine keeps the Engram tables and how to launch with the other placement
    facts = ENGINES[target].engram
    other = (facts.on_gpu if facts.default_on_host else facts.on_host).format(cmd="").strip()
    notes = (out / "SERVING.md").read_text()
    assert "## The Engram tables" in notes and other in notes

    block = json.loads((out / "config.json").read_text())["quantization_config"]
    assert block["expert_dtype"] == "fp4" and block["model_type"] == "deepseek_v41"
    assert {c for c in block["experts"] if c.startswith("mtp.")} == {f"mtp.{s}.ffn.experts" for s in range(3)}

    served = bool(entries("deepseek-v41", "mxfp4-dsv4", target))
    proc = runs[target, "validate"]
    report = json.loads(proc.stdout)
    errors = {f["check"] for f in report["findings"] if f["severity"] == "error"}
    assert (proc.returncode, errors) == ((0, set()) if served else (1, {"marlin.serving_methods"})), proc.stdout[-3000:]

    assert runs[target, "reverse"].returncode == 0, runs[target, "reverse"].stderr
    assert restored_tree(runs["dir"] / target / "restored") == tree_hashes(source)
