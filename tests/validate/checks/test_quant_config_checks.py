"""validate/checks/quant_config.py on real checkpoints whose config contradicts their tensors.

Checkpoints: `dsv4_convert.synth` (source formats) and tests/helpers/ckpt_factory.py (a Marlin
checkpoint as the converter lays it out, written directly); one config edit each. No substitutions.
"""

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from dsv4_convert.core.targets.target import MarlinTarget
from dsv4_convert.validate.check import Severity
from dsv4_convert.validate.checks import quant_config as q
from dsv4_convert.validate.checks.structure import reader_refused as s_reader
from dsv4_convert.validate.inputs import Options
from tests.helpers.checks import on_disk, run, synth
from tests.helpers.ckpt_factory import make_checkpoint

CHECKS = [q.group_size_matches, q.experts_method, q.exclusions_cover, q.mxfp4_act_dtype, q.marlin_config,
          q.marlin_dtype_shape]


@pytest.fixture(scope="module")
def nvfp4(tmp_path_factory):
    return synth(tmp_path_factory.mktemp("nv") / "ckpt")[0]


@pytest.fixture(scope="module")
def marlin(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("marlin") / "ckpt", "marlin").root


def _edit(src: Path, dst: Path, name: str, edit) -> Path:
    shutil.copytree(src, dst)
    obj = json.loads((dst / name).read_text())
    edit(obj)
    (dst / name).write_text(json.dumps(obj))
    return dst


@pytest.mark.parametrize("chk", CHECKS, ids=lambda c: c.id)
def test_clean_checkpoints_pass(nvfp4, marlin, chk):
    for root in (nvfp4, marlin):
        cin = on_disk(root)
        assert cin.checkpoint is not None and run(chk, cin, cin.options) == []


def test_declared_group_size_that_the_tensors_do_not_use(tmp_path, nvfp4):
    root = _edit(nvfp4, tmp_path / "ckpt", "hf_quant_config.json", lambda o: o["quantization"].update(group_size=32))
    refused = on_disk(root)  # the reader refuses this contradiction itself, naming the scale tensor
    assert refused.checkpoint is None and "[64, 8] has groups of 16" in refused.reader_error.message
    (r,) = run(s_reader, refused)
    assert r.tensor == "layers.0.ffn.experts.0.w1.weight_scale"
    # the check itself, on the model of the clean files with the edited config (what it sees when a
    # reader accepts the files)
    cin = on_disk(nvfp4)
    cin = replace(cin, hf_quant_config=json.loads((root / "hf_quant_config.json").read_text()))
    (f,) = run(q.group_size_matches, cin)
    assert q.group_size_matches.severity_of(f) is Severity.ERROR
    assert f.tensor == "hf_quant_config.json quantization.group_size"  # where the contradiction is declared
    assert "group_size = 32, but the nvfp4 expert scales have groups of 16" in f.message


def test_nvfp4_experts_excluded_from_the_nvfp4_method(tmp_path, nvfp4):
    def exclude_experts(o):
        o["quantization"]["exclude_modules"].append("layers.0.ffn.experts")

    root = _edit(nvfp4, tmp_path / "ckpt", "hf_quant_config.json", exclude_experts)
    (f,) = run(q.experts_method, on_disk(root))
    assert q.experts_method.severity_of(f) is Severity.ERROR
    assert (f.tensor, f.layer) == ("layers.0.ffn.experts", "0")
    assert "experts are nvfp4 but excluded from the NVFP4 MoE method" in f.message


def test_unexcluded_16_bit_linear_of_a_generic_nvfp4_config(tmp_path):
    root, _ = synth(tmp_path / "ckpt", format="nvfp4-modelopt-hf")
    cin = on_disk(root)
    pats = q.exclusion_patterns(cin)
    assert pats and run(q.exclusions_cover, cin) == []

    def drop_exclusions(o):
        for block in (o, o.get("quantization_config") or {}, o.get("quantization") or {}):
            for key in ("exclude_modules", "ignore"):
                block.pop(key, None)

    for name in ("config.json", "hf_quant_config.json"):
        if (root / name).exists():
            obj = json.loads((root / name).read_text())
            drop_exclusions(obj)
            (root / name).write_text(json.dumps(obj))
    (f,) = run(q.exclusions_cover, on_disk(root))
    assert q.exclusions_cover.severity_of(f) is Severity.WARNING
    assert f.count >= 1 and f.tensor in f.message and f.tensor in {t.name.removesuffix(".weight")
                                                                      for t in cin.checkpoint.passthrough}


def test_mxfp4_with_fp16_activations(tmp_path):
    root, _ = synth(tmp_path / "ckpt", format="mxfp4-dsv4")
    assert run(q.mxfp4_act_dtype, on_disk(root)) == []
    cin = on_disk(root, Options(target=MarlinTarget(act_dtype="float16")))
    (f,) = run(q.mxfp4_act_dtype, cin, cin.options)
    n = sum(1 for p in on_disk(root).checkpoint.projections if p.quant.value == "mxfp4")
    assert q.mxfp4_act_dtype.severity_of(f) is Severity.ERROR
    assert (f.tensor, f.count) == ("config", n) and "activation dtype float16" in f.message


def test_converted_checkpoint_with_a_layout_tag_of_another_engine(tmp_path, marlin):
    root = _edit(marlin, tmp_path / "ckpt", "config.json",
                 lambda o: o["quantization_config"].update(marlin_layout="vllm-L4"))
    (f,) = run(q.marlin_config, on_disk(root))
    assert q.marlin_config.severity_of(f) is Severity.ERROR
    assert f.tensor == "config.json" and "[converted_config.layout] target_engine 'sglang' with marlin_layout " \
        "'vllm-L4', which is vllm's" in f.message


def test_converted_checkpoint_validated_for_another_target(marlin):
    cin = on_disk(marlin, Options(engine_requested="vllm"))
    (f,) = run(q.marlin_config, cin, cin.options)
    assert f.tensor == "config.json"
    assert "converted for target sglang (sglang-L2), but you asked to validate for vllm" in f.message


def test_converted_global_of_the_wrong_dtype(marlin):
    cin = on_disk(marlin, Options(target=MarlinTarget(engine="vllm")))  # vLLM wants fp32 globals; these are bf16 (SGLang's)
    (f,) = run(q.marlin_dtype_shape, cin, Options(target=MarlinTarget(engine="vllm")))
    first = next(p for p in cin.checkpoint.projections if p.quant.value == "nvfp4")
    assert q.marlin_dtype_shape.severity_of(f) is Severity.ERROR
    assert f.tensor == first.key and "weight_global_scale BF16 [], expected F32 []" in f.message


# --- the converted block through the one parser (core/record/converted_config.py), issue 23 items 8 and 15 ----


@pytest.mark.parametrize("edit, error_id, text", [
    (lambda qc: qc.update(tp_layout={"tp": "2", "ep": 1, "containers": {}}), "converted_config.tp_layout",
     "tp_layout.tp must be a positive integer, got '2'"),
    (lambda qc: qc.update(w4a8=True), "converted_config.layout", "has no W4A8 Marlin layout"),
    (lambda qc: qc.update(w4a8=1), "converted_config.bad_value", "w4a8 must be true or false, got 1"),
    (lambda qc: qc.update(format_version=True), "converted_config.not_ours", "format_version is True"),
], ids=["tp-as-string", "w4a8-sglang", "w4a8-int", "version-bool"])
def test_converted_block_of_the_wrong_type_is_refused(tmp_path, marlin, edit, error_id, text):
    root = _edit(marlin, tmp_path / "ckpt", "config.json", lambda o: edit(o["quantization_config"]))
    (f,) = run(q.marlin_config, on_disk(root))
    assert q.marlin_config.severity_of(f) is Severity.ERROR and f"[{error_id}]" in f.message and text in f.message


def test_model_dimension_of_the_wrong_type_is_refused(tmp_path, marlin):
    root = _edit(marlin, tmp_path / "ckpt", "config.json", lambda o: o.update(n_routed_experts=True))
    (f,) = run(q.marlin_config, on_disk(root))
    assert "[converted_config.bad_value] config.json n_routed_experts is True, expected a positive integer" \
        in f.message


def test_container_missing_from_the_experts_map(tmp_path, marlin):
    def drop_one(o):
        experts = o["quantization_config"]["experts"]
        experts.pop(sorted(experts)[0])

    root = _edit(marlin, tmp_path / "ckpt", "config.json", drop_one)
    findings = run(q.experts_method, on_disk(root))
    assert findings and all("[converted_config.experts_map]" in f.message for f in findings)
    assert "quantization_config.experts does not list it" in findings[0].message
