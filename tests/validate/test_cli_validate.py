"""validate end to end on synth checkpoints and converter output: every injectable defect is caught
with the right check id at the tensor synth's manifest names, and the exit code says so."""

import json
import subprocess
import sys

import pytest
from safetensors import safe_open
from safetensors.torch import save_file

from dsv4_convert.cli.main import main
from dsv4_convert.synth import write_synthetic_checkpoint

NV_DEFECTS = ("nan-scale", "negative-scale", "subnormal-scale", "zero-scale", "missing-expert", "swapped-nibbles",
              "global-mismatch", "all-zero-expert", "nan-global")
MX_DEFECTS = ("e8m0-nan", "e8m0-overflow", "missing-expert", "swapped-nibbles", "all-zero-expert")
EXPECTED = {
    "nan-scale": "nvfp4.scale.nan", "negative-scale": "nvfp4.scale.negative",
    "subnormal-scale": "nvfp4.scale.subnormal", "zero-scale": "nvfp4.scale.zero",
    "missing-expert": "structure.experts.missing", "swapped-nibbles": "against.mismatch",
    "global-mismatch": "nvfp4.global.gate_up_mismatch", "all-zero-expert": "expert.all_zero",
    "nan-global": "nvfp4.global.invalid", "e8m0-nan": "mxfp4.scale.nan", "e8m0-overflow": "mxfp4.scale.overflow",
    "truncated-shard": "structure.shard.truncated", "missing-shard": "structure.index.missing_file",
}
SMALL = dict(layers=1, experts=8, shards=2)


def validate(*args) -> tuple[int, dict]:
    out = args[0].parent / f"report-{args[0].name}.json"
    with pytest.raises(SystemExit) as e:
        main(["validate", *map(str, args), "--report", str(out), "--quiet", "--workers", "1"])
    return e.value.code, json.loads(out.read_text())


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpts")
    return {
        "nv-clean": write_synthetic_checkpoint(d / "nv-clean", format="nvfp4-modelopt-dsv4", **SMALL),
        "nv-bad": write_synthetic_checkpoint(d / "nv-bad", format="nvfp4-modelopt-dsv4", defects=NV_DEFECTS, **SMALL),
        "mx-clean": write_synthetic_checkpoint(d / "mx-clean", format="mxfp4-dsv4", **SMALL),
        "mx-bad": write_synthetic_checkpoint(d / "mx-bad", format="mxfp4-dsv4", defects=MX_DEFECTS, **SMALL),
    }


def _assert_caught(report: dict, manifest: dict):
    for rec in manifest["defects"]:
        want = EXPECTED[rec["defect"]]
        hits = [f for f in report["findings"] if f["check"] == want and f["severity"] == "error"
                and (f["tensor"] in rec["tensors"] or (f["expert"] == rec["expert"] and f["layer"] == rec["layer"]))]
        assert hits, f"{rec['defect']}: no error {want} at {rec['tensors']}"
        if rec["defect"] == "swapped-nibbles":
            assert any("swapped nibbles" in (f["cause"] or "") for f in hits if f["tensor"] in rec["tensors"])


@pytest.mark.parametrize("kind", ["nv", "mx"])
def test_every_defect_is_caught_with_its_check_id(ckpts, kind):
    code, report = validate(ckpts[f"{kind}-bad"], "--against", ckpts[f"{kind}-clean"])
    assert code == 1 and report["summary"]["exit_code"] == 1
    _assert_caught(report, json.loads((ckpts[f"{kind}-bad"] / "synth.json").read_text()))


@pytest.mark.parametrize("defect", ["truncated-shard", "missing-shard"])
def test_file_defects_exit_1_with_their_check_id(tmp_path, defect):
    root = write_synthetic_checkpoint(tmp_path / defect, format="mxfp4-dsv4", defects=(defect,), **SMALL)
    code, report = validate(root)
    assert code == 1
    assert any(f["check"] == EXPECTED[defect] and f["severity"] == "error" for f in report["findings"])


@pytest.mark.parametrize("kind", ["nv", "mx"])
def test_clean_checkpoint_passes(ckpts, kind):
    code, report = validate(ckpts[f"{kind}-clean"])
    assert code == 0 and report["summary"]["errors"] == 0 and report["summary"]["gemm_cases"] == 6
    assert report["schema_version"] == 1 and {c["status"] for c in report["checks"]} <= {"pass", "not run"}


def test_cli_subprocess_exit_codes(ckpts, tmp_path):
    run = [sys.executable, "-m", "dsv4_convert.cli", "validate", "--quiet", "--workers", "1"]
    bad = subprocess.run(run + [str(ckpts["nv-bad"])], capture_output=True, text=True, check=False)
    assert bad.returncode == 1 and "error[nvfp4.scale.nan] layers.0.ffn.experts.1.w1.weight_scale" in bad.stdout
    missing = subprocess.run(run + [str(tmp_path / "nope")], capture_output=True, text=True, check=False)
    assert missing.returncode == 2 and "source.not_found" in missing.stderr


def test_quiet_prints_only_the_findings_and_the_verdict(ckpts):
    run = [sys.executable, "-m", "dsv4_convert.cli", "validate", "--workers", "1"]
    loud = subprocess.run(run + [str(ckpts["mx-clean"])], capture_output=True, text=True, check=False)
    quiet = subprocess.run(run + ["-q", str(ckpts["mx-clean"])], capture_output=True, text=True, check=False)
    assert loud.returncode == quiet.returncode == 0
    assert "worst layers" in loud.stdout  # the table of passing checks, which -q leaves out
    (verdict,) = quiet.stdout.splitlines()
    assert verdict.endswith("-> OK (exit 0)") and verdict.split(" in ")[0] == loud.stdout.splitlines()[-1].split(" in ")[0]
    bad = subprocess.run(run + ["-q", str(ckpts["mx-bad"])], capture_output=True, text=True, check=False)
    assert bad.returncode == 1 and "error[mxfp4.scale.nan]" in bad.stdout and "worst layers" not in bad.stdout
    assert bad.stdout.splitlines()[-1].endswith("-> FAIL (exit 1)")


@pytest.fixture(scope="module")
def converted(ckpts, tmp_path_factory):
    out = tmp_path_factory.mktemp("conv") / "marlin"
    try:
        main(["nvfp4-to-marlin", str(ckpts["nv-clean"]), str(out), "--target", "vllm", "--quiet", "--workers", "1"])
    except SystemExit as e:
        assert e.code in (0, None)
    return out


def test_converter_output_passes_against_source(converted, ckpts):
    code, report = validate(converted, "--against", ckpts["nv-clean"])
    assert code == 0, [f["message"] for f in report["findings"]]
    assert report["format"] == "marlin" and report["options"]["engine"] == "vllm"
    assert {c["id"] for c in report["checks"] if c["status"] == "pass"} >= {
        "marlin.layout.weight", "marlin.layout.scale", "marlin.layout.global", "gemm.rel_error"}


def test_corrupted_marlin_file_names_the_cause(converted, ckpts, tmp_path):
    import shutil
    bad = tmp_path / "bad"
    shutil.copytree(converted, bad)
    name = "layers.0.ffn.experts.3.w2.weight"
    shard = json.loads((bad / "model.safetensors.index.json").read_text())["weight_map"][name]
    with safe_open(bad / shard, "pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    q = tensors[name].clone()
    q[0, 0:128], q[1, 0:128] = tensors[name][1, 0:128], tensors[name][0, 0:128]  # swap tiles (0,0) and (1,0)
    tensors[name] = q
    save_file(tensors, bad / shard, metadata=meta)
    code, report = validate(bad, "--against", ckpts["nv-clean"])
    assert code == 1
    (f,) = [f for f in report["findings"] if f["check"] == "marlin.layout.weight"]
    assert f["tensor"] == name and "wrong tile order" in f["cause"]
