"""Issue 12 finding 5 and issue 10 "machine-readable on every path" / "smaller": one CLI vocabulary.
Every reporting command takes --json (exactly one JSON object on stdout on every exit path, human
text on stderr), --report FILE (the same object in FILE), -q/--quiet and, where an engine matters,
--target. Real CLI runs in subprocesses on real synthetic checkpoints.

Substitutions: a report file that cannot be written is /dev/full (full disk) or a path under a file
(not a directory); a missing Hub repo is looked up with HF_HUB_OFFLINE=1 or with the Hub unreachable
(HF_ENDPOINT points at a closed local port), which is what a machine without network sees."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from dsv4_convert.synth import write_synthetic_checkpoint
from tests.helpers.cli import CLI, run_cli, tree_hashes

FAST = ("--workers", "1")
VALIDATE = ("--workers", "1", "--gemm-experts", "1")


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    d = tmp_path_factory.mktemp("vocab")
    src = write_synthetic_checkpoint(d / "src", format="nvfp4-modelopt-dsv4", layers=1, experts=4)
    out = d / "marlin"
    run_cli("nvfp4-to-marlin", src, out, "-q", *FAST)
    return {"src": src, "marlin": out, "dir": d}


def _one_object(proc) -> dict:
    """stdout is exactly one JSON object (json.loads refuses anything after it)."""
    assert "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)
    assert isinstance(doc, dict)
    return doc


def _commands(c, tmp: Path) -> dict[str, tuple[list, int]]:
    """Each reporting command on a good input, with its expected exit code."""
    return {
        "nvfp4-to-marlin": (["nvfp4-to-marlin", c["src"], tmp / "o1", *FAST], 0),
        "mxfp4-to-marlin": (["mxfp4-to-marlin", c["src"], tmp / "o2", "--dry-run", *FAST], 4),  # wrong command
        "marlin-to-source": (["marlin-to-source", c["marlin"], tmp / "back", *FAST], 0),
        "validate": (["validate", c["src"], *VALIDATE], 0),
        "plan": (["plan", c["src"], "--gpus", "1", "--gpu-mem-gib", "96"], 0),
        "inspect": (["inspect", c["src"]], 0),
        "synth": (["synth", tmp / "s", "--layers", "1", "--experts", "2"], 0),
        "doctor": (["doctor", c["marlin"]], None),  # 0 or 1: this machine may have no GPU
    }


def test_json_is_one_object_and_report_file_holds_the_same(ckpts, tmp_path):
    for name, (args, code) in _commands(ckpts, tmp_path).items():
        report = tmp_path / f"{name}.json"
        proc = run_cli(*args, "--json", "--report", report, "-q", check=False)
        doc = _one_object(proc)
        assert code is None or proc.returncode == code, (name, proc.returncode, proc.stderr)
        assert json.loads(report.read_text()) == doc, name
        if proc.returncode not in (0, 1):
            assert doc["exit_code"] == proc.returncode and set(doc["error"]) == {"id", "message", "file",
                                                                                  "tensor", "fix"}


@pytest.mark.parametrize("name,code,error_id", [
    ("nvfp4-to-marlin", 3, "source.not_found"), ("marlin-to-source", 3, "source.not_found"),
    ("validate", 2, "source.not_found"), ("plan", 2, "source.not_found"), ("inspect", 3, "source.not_found"),
])
def test_a_missing_input_is_one_error_object_with_its_exit_class(tmp_path, name, code, error_id):
    args = [name, "./no/such/dir/ck"] + ([tmp_path / "out"] if name in ("nvfp4-to-marlin", "marlin-to-source")
                                         else [])
    report = tmp_path / "r.json"
    proc = run_cli(*args, "--json", "--report", report, check=False)
    doc = _one_object(proc)
    assert proc.returncode == code == doc["exit_code"] and doc["error"]["id"] == error_id, proc.stderr
    assert json.loads(report.read_text()) == doc
    assert f"error[{error_id}]" in proc.stderr


def test_a_click_usage_error_is_an_object_too(ckpts, tmp_path):
    proc = run_cli("validate", ckpts["src"], "--tp", "0", "--json", "--report", tmp_path / "r.json", check=False)
    doc = _one_object(proc)
    assert proc.returncode == 2 == doc["exit_code"] and doc["error"]["id"] == "usage.flags"
    assert json.loads((tmp_path / "r.json").read_text()) == doc


@pytest.mark.parametrize("bad", ["/dev/full", "FILE/report.json"])
def test_a_report_that_cannot_be_written_is_the_answer_on_stdout(ckpts, tmp_path, bad):
    (tmp_path / "FILE").write_text("not a directory")
    bad = bad.replace("FILE", str(tmp_path / "FILE"))
    for args, code in ((["validate", ckpts["src"], *VALIDATE], 2), (["inspect", ckpts["src"]], 5),
                       (["plan", ckpts["src"], "--gpus", "1"], 2)):
        proc = run_cli(*args, "--json", "--report", bad, check=False)
        doc = _one_object(proc)
        assert proc.returncode == code == doc["exit_code"], (args, proc.stderr)
        assert doc["error"]["id"] == "report.not_writable" and doc["error"]["file"] == bad


def test_every_json_answer_carries_its_exit_code(ckpts, tmp_path):
    """#29 item 8: a success carries `exit_code` as an error object and validate's report do."""
    for args in (["nvfp4-to-marlin", ckpts["src"], tmp_path / "out", "-q", *FAST], ["inspect", ckpts["src"]],
                 ["validate", ckpts["src"], *VALIDATE], ["marlin-to-source", ckpts["marlin"], tmp_path / "back", "-q"],
                 ["synth", tmp_path / "s", "--layers", "1", "--experts", "4"],
                 ["nvfp4-to-marlin", ckpts["src"], "--dry-run"]):
        proc = run_cli(*args, "--json", check=False)
        assert proc.returncode == 0 == _one_object(proc)["exit_code"], (args, proc.stderr)


def test_json_sends_the_human_text_to_stderr(ckpts):
    proc = run_cli("validate", ckpts["src"], *VALIDATE, "--json")
    assert _one_object(proc)["summary"]["exit_code"] == 0 and "OK" in proc.stderr + proc.stdout.upper()
    plain = run_cli("validate", ckpts["src"], *VALIDATE)
    assert plain.stdout.strip() and not plain.stdout.lstrip().startswith("{")


def test_quiet_is_accepted_everywhere_and_silences_status_lines(ckpts, tmp_path):
    for name, (args, code) in _commands(ckpts, tmp_path).items():
        proc = run_cli(*args, "-q", check=False)
        assert code is None or proc.returncode == code, (name, proc.stderr)
        assert "no such option" not in proc.stderr
    proc = run_cli("nvfp4-to-marlin", ckpts["src"], tmp_path / "q", "-q", *FAST)
    assert proc.stdout == "" and proc.stderr == ""


def test_plan_takes_target_and_engine_is_a_deprecated_alias(ckpts):
    new = _one_object(run_cli("plan", ckpts["src"], "--gpus", "1", "--target", "vllm", "--json"))
    old = run_cli("plan", ckpts["src"], "--gpus", "1", "--engine", "vllm", "--json")
    assert "deprecated" in old.stderr and "--target" in old.stderr
    assert _one_object(old) == new and new["engine"] == "vllm"
    clash = run_cli("plan", ckpts["src"], "--engine", "vllm", "--target", "sglang", "--json", check=False)
    assert clash.returncode == 2 and _one_object(clash)["error"]["id"] == "usage.flags"


@pytest.mark.parametrize("cmd", ["nvfp4-to-marlin", "mxfp4-to-marlin", "marlin-to-source", "validate", "plan"])
def test_help_lists_the_exit_codes(cmd):
    text = run_cli(cmd, "--help").stdout
    assert "Exit codes" in text and "130" in text and "--report" in text and "--json" in text


def test_progress_bar_only_on_a_terminal_unless_asked(ckpts, tmp_path):
    quiet = run_cli("nvfp4-to-marlin", ckpts["src"], tmp_path / "a", *FAST)  # stderr is a pipe here
    assert "converting" not in quiet.stderr
    forced = run_cli("nvfp4-to-marlin", ckpts["src"], tmp_path / "b", *FAST, "--progress")
    assert "converting" in forced.stderr
    validated = run_cli("validate", ckpts["src"], *VALIDATE, "--progress")
    assert "%" in validated.stderr or "it/s" in validated.stderr or "/s" in validated.stderr


def test_plan_names_the_fixed_overhead_when_it_is_the_cause(ckpts):
    proc = run_cli("plan", ckpts["src"], "--gpus", "1", "--gpu-mem-gib", "1", "--json", check=False)
    doc = _one_object(proc)
    assert proc.returncode == 1
    reasons = [r for c in doc["candidates"] for r in c["reasons"]]
    assert any("fixed runtime overhead" in r and "is the cause" in r for r in reasons), reasons


def test_a_relative_path_that_does_not_exist_is_not_blamed_on_hf_hub_offline(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf"), HF_HUB_ETAG_TIMEOUT="2",
               HF_HUB_DOWNLOAD_TIMEOUT="2")
    online = subprocess.run([*CLI, "inspect", "models/ck", "--json"], capture_output=True, text=True, env=env,
                            cwd=tmp_path, timeout=120)
    doc = _one_object(online)
    assert online.returncode == 3 and "HF_HUB_OFFLINE" not in online.stderr + online.stdout, online.stderr
    assert "no directory models/ck" in doc["error"]["message"]
    offline = subprocess.run([*CLI, "inspect", "models/ck"], capture_output=True, text=True, cwd=tmp_path,
                             env=dict(env, HF_HUB_OFFLINE="1"), timeout=120)
    assert offline.returncode == 3 and "unset HF_HUB_OFFLINE" in offline.stderr


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_shard_that_is_not_a_file_is_not_called_missing(tmp_path, kind):
    src = write_synthetic_checkpoint(tmp_path / "src", format="nvfp4-modelopt-dsv4", layers=1, experts=4)
    shard = sorted(src.glob("*.safetensors"))[0]
    shard.unlink()
    shard.mkdir() if kind == "directory" else os.mkfifo(shard)
    proc = run_cli("inspect", src, "--json", check=False)
    doc = _one_object(proc)
    assert proc.returncode == 3 and doc["error"]["id"] == "index.shard_not_a_file", proc.stderr
    assert "does not exist" not in proc.stderr and shard.name in proc.stderr


def test_trailing_bytes_are_one_finding_not_two(tmp_path):
    src = write_synthetic_checkpoint(tmp_path / "src", format="nvfp4-modelopt-dsv4", layers=1, experts=4)
    shard = sorted(src.glob("*.safetensors"))[0]
    with open(shard, "ab") as f:
        f.write(b"\0" * 64)
    proc = run_cli("validate", src, *VALIDATE, "--json", check=False)
    doc = _one_object(proc)
    errors = [f["check"] for f in doc["findings"] if f["severity"] == "error"]
    assert proc.returncode == 1 and errors == ["structure.shard.header"], errors


def test_a_report_inside_a_checkpoint_is_refused_before_any_work(ckpts, tmp_path):
    src = Path(ckpts["src"])
    before = tree_hashes(src)
    out = tmp_path / "out"
    for args, report in ((["validate", src, *VALIDATE], src / "report.json"),
                         (["validate", src, *VALIDATE], src / "config.json"),  # would overwrite an input file
                         (["nvfp4-to-marlin", src, out], src / "r.json"),
                         (["inspect", src], src / "sub" / ".." / "r.json")):
        proc = run_cli(*args, "--json", "--report", report, check=False)
        doc = _one_object(proc)
        assert proc.returncode == 2 == doc["exit_code"], (args, proc.stderr)
        assert doc["error"]["id"] == "report.inside_checkpoint", doc
    assert tree_hashes(src) == before and not out.exists()


def test_a_report_in_a_missing_directory_is_refused_before_the_conversion(ckpts, tmp_path):
    out = tmp_path / "out"
    proc = run_cli("nvfp4-to-marlin", ckpts["src"], out, "--json", "--report", tmp_path / "no" / "r.json", check=False)
    doc = _one_object(proc)
    assert doc["error"]["id"] == "report.not_writable" and proc.returncode == 5 and not out.exists()
    assert not Path(f"{out}.partial").exists()
