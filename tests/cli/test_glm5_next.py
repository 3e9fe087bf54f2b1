"""GLM-5.3-Flash (glm5-next text, glm5-next-vl multimodal) through the real CLI: `nvfp4-to-marlin` converts the
replica for the engines that serve it and refuses the one that does not with that engine's reason, `validate
--against` the source passes, and `plan` sizes the expert tiles from the experts' own width (moe_intermediate_size
per rank) and applies the KDA heads' TP rule.

Substitutions: the checkpoints are `dsv4-convert synth --family glm5-next[-vl]` replicas (synth/glm5next.py names
the public facts: KDA + MLA with the kpool indexer + mHC, a BF16 MTP layer), not the released weights.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.helpers.cli import CLI, run_cli

pytestmark = pytest.mark.slow

_SIZES = {"layers": 2, "experts": 8, "hidden": 256, "intermediate": 128, "shards": 2}


@pytest.fixture(scope="module")
def conversions(synth_source, tmp_path_factory):
    """(family, format, target) -> (source, conversion) of the replicas the engines serve, converted once."""
    root = tmp_path_factory.mktemp("glm5next")
    out = {}
    for family, fmt, target in (("glm5-next", "nvfp4-ct", "vllm"), ("glm5-next-vl", "nvfp4-modelopt-hf", "vllm"),
                                ("glm5-next-vl", "nvfp4-modelopt-hf", "sglang")):
        src = synth_source(fmt, family=family, **_SIZES)
        dst = root / f"{family}-{fmt}-{target}"
        report = json.loads(run_cli("nvfp4-to-marlin", src, dst, "--target", target, "--json", "-q").stdout)
        out[family, fmt, target] = (src, dst, report)
    return out


def test_convert_copies_the_mtp_layer_and_validates_against_the_source(conversions):
    for (family, fmt, target), (src, dst, report) in conversions.items():
        # the MTP layer (layer num_hidden_layers = 2) is copied, BF16, not converted
        assert report["mtp_copied"] and all(name.endswith(".2") for name in report["mtp_copied"]), report["mtp_copied"]
        proc = run_cli("validate", dst, "--against", src, "--json", check=False)
        data = json.loads(proc.stdout)
        assert proc.returncode == 0, [f for f in data["findings"] if f["severity"] == "error"]
        assert data["checks"] and not any(f["severity"] == "error" for f in data["findings"])


def test_sglang_conversion_of_the_text_class_is_refused_with_sglangs_reason(synth_source, tmp_path):
    """SGLang 0.5.23 has no Glm5NextForCausalLM (core/targets/served.py REFUSED): the gate says so and writes nothing."""
    env = {k: v for k, v in os.environ.items() if k != "DSV4_CONVERT_ALLOW_UNSERVABLE"}  # tests/conftest.py lifts it
    src = synth_source("nvfp4-ct", family="glm5-next", **_SIZES)
    proc = subprocess.run([*CLI, "nvfp4-to-marlin", str(src), str(tmp_path / "out"), "--target", "sglang", "--json"],
                          capture_output=True, text=True, env=env)
    err = json.loads(proc.stdout)["error"]
    assert proc.returncode == 4 and err["id"] == "convert.unservable_family", proc.stdout
    assert "itself cannot serve a glm5-next" in err["message"] and "no Glm5NextForCausalLM" in err["message"], err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("target", ["vllm", "sglang"])
def test_plan_tiles_come_from_the_experts_width_and_kda_heads_limit_tp(conversions, target):
    src, dst, _ = conversions["glm5-next-vl", "nvfp4-modelopt-hf", target]
    text = json.loads((src / "config.json").read_text())["text_config"]
    proc = run_cli("plan", dst, "--gpus", 4, "--target", target, "--json", check=False)
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
