"""validate/checks/serving.py on real checkpoints: a stale config.json block (nvidia/DeepSeek-V3-0324-FP4
keeps block FP8 beside an NVFP4 hf_quant_config.json) on the source and on its conversion, and the
pre-flight of the method the target engine builds for the non-expert layers.

Checkpoints: `dsv4_convert.synth` Qwen3-MoE nvfp4-modelopt-hf (a family the plugins serve) with one config edit each, converted by the real CLI
in a subprocess. No substitutions.
"""

import json
from pathlib import Path

import pytest

from dsv4_convert.validate.check import Severity
from dsv4_convert.validate.checks import serving as s
from tests.helpers.checks import on_disk, run, synth
from tests.helpers.cli import run_cli

pytestmark = pytest.mark.slow  # every test converts (or uses a conversion) through the real CLI

BLOCK_FP8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]}


def _edit_config(root: Path, edit) -> None:
    config = json.loads((root / "config.json").read_text())
    edit(config)
    (root / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def stale(tmp_path_factory):
    """(source, its vLLM conversion): config.json keeps the block-FP8 block of the model before export."""
    tmp = tmp_path_factory.mktemp("stale")
    src, _ = synth(tmp / "src", format="nvfp4-modelopt-hf", family="qwen3-moe")
    _edit_config(src, lambda c: c.update(quantization_config=dict(BLOCK_FP8)))
    run_cli("nvfp4-to-marlin", src, tmp / "out", "--target", "vllm", "-q")
    return src, tmp / "out"


def test_clean_source_and_conversion_pass(tmp_path):
    src, _ = synth(tmp_path / "src", format="nvfp4-modelopt-hf", family="qwen3-moe")
    run_cli("nvfp4-to-marlin", src, tmp_path / "out", "--target", "sglang", "-q")
    for root in (src, tmp_path / "out"):
        cin = on_disk(root)
        assert run(s.stale_quant_block, cin) == [] and run(s.inner_method_resolves, cin) == []


def test_stale_block_reported_on_the_source_and_replaced_in_the_output(stale):
    """The source is reported; its conversion records `serves_from` hf_quant_config.json (the converter replaced the
    stale block), so it serves the non-expert layers with ModelOpt NVFP4 and nothing is reported."""
    (f,) = run(s.stale_quant_block, on_disk(stale[0]))
    assert s.stale_quant_block.severity_of(f) is Severity.ERROR
    assert "config.json quantization_config" in f.message and "says FP8 (quant_method 'fp8')" in f.message
    assert "hf_quant_config.json says quant_algo NVFP4" in f.message
    record = json.loads((stale[1] / "config.json").read_text())["quantization_config"]
    assert record["serves_from"] == "hf_quant_config.json" and record["original_quantization_config"] == BLOCK_FP8
    assert run(s.stale_quant_block, on_disk(stale[1])) == [] and run(s.inner_method_resolves, on_disk(stale[1])) == []


def test_pre_flight_refuses_the_method_a_recorded_stale_block_resolves_to(stale, tmp_path):
    """A conversion whose record serves from the stale block (made before `serves_from`, or edited): reported."""
    import shutil

    out = tmp_path / "old"
    shutil.copytree(stale[1], out)
    _edit_config(out, lambda c: c["quantization_config"].pop("serves_from"))
    (f,) = run(s.stale_quant_block, on_disk(out))
    assert "original_quantization_config" in f.message
    (f,) = run(s.inner_method_resolves, on_disk(out))
    assert s.inner_method_resolves.severity_of(f) is Severity.ERROR
    assert "vllm builds 'fp8' for the non-expert layers of this qwen3-moe nvfp4-modelopt-hf source" in f.message


def test_no_block_in_config_json_resolves_from_hf_quant_config(tmp_path):
    """The first nvidia/DeepSeek-R1-FP4 export: only hf_quant_config.json. The output records it, and the
    pre-flight finds the engine's method from it (modelopt_fp4, proven for Qwen3-MoE) instead of none."""
    src, _ = synth(tmp_path / "src", format="nvfp4-modelopt-hf", family="qwen3-moe")
    _edit_config(src, lambda c: c.pop("quantization_config"))
    run_cli("nvfp4-to-marlin", src, tmp_path / "out", "--target", "vllm", "-q")
    qc = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    assert qc["original_quantization_config"] is None and qc["original_hf_quant_config"]["quantization"][
        "quant_algo"] == "NVFP4"
    assert run(s.inner_method_resolves, on_disk(tmp_path / "out")) == []
    proc = run_cli("validate", tmp_path / "out", "--json", check=False)
    assert proc.returncode == 0, proc.stdout


PRODUCERS = Path(__file__).resolve().parents[2] / "fixtures" / "producers"


@pytest.mark.parametrize("name", ["modelopt-deepseek-v3-nvfp4", "llmc-deepseek-v3-nvfp4a16"])
def test_a_config_the_engines_cannot_build_is_an_error(name):
    """The real producers' DeepSeek-V3 exports (transformers 5 drops moe_layer_freq, topk_method, scoring_func):
    both engines fail on the source itself (serving_tests/test_engine_refusals.py shows it), so validate says so."""
    findings = run(s.engine_config_keys, on_disk(PRODUCERS / name))
    assert {f.message.split(" ", 1)[0] for f in findings} == {"sglang", "vllm"}, findings
    assert all(s.engine_config_keys.severity_of(f) is Severity.ERROR for f in findings)
    assert any("'moe_layer_freq'" in f.message or "moe_layer_freq" in f.message for f in findings)
    assert all('"topk_method": "noaux_tc"' in f.message for f in findings), findings


def test_the_same_family_with_its_release_keys_passes(tmp_path):
    """synth's DeepSeek-V3 replica carries the keys the releases' config.json does (the walk above can pass)."""
    src, _ = synth(tmp_path / "src", format="nvfp4-modelopt-hf", family="deepseek-v3")
    assert run(s.engine_config_keys, on_disk(src)) == []
    _edit_config(src, lambda c: c.pop("moe_layer_freq"))
    (f,) = run(s.engine_config_keys, on_disk(src))  # SGLang's alone: vLLM reads topk_method only
    assert f.message.startswith("sglang cannot build") and "moe_layer_freq" in f.message
