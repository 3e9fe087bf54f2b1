"""Qwen3.8-Flash-Next (Qwen4-Exp), end to end through the real CLI command lines: the `synth --family qwen4-exp`
replica (nvidia's MIXED_PRECISION layout: FP8 attention and n-gram tables, NVFP4 experts; synth/qwen4_exp.py) converts
for both targets with no --allow-unservable (served: core/targets/served.py), validates against its source with no
finding, plans with tiles from the experts' own width, keeps its PLE n-gram tables byte for byte (they are no
experts) and names their storage for the engines (`ple_embedding_dtype`, core/sources/side_tables.py), and reverses
byte for byte; NVFP4 n-gram tables convert for vLLM and are refused for SGLang with SGLang's own reason.

Substitution: the replica is synth's, the commands are the CLI's; they run in three CLI processes, in order
(run_cli_batch: `main(argv)` each, as the console script runs it, its exit code, stdout and stderr), not one
process each: a process start costs more than these commands. The conversions run with the served gate on
(GATE_ON), the synth, inspect, validate, plan and reverse runs before and after them without it.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from tests.helpers.cli import restored_tree, run_cli_steps, succeeded, tree_hashes

pytestmark = pytest.mark.slow
GATE_ON = {"DSV4_CONVERT_ALLOW_UNSERVABLE": "0"}  # tests/conftest.py lifts the served gate for the converter's tests


def _ple_bytes(root) -> dict[str, bytes]:
    """Every PLE tensor of a checkpoint (table shards, table scales, projections, norms) as raw bytes."""
    out = {}
    for shard in sorted(root.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            for name in f.keys():
                if ".ple." in name:
                    t = f.get_tensor(name)
                    out[name] = t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    return out


def _text_config(root) -> dict:
    config = json.loads((root / "config.json").read_text())
    return config.get("text_config", config)


TARGETS = ("sglang", "vllm")



@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """(test, step) -> the CLI's answer, and "dir": the replicas made and inspected, converted (gate on), then
    validated, planned and reversed; three CLI processes."""
    d = tmp_path_factory.mktemp("qwen4")
    src, ple = d / "src", d / "ple-src"
    runs = run_cli_steps({("replica", "synth"): ["synth", src, "--family", "qwen4-exp", "-q"],
                   ("replica", "inspect"): ["inspect", src, "--json"],
                   ("ple", "synth"): ["synth", ple, "--family", "qwen4-exp-ple-nvfp4", "-q"]}, d)
    runs.update(run_cli_steps({**{("replica", t, "convert"): ["nvfp4-to-marlin", src, d / f"out-{t}", "--target", t, "-q"]
                           for t in TARGETS},
                        ("ple", "vllm"): ["nvfp4-to-marlin", ple, d / "ple-out-vllm", "--target", "vllm", "-q"],
                        ("ple", "sglang"): ["nvfp4-to-marlin", ple, d / "ple-out-sglang", "--target", "sglang", "--json"]},
                       d, env=GATE_ON))
    runs.update(run_cli_steps({step: argv for t in TARGETS for step, argv in {
        ("replica", t, "validate"): ["validate", d / f"out-{t}", "--against", src, "--json"],
        ("replica", t, "plan"): ["plan", d / f"out-{t}", "--gpus", "2", "--gpu-mem-gib", "32", "--target", t, "--json"],
        ("replica", t, "reverse"): ["marlin-to-source", d / f"out-{t}", d / f"back-{t}", "-q"]}.items()}, d))
    return {**runs, "dir": d}



def test_the_qwen4_exp_replica_through_every_command(runs):
    d = runs["dir"]
    src = d / "src"
    succeeded(runs["replica", "synth"])
    doc = json.loads(succeeded(runs["replica", "inspect"]).stdout)
    assert doc["format"] == "nvfp4-modelopt-hf" and doc["family"] == "qwen4-exp", doc
    assert set(doc["served"]) == {"sglang 0.5.23", "vllm 0.33", "vllm 0.34"} and not any(doc["served"].values()), doc
    assert doc["projections"]["by_role"] == {"down": 16, "gate": 16, "up": 16}, doc["projections"]
    ple = _ple_bytes(src)
    assert any(".ngram_embedding.shard_" in n for n in ple), sorted(ple)
    assert _text_config(src).get("ple_embedding_dtype") is None  # the source leaves it to its quantisation config
    for target in TARGETS:
        out = d / f"out-{target}"
        succeeded(runs["replica", target, "convert"])
        proc = runs["replica", target, "validate"]
        findings = [f for f in json.loads(proc.stdout)["findings"] if f["severity"] in ("error", "warning")]
        assert proc.returncode == 0 and findings == [], proc.stdout[-3000:]
        assert _ple_bytes(out) == ple  # the n-gram tables pass through, as every other non-expert tensor
        assert _text_config(out)["ple_embedding_dtype"] == "float8_e4m3fn"  # what the engines build for FP8 rows
        plan = json.loads(succeeded(runs["replica", target, "plan"]).stdout)
        assert plan["exit_code"] == 0 and plan["recommended"]["tp"] in (1, 2), plan
        assert "H=256, I=128" in plan["reasoning"][0], plan["reasoning"]  # moe_intermediate_size, not intermediate
        succeeded(runs["replica", target, "reverse"])
        assert restored_tree(d / f"back-{target}") == tree_hashes(src)  # config.json too: without ple_embedding_dtype again


def test_nvfp4_ple_tables_convert_for_vllm_and_are_refused_for_sglang(runs):
    d = runs["dir"]
    src, out = d / "ple-src", d / "ple-out-vllm"
    succeeded(runs["ple", "synth"])
    succeeded(runs["ple", "vllm"])
    assert _text_config(out)["ple_embedding_dtype"] == "nvfp4"
    assert _ple_bytes(out) == _ple_bytes(src)
    proc = runs["ple", "sglang"]
    err = json.loads(proc.stdout)["error"]
    assert proc.returncode == 4 and err["id"] == "convert.unservable_family", proc.stdout
    assert "sglang cannot build this source itself" in err["message"] and "_ple_table_is_fp8" in err["message"], err
    assert not (d / "ple-out-sglang").exists()
