"""Issue 10, "refuse what is inconsistent, before writing" and the clear-error cases: the structure
rules that the converter and validate share, validate's report on an empty expert, and
marlin-to-source on a damaged source record (also when the manifest was re-recorded to match, so
that the record's reader itself must refuse) and on a full disk. Real files, real CLI subprocesses.

Substitutions: a full disk is a small tmpfs (mount(8), as root), skipped where mount is not allowed;
an attacker's consistent edit is simulated by re-recording the manifest entry with the tool's own
digest (dsv4_convert.runtime.digest), as someone with write access to the checkpoint could."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from dsv4_convert.core.sources.structure import RULES
from dsv4_convert.validate.checks import BY_ID
from tests.helpers.cli import run_cli, tree_hashes
from tests.helpers.corrupt import rerecord_manifest

SMALL = ("--layers", "1", "--experts", "4", "--shards", "2")
HEADERS = "dsv4-convert-source/headers.json"


def _clean(proc, code: int, error_id: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert f"error[{error_id}]" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert "\n  fix: " in proc.stderr, proc.stderr


def test_every_rule_is_a_validate_check_and_a_converter_refusal():
    for rule in RULES:
        chk = BY_ID[rule.check_id]
        assert chk.hint == rule.hint, "one fix for both"
        assert rule.error_id.startswith("convert."), rule.error_id


def test_validate_on_an_empty_expert_reports_it_in_json(tmp_path):
    src = tmp_path / "src"
    run_cli("synth", src, *SMALL, "--defect", "empty-expert")
    report = tmp_path / "report.json"
    proc = run_cli("validate", src, "--quiet", "--workers", "1", "--report", report, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads(report.read_text())
    assert doc["summary"]["exit_code"] == 1
    ids = {f["check"] for f in doc["findings"]} if "findings" in doc else {
        c["id"] for c in doc["checks"] if c["status"] == "fail"}
    assert "structure.experts.empty" in ids, doc
    conv = run_cli("nvfp4-to-marlin", src, tmp_path / "out", "-q", "--workers", "1", check=False)
    _clean(conv, 4, "convert.empty_expert")
    assert "layers.0.ffn.experts.0.w1.weight" in conv.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    base = tmp_path_factory.mktemp("rev")
    run_cli("synth", base / "src", *SMALL)
    run_cli("nvfp4-to-marlin", base / "src", base / "conv", "-q", "--workers", "1")
    return base / "conv"


def _copy(converted: Path, dst: Path) -> Path:
    shutil.copytree(converted, dst)
    return dst


def test_truncated_headers_json_is_a_manifest_mismatch(tmp_path, converted):
    ck = _copy(converted, tmp_path / "ck")
    data = (ck / HEADERS).read_bytes()
    (ck / HEADERS).write_bytes(data[: len(data) // 2])
    proc = run_cli("marlin-to-source", ck, tmp_path / "out", "-q", check=False)
    _clean(proc, 4, "reverse.manifest_mismatch")
    assert "headers.json" in proc.stderr and not (tmp_path / "out").exists()


@pytest.mark.parametrize("edit", ["truncated", "not-an-object", "escaping-name", "not-text"])
def test_the_source_record_reader_refuses_even_when_the_manifest_matches(tmp_path, converted, edit):
    ck = _copy(converted, tmp_path / "ck")
    record = json.loads((ck / HEADERS).read_text())
    first = next(iter(record))
    if edit == "truncated":
        data = (ck / HEADERS).read_bytes()
        (ck / HEADERS).write_bytes(data[: len(data) // 2])
    elif edit == "not-an-object":
        (ck / HEADERS).write_text(json.dumps(list(record)))
    elif edit == "escaping-name":  # would make marlin-to-source write outside OUT
        record[f"../escaped-{uuid.uuid4().hex[:6]}.safetensors"] = record.pop(first)
        (ck / HEADERS).write_text(json.dumps(record))
    else:
        record[first] = 7
        (ck / HEADERS).write_text(json.dumps(record))
    rerecord_manifest(ck, HEADERS)
    before = tree_hashes(ck)
    proc = run_cli("marlin-to-source", ck, tmp_path / "out", "-q", check=False)
    _clean(proc, 3, "reverse.bad_source_record")
    assert "headers.json" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"], "nothing written, nothing escaped"
    assert tree_hashes(ck) == before


def test_marlin_to_source_onto_a_full_disk(tmp_path, converted):
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", str(disk)],
                      capture_output=True).returncode != 0:
        pytest.skip("needs mount(8) for a small tmpfs")
    try:
        before = tree_hashes(converted)
        proc = run_cli("marlin-to-source", converted, disk / "out", "-q", "--json", check=False)
        _clean(proc, 5, "output.disk_full")
        doc = json.loads(proc.stdout)
        assert doc["exit_code"] == 5 and doc["error"]["id"] == "output.disk_full"
        assert list(disk.iterdir()) == [], "staging removed"
        assert tree_hashes(converted) == before
    finally:
        subprocess.run(["umount", str(disk)], check=True)
