"""Nemotron-H / Nemotron-3-Nano NVFP4 names, end to end through the real CLI command lines: non-gated experts
`backbone.layers.L.mixer.experts.E.{up_proj,down_proj}` with an NVFP4 hf_quant_config.json are recognised
(were `detect.unknown_format`), convert for both targets, validate against the source, and reverse byte for byte;
and an FP4 expert tensor whose projection name no scheme knows, beside known siblings, is refused naming the tensor
and the part not understood (it was copied unconverted).

Substitution: the checkpoint is a `dsv4_convert.synth` Qwen3-MoE ModelOpt NVFP4 replica renamed to Nemotron-H's
names (gate projections dropped, up_proj / down_proj kept, `model.layers` -> `backbone.layers`, `mlp` ->
`mixer`) with architectures NemotronHForCausalLM: the names and the quantisation files are the release's, the
rest of the model (Mamba layers) is not reproduced. Nemotron-H x ModelOpt NVFP4 is served (core/targets/served.py, the
differential proof of the whole-model replica `synth --family nemotron-h`), so both convert with no
--allow-unservable and validate clean; the whole replica also goes through inspect, plan, validate and
marlin-to-source for both targets. The command lines run in one CLI process, in order (run_cli_batch: `main(argv)`
each, as the console script runs it, its exit code, stdout and stderr), not one process each: a process start costs
more than these commands.
"""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors import safe_open
from safetensors.torch import save_file

from dsv4_convert.synth import write_synthetic_checkpoint
from tests.helpers.cli import restored_tree, run_cli_batch, succeeded, tree_hashes

pytestmark = pytest.mark.slow


def _nemotron(tmp, rename=lambda n: n):
    q3 = write_synthetic_checkpoint(tmp / "q3", format="nvfp4-modelopt-hf", family="qwen3-moe", layers=2, experts=4,
                                    hidden=128, intermediate=128, shards=1)
    root = tmp / "nemotron"
    root.mkdir()
    tensors = {}
    with safe_open(str(q3 / "model-00001-of-00001.safetensors"), "pt") as f:
        for n in f.keys():
            if ".experts." in n and ".gate_proj." in n:
                continue  # non-gated
            tensors[rename(n.replace("model.layers.", "backbone.layers.").replace(".mlp.", ".mixer."))] = f.get_tensor(n)
    save_file(tensors, str(root / "model.safetensors"))
    config = json.loads((q3 / "config.json").read_text())
    config.update(architectures=["NemotronHForCausalLM"], model_type="nemotron_h")
    config.pop("quantization_config")  # the release keeps its ModelOpt block in hf_quant_config.json here
    (root / "config.json").write_text(json.dumps(config, indent=2))
    shutil.copy(q3 / "hf_quant_config.json", root / "hf_quant_config.json")
    return root


TARGETS = ("sglang", "vllm")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """(test, step) -> the CLI's answer, every test's command lines in one CLI process, in order; (test, "src"),
    (test, "d") -> its source and its directory."""
    work = tmp_path_factory.mktemp("nemotron")
    d = {t: work / t for t in ("names", "replica", "unknown")}
    for p in d.values():
        p.mkdir()
    src = {"names": _nemotron(d["names"]), "replica": d["replica"] / "src",
           "unknown": _nemotron(d["unknown"], lambda n: n.replace(".up_proj.", ".fc1_latent.") if ".experts." in n else n)}
    steps = {("names", "inspect"): ["inspect", src["names"], "--json"],
             ("replica", "synth"): ["synth", src["replica"], "--family", "nemotron-h", "-q"],
             ("replica", "inspect"): ["inspect", src["replica"], "--json"]}
    for test in ("names", "replica"):
        for t in TARGETS:
            out = d[test] / f"out-{t}"
            steps[test, t, "convert"] = ["nvfp4-to-marlin", src[test], out, "--target", t, "-q"]
            steps[test, t, "validate"] = ["validate", out, "--against", src[test], "--json"]
            if test == "replica":
                steps[test, t, "plan"] = ["plan", out, "--gpus", "1", "--gpu-mem-gib", "32", "--target", t, "--json"]
                steps[test, t, "inspect"] = ["inspect", out, "--json"]
            steps[test, t, "reverse"] = ["marlin-to-source", out, d[test] / f"back-{t}", "-q"]
    steps["unknown", "inspect"] = ["inspect", src["unknown"], "--json"]
    steps["unknown", "convert"] = ["nvfp4-to-marlin", src["unknown"], d["unknown"] / "out", "--json"]
    return {**dict(zip(steps, run_cli_batch(list(steps.values()), work))), **{(t, "src"): p for t, p in src.items()},
            **{(t, "d"): p for t, p in d.items()}}



def test_nemotron_h_non_gated_experts_convert_validate_and_reverse(runs):
    src = runs["names", "src"]
    doc = json.loads(succeeded(runs["names", "inspect"]).stdout)
    assert doc["format"] == "nvfp4-modelopt-hf" and "nemotron-h" in doc["reason"], doc["reason"]
    assert doc["projections"]["by_role"] == {"down": 8, "gate": 8}  # up_proj is the activated (w1) half
    for target in TARGETS:
        succeeded(runs["names", target, "convert"])
        proc = runs["names", target, "validate"]
        errors = {f["check"] for f in json.loads(proc.stdout)["findings"] if f["severity"] == "error"}
        assert proc.returncode == 0 and errors == set(), proc.stdout[-3000:]
        succeeded(runs["names", target, "reverse"])
        assert restored_tree(runs["names", "d"] / f"back-{target}") == tree_hashes(src)


def test_the_nemotron_h_replica_through_every_command(runs):
    """`synth --family nemotron-h` (Mamba-2, attention, non-gated experts): inspect, convert for both targets (the
    gate lets it through: served), validate against the source with no finding, plan (a non-gated expert has two
    projections and w13 N = I), inspect the conversion, and reverse it byte for byte."""
    src = runs["replica", "src"]
    succeeded(runs["replica", "synth"])
    doc = json.loads(succeeded(runs["replica", "inspect"]).stdout)
    assert doc["format"] == "nvfp4-modelopt-hf" and doc["projections"]["by_role"] == {"down": 16, "gate": 16}, doc
    for target in TARGETS:
        succeeded(runs["replica", target, "convert"])
        proc = runs["replica", target, "validate"]
        findings = [f for f in json.loads(proc.stdout)["findings"] if f["severity"] in ("error", "warning")]
        assert proc.returncode == 0 and findings == [], proc.stdout[-3000:]
        plan = json.loads(succeeded(runs["replica", target, "plan"]).stdout)
        assert plan["exit_code"] == 0 and plan["recommended"]["tp"] == 1, plan
        assert "x 2 projections" in plan["reasoning"][0] and "w13 [N=I/TP" in plan["reasoning"][1], plan["reasoning"]
        converted = json.loads(succeeded(runs["replica", target, "inspect"]).stdout)
        assert converted["format"] == "marlin" and converted["projections"]["by_role"] == {"down": 16, "gate": 16}
        succeeded(runs["replica", target, "reverse"])
        assert restored_tree(runs["replica", "d"] / f"back-{target}") == tree_hashes(src)


def test_an_unknown_expert_projection_is_refused_naming_it(runs):
    for step in ("inspect", "convert"):
        proc = runs["unknown", step]
        err = json.loads(proc.stdout)["error"]
        assert proc.returncode == 4 and err["id"] == "detect.unknown_expert_name", proc.stdout
        assert err["tensor"] == "backbone.layers.0.mixer.experts.0.fc1_latent.weight", err
        assert "'0.fc1_latent.weight'" in err["message"] and "known projections" in err["message"], err["message"]
