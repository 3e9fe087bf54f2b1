"""Issue 10, "refuse what is inconsistent, before writing" and the clear-error cases: the structure
rules that the converter and validate share, validate's report on an empty expert, and
marlin-to-source on a damaged source record (also when the manifest was re-recorded to match, so
that the record's reader itself must refuse) and on a full disk. Real files, real CLI command lines.

Substitutions: the command lines run in two CLI processes, in order (run_cli_batch: `main(argv)` each, as the
console script runs it, its exit code, stdout and stderr), the sources' then the damaged copies', not one process
each: a process start costs more than these commands; the full-disk run keeps its own. A full disk is a small tmpfs (mount(8), as root), skipped where mount is not allowed;
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
from tests.helpers.cli import run_cli, run_cli_batch, tree_hashes
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


EDITS = ["truncated", "not-an-object", "escaping-name", "not-text"]


def _spoil_record(ck: Path, edit: str) -> None:
    """The source record edited (`edit`) and its manifest entry re-recorded to match."""
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


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """(test, step) -> the CLI's answer, ("dir", test) -> its folder, ("before", test) -> its copy's tree before:
    the sources made, validated and converted in one CLI process; each damaged copy of the conversion ("converted")
    reversed in a second."""
    base = tmp_path_factory.mktemp("rev")
    empty = base / "empty"
    steps = {("empty", "synth"): ["synth", empty / "src", *SMALL, "--defect", "empty-expert"],
             ("empty", "validate"): ["validate", empty / "src", "--quiet", "--workers", "1", "--report", empty / "report.json"],
             ("empty", "convert"): ["nvfp4-to-marlin", empty / "src", empty / "out", "-q", "--workers", "1"],
             ("converted", "synth"): ["synth", base / "src", *SMALL],
             ("converted", "convert"): ["nvfp4-to-marlin", base / "src", base / "conv", "-q", "--workers", "1"]}
    runs = dict(zip(steps, run_cli_batch(list(steps.values()), base)))
    for step in ("synth", "convert"):
        assert runs["converted", step].returncode == 0, runs["converted", step].stderr
    runs["dir", "empty"], runs["converted"] = empty, base / "conv"
    then = {}
    for test in ("manifest", *EDITS):
        d = runs["dir", test] = base / test
        ck = _copy(base / "conv", d / "ck")
        if test == "manifest":  # the record truncated, the manifest left as it was
            data = (ck / HEADERS).read_bytes()
            (ck / HEADERS).write_bytes(data[: len(data) // 2])
        else:
            _spoil_record(ck, test)
        runs["before", test] = tree_hashes(ck)
        then[test, "reverse"] = ["marlin-to-source", ck, d / "out", "-q"]
    runs.update(zip(then, run_cli_batch(list(then.values()), base)))
    return runs


def test_validate_on_an_empty_expert_reports_it_in_json(runs):
    d = runs["dir", "empty"]
    assert runs["empty", "synth"].returncode == 0, runs["empty", "synth"].stderr
    proc = runs["empty", "validate"]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads((d / "report.json").read_text())
    assert doc["summary"]["exit_code"] == 1
    ids = {f["check"] for f in doc["findings"]} if "findings" in doc else {
        c["id"] for c in doc["checks"] if c["status"] == "fail"}
    assert "structure.experts.empty" in ids, doc
    conv = runs["empty", "convert"]
    _clean(conv, 4, "convert.empty_expert")
    assert "layers.0.ffn.experts.0.w1.weight" in conv.stderr
    assert not (d / "out").exists() and not (d / "out.partial").exists()


def _copy(converted: Path, dst: Path) -> Path:
    shutil.copytree(converted, dst)
    return dst


def test_truncated_headers_json_is_a_manifest_mismatch(runs):
    proc = runs["manifest", "reverse"]
    _clean(proc, 4, "reverse.manifest_mismatch")
    assert "headers.json" in proc.stderr and not (runs["dir", "manifest"] / "out").exists()


@pytest.mark.parametrize("edit", EDITS)
def test_the_source_record_reader_refuses_even_when_the_manifest_matches(runs, edit):
    d = runs["dir", edit]
    proc = runs[edit, "reverse"]
    _clean(proc, 3, "reverse.bad_source_record")
    assert "headers.json" in proc.stderr
    assert sorted(p.name for p in d.iterdir()) == ["ck"], "nothing written, nothing escaped"
    assert tree_hashes(d / "ck") == runs["before", edit]


def test_marlin_to_source_onto_a_full_disk(tmp_path, runs):
    converted = runs["converted"]
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
