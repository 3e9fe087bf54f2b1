"""Issue 23, the validate / reverse part: `validate` never passes what it did not check, Marlin words
are Marlin whatever the config says, and hand-damaged outputs give typed errors (id, file, fix, exit
class, one JSON object under --json), never a traceback. Items 4, 5 and 7, and the attacks beyond them.

Real files: small checkpoints (tests/helpers/ckpt_factory.py, synth) converted by the real CLI, then
damaged by byte- and JSON-level edits (tests/helpers/corrupt.py). All damaged cases then run in one
CLI process (tests/helpers/cli_batch.py: `main(argv)` per command, an escaping exception is recorded
as a crash), as test_catalogue.py does: one torch import instead of ~60.
Substitutions: an edit made consistently (the manifest re-recorded with the tool's own digest,
corrupt.rerecord_manifest) stands for someone with write access to the checkpoint."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dsv4_convert.core.files import CONFIG, LOST, SOURCE_DIR, SOURCE_HEADERS
from tests.helpers.ckpt_factory import make_checkpoint
from tests.helpers.cli import run_cli
from tests.helpers.corrupt import INDEX, edit_header, edit_json, rerecord_manifest

pytestmark = pytest.mark.slow  # every test starts the CLI

BATCH = Path(__file__).parents[1] / "helpers" / "cli_batch.py"
LOST_REL = f"{SOURCE_DIR}/{LOST}"
KEY = "layers.0.ffn.experts.1.w3"  # synth's negative-scale defect: the one NVFP4 projection with a lost byte


# ------------------------------------------------------------------------------------------- inputs
@pytest.fixture(scope="module")
def base(tmp_path_factory, synth_source) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("base")
    mx = make_checkpoint(d / "mx", "mxfp4-dsv4", layers=1, experts=2, hidden=256, inter=128, shards=2).root
    one = make_checkpoint(d / "mx1", "mxfp4-dsv4", layers=1, experts=1, hidden=256, inter=128, shards=1).root
    narrow = make_checkpoint(d / "mx96", "mxfp4-dsv4", layers=1, experts=2, hidden=256, inter=96, shards=1).root
    neg = synth_source("nvfp4-modelopt-dsv4", layers=1, experts=4, shards=1, defects=("negative-scale",))
    run_cli("mxfp4-to-marlin", mx, d / "m", "-q")
    run_cli("mxfp4-to-marlin", mx, d / "m_tp2", "--target", "vllm", "--tp", 2, "-q")
    run_cli("nvfp4-to-marlin", neg, d / "nv_lost", "--target", "sglang", "-q")
    assert (d / "nv_lost" / LOST_REL).exists(), "the negative scale is recorded as lost"
    return {"mx": mx, "mx1": one, "mx96": narrow, "m": d / "m", "m_tp2": d / "m_tp2", "nv_lost": d / "nv_lost"}


def _qc(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def damage(root: Path) -> None:
        edit_json(root / CONFIG, lambda c: edit(c.setdefault("quantization_config", {})))
        rerecord_manifest(root, CONFIG)
    return damage


def _drop_qc(root: Path) -> None:
    edit_json(root / CONFIG, lambda c: c.pop("quantization_config"))
    rerecord_manifest(root, CONFIG)


def _fp8_qc(root: Path) -> None:
    edit_json(root / CONFIG, lambda c: c.__setitem__("quantization_config", {"quant_method": "fp8"}))
    rerecord_manifest(root, CONFIG)


def _lost(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def damage(root: Path) -> None:
        d = load_file(root / LOST_REL)
        edit(d)
        save_file(d, root / LOST_REL)
        rerecord_manifest(root, LOST_REL)
    return damage


def _lost_garbage(root: Path) -> None:
    (root / LOST_REL).write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage")
    rerecord_manifest(root, LOST_REL)


def _set(**parts) -> Callable[[dict], None]:
    return lambda d: d.update({f"{KEY}.{k}": v for k, v in parts.items()})


def _record(rel: str, edit: Callable[[dict], None]) -> Callable[[Path], None]:
    """Edit a JSON file of the source record (dsv4-convert-source/), manifest re-recorded."""
    def damage(root: Path) -> None:
        edit_json(root / SOURCE_DIR / rel, edit)
        rerecord_manifest(root, f"{SOURCE_DIR}/{rel}")
    return damage


def _first_header_not_json(h: dict) -> None:
    h[sorted(h)[0]] = "{not json"


def _experts_not_fp4(root: Path) -> None:
    """Every expert weight's dtype I8 -> F8_E4M3 (same size): FP8 experts, nothing FP4 left to check."""
    index = json.loads((root / INDEX).read_text())["weight_map"]
    for shard in sorted(set(index.values())):
        edit_header(root / shard, lambda h: [v.update(dtype="F8_E4M3") for k, v in h.items()
                                             if ".experts." in k and k.endswith(".weight")])


def _deep_config(root: Path) -> None:
    text = (root / CONFIG).read_text().rstrip().rstrip("}")
    (root / CONFIG).write_text(text + ', "deep": ' + "[" * 100_000 + "]" * 100_000 + "}")


# name -> (base, damage). Each gets a private copy.
DAMAGED: dict[str, tuple[str, Callable[[Path], None] | None]] = {
    "marlin-no-qc": ("m", _drop_qc),
    "marlin-fp8-qc": ("m", _fp8_qc),
    "src-no-fp4-experts": ("mx", _experts_not_fp4),
    "src-deep-config": ("mx", _deep_config),
    "tp-layout-removed": ("m_tp2", _qc(lambda q: q.pop("tp_layout"))),
    "tp-layout-null": ("m_tp2", _qc(lambda q: q.__setitem__("tp_layout", None))),
    "tp-layout-empty": ("m_tp2", _qc(lambda q: q.__setitem__("tp_layout", {}))),
    "tp-layout-no-containers": ("m_tp2", _qc(lambda q: q["tp_layout"].__setitem__("containers", {}))),
    "headers-empty": ("m", _record(SOURCE_HEADERS, dict.clear)),
    "headers-entry-not-json": ("m", _record(SOURCE_HEADERS, _first_header_not_json)),
    "headers-shard-dropped": ("m", _record(SOURCE_HEADERS, lambda h: h.pop(sorted(h)[-1]))),
    "record-index-entry-dropped": ("m", _record(INDEX, lambda i: i["weight_map"].pop(sorted(i["weight_map"])[0]))),
    "lost-out-of-range": ("nv_lost", _lost(_set(index=torch.tensor([10**9])))),
    "lost-negative-index": ("nv_lost", _lost(_set(index=torch.tensor([-1])))),
    "lost-float-index": ("nv_lost", _lost(_set(index=torch.tensor([0.0])))),
    "lost-2d-index": ("nv_lost", _lost(_set(index=torch.tensor([[0]])))),
    "lost-no-bytes": ("nv_lost", _lost(lambda d: d.pop(f"{KEY}.bytes"))),
    "lost-length": ("nv_lost", _lost(_set(bytes=torch.tensor([1, 2], dtype=torch.uint8)))),
    "lost-duplicate": ("nv_lost", _lost(_set(index=torch.tensor([0, 0]), bytes=torch.tensor([231, 231],
                                                                                            dtype=torch.uint8)))),
    "lost-unknown-projection": ("nv_lost", _lost(lambda d: d.update({
        "layers.9.ffn.experts.1.w3.index": torch.tensor([0]),
        "layers.9.ffn.experts.1.w3.bytes": torch.tensor([231], dtype=torch.uint8)}))),
    "lost-byte-not-lossy": ("nv_lost", _lost(_set(bytes=torch.tensor([0x38], dtype=torch.uint8)))),
    "lost-not-safetensors": ("nv_lost", _lost_garbage),
}


@pytest.fixture(scope="module")
def cases(base, tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("damaged")
    out = {}
    for name, (src, damage) in DAMAGED.items():
        shutil.copytree(base[src], d / name)
        damage(d / name)
        out[name] = d / name
    return out


# --------------------------------------------------------------------------------------- one batch
def _commands(base: dict, cases: dict, out: Path) -> dict[str, list]:
    c = {}
    for name, root in cases.items():
        c[f"{name}/validate"] = ["validate", root, "--json", "-q"]
        c[f"{name}/inspect"] = ["inspect", root, "--json"]
        c[f"{name}/reverse"] = ["marlin-to-source", root, out / name, "--json", "-q"]
    m = base["m"]
    c["m/validate"] = ["validate", m, "--json", "-q"]
    c["m/validate-against"] = ["validate", m, "--against", base["mx"], "--json", "-q"]
    c["m/validate-no-manifest"] = ["validate", m, "--no-verify-manifest", "--json", "-q"]
    c["m/against-converted"] = ["validate", m, "--against", base["m_tp2"], "--json", "-q"]
    c["m/against-other-shape"] = ["validate", m, "--against", base["mx96"], "--json", "-q"]
    c["mx/against-fewer-experts"] = ["validate", base["mx"], "--against", base["mx1"], "--json", "-q"]
    c["m/seed-too-wide"] = ["validate", m, "--seed", "99999999999999999999", "--json", "-q"]
    for v in ("nan", "inf", "-inf", "1e400", "0", "-1"):
        c[f"plan/gpu-mem-{v}"] = ["plan", base["mx"], "--gpu-mem-gib", v, "--json"]
    c["src-deep-config/plan"] = ["plan", cases["src-deep-config"], "--json"]
    return c


@pytest.fixture(scope="module")
def results(base, cases, tmp_path_factory) -> dict[str, dict]:
    commands = _commands(base, cases, tmp_path_factory.mktemp("reversed"))
    listing = tmp_path_factory.mktemp("batch") / "commands.json"
    listing.write_text(json.dumps([[str(a) for a in argv] for argv in commands.values()]))
    proc = subprocess.run([sys.executable, str(BATCH), str(listing)], capture_output=True, text=True, check=True)
    return dict(zip(commands, json.loads(proc.stdout)))


def _one_json(r: dict) -> dict:
    assert r["crash"] is None, r["crash"]
    assert "Traceback" not in r["stderr"], r["stderr"]
    return json.loads(r["stdout"])  # exactly one object: json.loads refuses anything after it


def _error(r: dict, code: int, error_id: str, file_part: str | None = None) -> dict:
    doc = _one_json(r)
    assert r["code"] == code and doc.get("exit_code") == code, (r["code"], r["stdout"][-2000:])
    err = doc["error"]
    assert err["id"] == error_id and (err["fix"] or error_id == "usage.flags"), err  # click words its own
    if file_part is not None:
        assert file_part in (err["file"] or ""), err
    return err


def _findings(r: dict, check: str) -> list[dict]:
    return [f for f in _one_json(r)["findings"] if f["check"] == check]


def _status(r: dict, check: str) -> str:
    return {c["id"]: c["status"] for c in _one_json(r)["checks"]}[check]


# ----------------------------------------------------------------------------------------- item 7
@pytest.mark.parametrize("case", ["marlin-no-qc", "marlin-fp8-qc"])
def test_marlin_words_are_marlin_whatever_the_config_says(results, case):
    v = results[f"{case}/validate"]
    doc = _one_json(v)
    assert v["code"] == 1 and doc["format"] == "marlin", doc["summary"]
    assert doc["summary"]["experts_checked"] == 2 and doc["summary"]["projections_checked"] == 6
    assert _findings(v, "marlin.config"), "the lost or changed block is a finding"
    assert _one_json(results[f"{case}/inspect"])["format"] == "marlin"
    _error(results[f"{case}/reverse"], 4, "reverse.bad_config", CONFIG)


# ----------------------------------------------------------------------------------------- item 4
def test_a_checkpoint_without_fp4_experts_is_a_finding_not_a_pass(results):
    v = results["src-no-fp4-experts/validate"]
    doc = _one_json(v)
    assert v["code"] == 1 and doc["summary"]["experts_checked"] == 0, doc["summary"]
    assert _findings(v, "coverage.nothing_checked")


def test_checks_without_their_input_are_not_run_and_named(results):
    plain, against, no_manifest = (results[f"m/{k}"] for k in ("validate", "validate-against",
                                                                  "validate-no-manifest"))
    assert plain["code"] == 0 and against["code"] == 0 and no_manifest["code"] == 0
    assert _status(plain, "marlin.layout.weight") == "not run"
    assert any(n.startswith("marlin.layout.weight not run") for n in _one_json(plain)["summary"]["notes"])
    assert _status(against, "marlin.layout.weight") == "pass"
    assert _status(against, "coverage.against_unmatched") == "pass"
    assert _status(plain, "integrity.manifest") == "pass"
    assert _status(no_manifest, "integrity.manifest") == "not run"
    assert "integrity.manifest not run: --no-verify-manifest" in _one_json(no_manifest)["summary"]["notes"]


def test_against_with_experts_it_lacks_is_a_finding(results):
    r = results["mx/against-fewer-experts"]
    found = _findings(r, "coverage.against_unmatched")
    assert r["code"] == 1 and found and found[0]["count"] == 3, found  # expert 1: gate, up, down


def test_against_a_converted_checkpoint_is_refused(results, base):
    _error(results["m/against-converted"], 2, "validate.against_converted", str(base["m_tp2"]))


def test_against_a_source_of_other_shapes_is_a_finding(results):
    r = results["m/against-other-shape"]
    found = _findings(r, "against.mismatch")
    assert r["code"] == 1 and {f["cause"] for f in found} == {"shape"} and len(found) == 6, found


# ----------------------------------------------------------------------------------------- item 5
@pytest.mark.parametrize("case, error_id", [("tp-layout-removed", "reverse.shape_mismatch"),
                                            ("tp-layout-null", "reverse.shape_mismatch"),
                                            ("tp-layout-no-containers", "reverse.shape_mismatch"),
                                            ("tp-layout-empty", "reverse.bad_config")])
def test_a_removed_or_emptied_tp_layout(results, case, error_id):
    err = _error(results[f"{case}/reverse"], 4, error_id)
    assert "tp_layout" in err["message"] + err["fix"], err
    v = results[f"{case}/validate"]
    assert v["code"] == 1 and _one_json(v)["summary"]["errors"] > 0


@pytest.mark.parametrize("case", [k for k in DAMAGED if k.startswith("lost-")])
def test_a_tampered_lost_scales_record_is_refused(results, case):
    err = _error(results[f"{case}/reverse"], 3, "reverse.bad_source_record", LOST_REL)
    assert LOST in err["message"]


@pytest.mark.parametrize("case, rel", [("headers-empty", SOURCE_HEADERS), ("headers-entry-not-json", SOURCE_HEADERS),
                                       ("headers-shard-dropped", INDEX), ("record-index-entry-dropped", INDEX)])
def test_a_damaged_shard_record_is_refused_not_half_restored(results, case, rel):
    _error(results[f"{case}/reverse"], 3, "reverse.bad_source_record", f"{SOURCE_DIR}/{rel}")


def test_a_deeply_nested_config_is_config_not_json_everywhere(results):
    for cmd, code in (("validate", 2), ("inspect", 3), ("plan", 2)):
        _error(results[f"src-deep-config/{cmd}"], code, "config.not_json", CONFIG)


def test_out_of_range_numbers_are_usage_errors(results):
    err = _error(results["m/seed-too-wide"], 2, "usage.flags")
    assert "--seed" in err["message"]
    for v in ("nan", "inf", "-inf", "1e400", "0", "-1"):
        err = _error(results[f"plan/gpu-mem-{v}"], 2, "usage.flags")
        assert "--gpu-mem-gib" in err["message"], err
