"""The converter's gate and validate's pre-flight decide the same way, from the one served table
(core/targets/served.py), before anything is written: real CLI command lines on real safetensors files.

Substitutions: the checkpoints are `dsv4_convert.synth` Qwen3-MoE ModelOpt NVFP4 replicas with one config
edit each (the ModelOpt MIXED_PRECISION block a Qwen3-30B-A3B export writes: served on SGLang, refused on vLLM;
an architecture string in no family), not released weights. The refusal is tested with
DSV4_CONVERT_ALLOW_UNSERVABLE removed (tests/conftest.py sets it for the converter's other tests). The command
lines run in three CLI processes, in order (run_cli_batch: `main(argv)` each, as the console script runs it, its
exit code, stdout and stderr), not one process each: a process start costs more than these commands. The gate's
runs (variable removed), then the runs converted anyway (variable removed, --allow-unservable), then validate and
plan (as the other tests run them); whether a refused run wrote anything is recorded between the first two.
"""

from __future__ import annotations

import json

import pytest

from dsv4_convert.synth import write_synthetic_checkpoint
from tests.helpers.cli import run_cli_steps

pytestmark = pytest.mark.slow  # every test reads the CLI's answers

SIZES = {"layers": 2, "experts": 4, "hidden": 128, "intermediate": 128, "shards": 1}
NO_FLAG = {"DSV4_CONVERT_ALLOW_UNSERVABLE": None}  # removed (tests/conftest.py sets it for the converter's tests)
REFUSED = ["mixed-precision", "SomethingNewMoeForCausalLM"]
SERVED = ["nvfp4", "mixed-precision"]


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


def _refused_targets(case: str) -> tuple:
    # Qwen3's MIXED_PRECISION export is proven on SGLang (core/targets/served.py), not on vLLM
    return ("vllm",) if case == "mixed-precision" else ("sglang", "vllm")



@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """(test, case, target, step) -> the CLI's answer, ("dir", test, case) -> its folder, (test, case, target,
    "written") -> whether the refused run left OUT or OUT.partial."""
    work = tmp_path_factory.mktemp("gate")
    d = {(t, c): work / f"{t}-{c}" for t, cases in (("refused", REFUSED), ("served", SERVED)) for c in cases}
    d["plan", None] = work / "plan"
    src = {(t, c): _qwen3(p / "src", _mixed if c == "mixed-precision" else _arch(c) if t == "refused" else None)
           for (t, c), p in d.items() if t != "plan"}
    src["plan", None], src["plan", "plain"] = _qwen3(work / "plan" / "src", _mixed), _qwen3(work / "plan" / "plain")
    out = {(c, t): d["refused", c] / f"out-{t}" for c in REFUSED for t in _refused_targets(c)}
    runs = run_cli_steps({**{("refused", c, t, "gate"): ["nvfp4-to-marlin", src["refused", c], o, "--target", t, "--json"]
                      for (c, t), o in out.items()},
                   **{("served", c, None, "convert"): ["nvfp4-to-marlin", src["served", c], d["served", c] / "out",
                                                       "--target", "sglang" if c == "mixed-precision" else "vllm", "-q"]
                      for c in SERVED}}, work, env=NO_FLAG)
    runs.update({("refused", c, t, "written"): o.exists() or o.with_name(f"{o.name}.partial").exists()
                 for (c, t), o in out.items()})
    runs.update(run_cli_steps({("refused", c, t, "anyway"): ["nvfp4-to-marlin", src["refused", c], o, "--target", t,
                                                      "--allow-unservable", "-q"] for (c, t), o in out.items()},
                       work, env=NO_FLAG))
    runs.update(run_cli_steps({**{("refused", c, t, "validate"): ["validate", o, "--json"] for (c, t), o in out.items()},
                        **{("served", c, None, "validate"): ["validate", d["served", c] / "out", "--json"] for c in SERVED},
                        ("plan", None, None, "json"): ["plan", src["plan", None], "--gpus", 1, "--gpu-mem-gib", 96,
                                                       "--target", "vllm", "--json"],
                        ("plan", None, None, "text"): ["plan", src["plan", None], "--gpus", 1, "--target", "vllm"],
                        ("plan", None, None, "plain"): ["plan", src["plan", "plain"], "--json"]}, work))
    return runs


@pytest.mark.parametrize("case", REFUSED)
def test_refused_before_writing_and_validate_gives_the_same_reason(runs, case):
    for target in _refused_targets(case):
        proc = runs["refused", case, target, "gate"]
        err = json.loads(proc.stdout)["error"]
        assert proc.returncode == 4 and err["id"] == "convert.unservable_family", proc.stdout
        assert not runs["refused", case, target, "written"]
        why = err["message"].split("once converted: ", 1)[1]
        assert ("'modelopt_mixed'" in why) if case == "mixed-precision" else (case in why), why
        # converted anyway, validate's pre-flight names the same reason
        proc = runs["refused", case, target, "anyway"]
        assert proc.returncode == 0, proc.stderr
        proc = runs["refused", case, target, "validate"]
        findings = [f for f in json.loads(proc.stdout)["findings"] if f["check"] == "marlin.serving_methods"]
        assert proc.returncode == 1 and findings and why in findings[0]["message"], proc.stdout


@pytest.mark.parametrize("case", SERVED)
def test_served_source_converts_and_validates_clean(runs, case):
    """NVFP4 on vLLM; Qwen3's MIXED_PRECISION on SGLang, where its differential proof runs."""
    proc = runs["served", case, None, "convert"]
    assert proc.returncode == 0, proc.stderr
    proc = runs["served", case, None, "validate"]
    assert proc.returncode == 0, proc.stdout


def test_plan_says_which_engines_serve_it(runs):
    proc = runs["plan", None, None, "json"]
    doc = json.loads(proc.stdout)
    assert "'modelopt_mixed'" in doc["model"]["not_served"]["vllm"], doc["model"]
    assert any(r.startswith("NOT SERVED") for r in doc["reasoning"]), doc["reasoning"]
    # what will not load gets no launch command and no recommendation, and the exit code says so
    assert proc.returncode == 4 and doc["exit_code"] == 4 and doc["error"]["id"] == "plan.not_served", doc
    assert doc["command"] is None and doc["recommended"] is None and "'modelopt_mixed'" in doc["error"]["message"]
    assert any(c["valid"] for c in doc["candidates"])  # the splits themselves would fit: only serving is refused
    text = runs["plan", None, None, "text"]
    assert text.returncode == 4 and "vllm serve" not in text.stdout + text.stderr, text.stdout
    proc = runs["plan", None, None, "plain"]
    served = json.loads(proc.stdout)
    assert served["model"]["not_served"] == {"sglang": None, "vllm": None}
    assert proc.returncode == 0 and served["command"] and "error" not in served
