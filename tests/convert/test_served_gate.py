"""The converter's gate and validate's pre-flight decide the same way, from the one served table
(core/targets/served.py), before anything is written: real CLI runs in subprocesses on real safetensors files.

Substitutions: the checkpoints are `dsv4_convert.synth` Qwen3-MoE ModelOpt NVFP4 replicas with one config
edit each (the ModelOpt MIXED_PRECISION block a Qwen3-30B-A3B export writes: served on SGLang, refused on vLLM;
an architecture string in no family), not released weights. The refusal is tested with
DSV4_CONVERT_ALLOW_UNSERVABLE removed (tests/conftest.py sets it for the converter's other tests).
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from dsv4_convert.synth import write_synthetic_checkpoint
from tests.helpers.cli import run_cli

pytestmark = pytest.mark.slow  # every test starts the CLI

SIZES = {"layers": 2, "experts": 4, "hidden": 128, "intermediate": 128, "shards": 1}
NO_FLAG = {k: v for k, v in os.environ.items() if k != "DSV4_CONVERT_ALLOW_UNSERVABLE"}


def _env_without_flag():
    import subprocess
    import sys

    def run(*args):
        return subprocess.run([sys.executable, "-m", "dsv4_convert.cli", *map(str, args)], capture_output=True,
                              text=True, env=NO_FLAG)
    return run


def _qwen3(root, edit=None):
    write_synthetic_checkpoint(root, format="nvfp4-modelopt-hf", family="qwen3-moe", **SIZES)
    if edit is not None:
        for name in ("config.json", "hf_quant_config.json"):
            path = root / name
            doc = json.loads(path.read_text())
            edit(name, doc)
            path.write_text(json.dumps(doc, indent=2))
    return root


def _mixed(name, doc):
    """ModelOpt MIXED_PRECISION (as a Qwen3-30B-A3B export with more than one format writes it)."""
    index = [f"model.layers.{i}.mlp.experts.{e}.{p}" for i in range(SIZES["layers"]) for e in range(SIZES["experts"])
             for p in ("gate_proj", "up_proj", "down_proj")]
    layers = {k: {"quant_algo": "NVFP4", "group_size": 16} for k in index}
    layers["model.layers.0.self_attn.q_proj"] = {"quant_algo": "FP8"}
    block = doc["quantization"] if name == "hf_quant_config.json" else doc["quantization_config"]
    block.update(quant_algo="MIXED_PRECISION", quantized_layers=layers)
    block.pop("group_size", None)


def _arch(arch):
    def edit(name, doc):
        if name == "config.json":
            doc["architectures"] = [arch]
    return edit


@pytest.mark.parametrize("case", ["mixed-precision", "SomethingNewMoeForCausalLM"])
def test_refused_before_writing_and_validate_gives_the_same_reason(tmp_path, case):
    src = _qwen3(tmp_path / "src", _mixed if case == "mixed-precision" else _arch(case))
    run = _env_without_flag()
    # Qwen3's MIXED_PRECISION export is proven on SGLang (core/targets/served.py), not on vLLM
    for target in ("vllm",) if case == "mixed-precision" else ("sglang", "vllm"):
        out = tmp_path / f"out-{target}"
        proc = run("nvfp4-to-marlin", src, out, "--target", target, "--json")
        err = json.loads(proc.stdout)["error"]
        assert proc.returncode == 4 and err["id"] == "convert.unservable_family", proc.stdout
        assert not out.exists() and not (tmp_path / f"out-{target}.partial").exists()
        why = err["message"].split("once converted: ", 1)[1]
        assert ("'modelopt_mixed'" in why) if case == "mixed-precision" else (case in why), why
        # converted anyway, validate's pre-flight names the same reason
        proc = run("nvfp4-to-marlin", src, out, "--target", target, "--allow-unservable", "-q")
        assert proc.returncode == 0, proc.stderr
        proc = run_cli("validate", out, "--json", check=False)
        findings = [f for f in json.loads(proc.stdout)["findings"] if f["check"] == "marlin.serving_methods"]
        assert proc.returncode == 1 and findings and why in findings[0]["message"], proc.stdout
        shutil.rmtree(out)


@pytest.mark.parametrize("case", ["nvfp4", "mixed-precision"])
def test_served_source_converts_and_validates_clean(tmp_path, case):
    """NVFP4 on vLLM; Qwen3's MIXED_PRECISION on SGLang, where its differential proof runs."""
    src = _qwen3(tmp_path / "src", _mixed if case == "mixed-precision" else None)
    run = _env_without_flag()
    target = "sglang" if case == "mixed-precision" else "vllm"
    proc = run("nvfp4-to-marlin", src, tmp_path / "out", "--target", target, "-q")
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("validate", tmp_path / "out", "--json", check=False)
    assert proc.returncode == 0, proc.stdout


def test_plan_says_which_engines_serve_it(tmp_path):
    src = _qwen3(tmp_path / "src", _mixed)
    proc = run_cli("plan", src, "--gpus", 1, "--gpu-mem-gib", 96, "--target", "vllm", "--json", check=False)
    doc = json.loads(proc.stdout)
    assert "'modelopt_mixed'" in doc["model"]["not_served"]["vllm"], doc["model"]
    assert any(r.startswith("NOT SERVED") for r in doc["reasoning"]), doc["reasoning"]
    # what will not load gets no launch command and no recommendation, and the exit code says so
    assert proc.returncode == 4 and doc["exit_code"] == 4 and doc["error"]["id"] == "plan.not_served", doc
    assert doc["command"] is None and doc["recommended"] is None and "'modelopt_mixed'" in doc["error"]["message"]
    assert any(c["valid"] for c in doc["candidates"])  # the splits themselves would fit: only serving is refused
    text = run_cli("plan", src, "--gpus", 1, "--target", "vllm", check=False)
    assert text.returncode == 4 and "vllm serve" not in text.stdout + text.stderr, text.stdout
    proc = run_cli("plan", _qwen3(tmp_path / "plain"), "--json", check=False)
    served = json.loads(proc.stdout)
    assert served["model"]["not_served"] == {"sglang": None, "vllm": None}
    assert proc.returncode == 0 and served["command"] and "error" not in served
