"""GLM-5.3-Flash (glm5-next text, glm5-next-vl multimodal) through the real CLI: `nvfp4-to-marlin` converts the
replica for the engines that serve it and refuses the one that does not with that engine's reason, `validate
--against` the source passes, and `plan` sizes the expert tiles from the experts' own width (moe_intermediate_size
per rank) and applies the KDA heads' TP rule.

Substitutions: the checkpoints are `dsv4-convert synth --family glm5-next[-vl]` replicas (synth/glm5next.py names
the public facts: KDA + MLA with the kpool indexer + mHC, a BF16 MTP layer), not the released weights. The command
lines run in two CLI processes, in order (run_cli_batch: `main(argv)` each, as the console script runs it, its exit
code, stdout and stderr): the conversions, validations and plans, then the gate's refusal with
DSV4_CONVERT_ALLOW_UNSERVABLE removed (tests/conftest.py lifts it); not one process each: a process start costs
more than these commands.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers.cli import run_cli_batch

pytestmark = pytest.mark.slow

_SIZES = {"layers": 2, "experts": 8, "hidden": 256, "intermediate": 128, "shards": 2}


CASES = [("glm5-next", "nvfp4-ct", "vllm"), ("glm5-next-vl", "nvfp4-modelopt-hf", "vllm"),
         ("glm5-next-vl", "nvfp4-modelopt-hf", "sglang")]
TARGETS = ["vllm", "sglang"]


@pytest.fixture(scope="module")
def conversions(synth_source, tmp_path_factory):
    """(family, format, target) -> (source, conversion, its --json report) of the replicas the engines serve;
    (case, "validate"), ("plan", target), "refused" -> the CLI's answers; "dir" -> the folder."""
    root = tmp_path_factory.mktemp("glm5next")
    paths = {case: (synth_source(case[1], family=case[0], **_SIZES), root / "-".join(case)) for case in CASES}
    steps = {**{(case, "convert"): ["nvfp4-to-marlin", src, dst, "--target", case[2], "--json", "-q"]
                for case, (src, dst) in paths.items()},
             **{(case, "validate"): ["validate", dst, "--against", src, "--json"] for case, (src, dst) in paths.items()},
             **{("plan", t): ["plan", paths["glm5-next-vl", "nvfp4-modelopt-hf", t][1], "--gpus", 4, "--target", t,
                              "--json"] for t in TARGETS}}
    runs = dict(zip(steps, run_cli_batch(list(steps.values()), root)))
    (runs["refused"],) = run_cli_batch([["nvfp4-to-marlin", synth_source("nvfp4-ct", family="glm5-next", **_SIZES),
                                         root / "refused-out", "--target", "sglang", "--json"]], root,
                                       env={"DSV4_CONVERT_ALLOW_UNSERVABLE": None})  # tests/conftest.py lifts it
    for case in CASES:
        assert runs[case, "convert"].returncode == 0, runs[case, "convert"].stderr
        runs[case] = (*paths[case], json.loads(runs[case, "convert"].stdout))
    return {**runs, "dir": root}


def test_convert_copies_the_mtp_layer_and_validates_against_the_source(conversions):
    for case in CASES:
        _, _, report = conversions[case]
        # the MTP layer (layer num_hidden_layers = 2) is copied, BF16, not converted
        assert report["mtp_copied"] and all(name.endswith(".2") for name in report["mtp_copied"]), report["mtp_copied"]
        proc = conversions[case, "validate"]
        data = json.loads(proc.stdout)
        assert proc.returncode == 0, [f for f in data["findings"] if f["severity"] == "error"]
        assert data["checks"] and not any(f["severity"] == "error" for f in data["findings"])


def test_sglang_conversion_of_the_text_class_is_refused_with_sglangs_reason(conversions):
    """SGLang 0.5.23 has no Glm5NextForCausalLM (core/targets/served.py REFUSED): the gate says so and writes nothing."""
    proc = conversions["refused"]
    err = json.loads(proc.stdout)["error"]
    assert proc.returncode == 4 and err["id"] == "convert.unservable_family", proc.stdout
    assert "itself cannot serve a glm5-next" in err["message"] and "no Glm5NextForCausalLM" in err["message"], err
    assert not (conversions["dir"] / "refused-out").exists()


@pytest.mark.parametrize("target", TARGETS)
def test_plan_tiles_come_from_the_experts_width_and_kda_heads_limit_tp(conversions, target):
    src, dst, _ = conversions["glm5-next-vl", "nvfp4-modelopt-hf", target]
    text = json.loads((src / "config.json").read_text())["text_config"]
    proc = conversions["plan", target]
    plan = json.loads(proc.stdout)
    assert proc.returncode == 0 and plan["command"], plan
    model = plan["model"]
    assert (model["hidden"], model["intermediate"]) == (text["hidden_size"], text["moe_intermediate_size"])
    assert model["layers"] == 1 and model["draft_bytes"] > 0  # one MoE layer in the trunk, the MTP layer apart
    assert model["split_dims"][target]["KDA heads"] == text["linear_num_heads"] == 2
    by_tp = {(c["tp"], c["ep"]): c for c in plan["candidates"]}
    # I per rank = moe_intermediate_size / (TP / EP): 128 at TP 1, 64 at TP 2 (both tile-valid)
    assert by_tp[1, 1]["i_shard"] == 128 and by_tp[2, 1]["i_shard"] == 64 and by_tp[2, 1]["valid"]
    # TP 4: the replica's 2 KDA heads (and 2 attention heads) cannot be split four ways
    assert any("2 KDA heads" in r for r in by_tp[4, 4]["reasons"]) and not by_tp[4, 4]["valid"], by_tp[4, 4]
