"""Issue 12 finding 5 and issue 10 "machine-readable on every path" / "smaller": one CLI vocabulary.
Every reporting command takes --json (exactly one JSON object on stdout on every exit path, human
text on stderr), --report FILE (the same object in FILE), -q/--quiet and, where an engine matters,
--target. Real CLI command lines on real synthetic checkpoints.

Substitutions: the command lines run in ONE CLI process, in order (run_cli_batch: `main(argv)` each, as the console
script runs it, its exit code, stdout and stderr): a process start costs more than these commands. Those about
the process itself keep one each: the progress bar's terminal test, and the Hub lookups, which read HF_* at start
and a working directory of their own. A report file that cannot be written is /dev/full (full disk) or a path under a file
(not a directory); a missing Hub repo is looked up with HF_HUB_OFFLINE=1 or with the Hub unreachable
(HF_ENDPOINT points at a closed local port), which is what a machine without network sees."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from dsv4_convert.synth import write_synthetic_checkpoint
from tests.helpers.cli import CLI, run_cli, run_cli_batch, tree_hashes

FAST = ("--workers", "1")
VALIDATE = ("--workers", "1", "--gemm-experts", "1")
LINES: dict = {}  # test -> its command lines, made by a function of (its own directory, the shared checkpoints)


def _lines(test: str):
    def register(make):
        LINES[test] = make
        return make
    return register


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    """(test, label) -> the CLI's answer, for every test's command lines (LINES), all in one CLI process after the
    conversion they share; ("dir", test) -> that test's directory; ("src"|"marlin"|"src-before", None) -> the
    shared checkpoints, and the source's tree before any command ran."""
    d = tmp_path_factory.mktemp("vocab")
    src = write_synthetic_checkpoint(d / "src", format="nvfp4-modelopt-dsv4", layers=1, experts=4)
    c = {"src": src, "marlin": d / "marlin"}
    steps, dirs = {("setup", "convert"): ["nvfp4-to-marlin", src, c["marlin"], "-q", *FAST]}, {}
    for test, make in LINES.items():
        dirs["dir", test] = d / test
        dirs["dir", test].mkdir()
        steps.update({(test, label): argv for label, argv in make(dirs["dir", test], c).items()})
    before = tree_hashes(src)
    answers = dict(zip(steps, run_cli_batch(list(steps.values()), d)))
    assert answers["setup", "convert"].returncode == 0, answers["setup", "convert"].stderr
    return {**answers, **dirs, ("src", None): src, ("marlin", None): c["marlin"], ("src-before", None): before}


def _shared(run) -> dict:
    return {"src": run["src", None], "marlin": run["marlin", None]}


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


@_lines("json")
def _json_lines(tmp, c):
    return {name: [*args, "--json", "--report", tmp / f"{name}.json", "-q"] for name, (args, _) in _commands(c, tmp).items()}


def test_json_is_one_object_and_report_file_holds_the_same(run):
    for name, (_, code) in _commands(_shared(run), run["dir", "json"]).items():
        proc = run["json", name]
        doc = _one_object(proc)
        assert code is None or proc.returncode == code, (name, proc.returncode, proc.stderr)
        assert json.loads((run["dir", "json"] / f"{name}.json").read_text()) == doc, name
        if proc.returncode not in (0, 1):
            assert doc["exit_code"] == proc.returncode and set(doc["error"]) == {"id", "message", "file",
                                                                                  "tensor", "fix"}


MISSING = [("nvfp4-to-marlin", 3, "source.not_found"), ("marlin-to-source", 3, "source.not_found"),
           ("validate", 2, "source.not_found"), ("plan", 2, "source.not_found"), ("inspect", 3, "source.not_found")]


@_lines("missing")
def _missing_lines(tmp, c):
    return {name: [name, "./no/such/dir/ck", *([tmp / f"{name}-out"] if name in ("nvfp4-to-marlin", "marlin-to-source")
                                              else []), "--json", "--report", tmp / f"{name}.json"]
            for name, _, _ in MISSING}


@pytest.mark.parametrize("name,code,error_id", MISSING)
def test_a_missing_input_is_one_error_object_with_its_exit_class(run, name, code, error_id):
    proc = run["missing", name]
    doc = _one_object(proc)
    assert proc.returncode == code == doc["exit_code"] and doc["error"]["id"] == error_id, proc.stderr
    assert json.loads((run["dir", "missing"] / f"{name}.json").read_text()) == doc
    assert f"error[{error_id}]" in proc.stderr


@_lines("usage")
def _usage_lines(tmp, c):
    return {"tp0": ["validate", c["src"], "--tp", "0", "--json", "--report", tmp / "r.json"]}


def test_a_click_usage_error_is_an_object_too(run):
    proc = run["usage", "tp0"]
    doc = _one_object(proc)
    assert proc.returncode == 2 == doc["exit_code"] and doc["error"]["id"] == "usage.flags"
    assert json.loads((run["dir", "usage"] / "r.json").read_text()) == doc


UNWRITABLE = ["/dev/full", "FILE/report.json"]


def _unwritable_runs(c):
    """(args, expected exit code) of each reporting command whose report cannot be written."""
    return ((["validate", c["src"], *VALIDATE], 2), (["inspect", c["src"]], 5), (["plan", c["src"], "--gpus", "1"], 2))


def _bad_report(bad: str, tmp: Path) -> str:
    return bad.replace("FILE", str(tmp / "FILE"))


@_lines("unwritable")
def _unwritable_lines(tmp, c):
    (tmp / "FILE").write_text("not a directory")
    return {(bad, i): [*args, "--json", "--report", _bad_report(bad, tmp)]
            for bad in UNWRITABLE for i, (args, _) in enumerate(_unwritable_runs(c))}


@pytest.mark.parametrize("bad", UNWRITABLE)
def test_a_report_that_cannot_be_written_is_the_answer_on_stdout(run, bad):
    tmp = run["dir", "unwritable"]
    for i, (args, code) in enumerate(_unwritable_runs(_shared(run))):
        proc = run["unwritable", (bad, i)]
        doc = _one_object(proc)
        assert proc.returncode == code == doc["exit_code"], (args, proc.stderr)
        assert doc["error"]["id"] == "report.not_writable" and doc["error"]["file"] == _bad_report(bad, tmp)


@_lines("exit-code")
def _exit_code_lines(tmp, c):
    return {i: [*args, "--json"] for i, args in enumerate((
        ["nvfp4-to-marlin", c["src"], tmp / "out", "-q", *FAST], ["inspect", c["src"]],
        ["validate", c["src"], *VALIDATE], ["marlin-to-source", c["marlin"], tmp / "back", "-q"],
        ["synth", tmp / "s", "--layers", "1", "--experts", "4"],
        ["nvfp4-to-marlin", c["src"], "--dry-run"]))}


def test_every_json_answer_carries_its_exit_code(run):
    """#29 item 8: a success carries `exit_code` as an error object and validate's report do."""
    for i in range(6):
        proc = run["exit-code", i]
        assert proc.returncode == 0 == _one_object(proc)["exit_code"], (proc.args, proc.stderr)


@_lines("stderr")
def _stderr_lines(tmp, c):
    return {"json": ["validate", c["src"], *VALIDATE, "--json"], "plain": ["validate", c["src"], *VALIDATE]}


def test_json_sends_the_human_text_to_stderr(run):
    proc = run["stderr", "json"]
    assert proc.returncode == 0, proc.stderr
    assert _one_object(proc)["summary"]["exit_code"] == 0 and "OK" in proc.stderr + proc.stdout.upper()
    plain = run["stderr", "plain"]
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.strip() and not plain.stdout.lstrip().startswith("{")


@_lines("quiet")
def _quiet_lines(tmp, c):
    return {**{name: [*args, "-q"] for name, (args, _) in _commands(c, tmp).items()},
            "silent": ["nvfp4-to-marlin", c["src"], tmp / "q", "-q", *FAST]}


def test_quiet_is_accepted_everywhere_and_silences_status_lines(run):
    for name, (_, code) in _commands(_shared(run), run["dir", "quiet"]).items():
        proc = run["quiet", name]
        assert code is None or proc.returncode == code, (name, proc.stderr)
        assert "no such option" not in proc.stderr
    proc = run["quiet", "silent"]
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and proc.stderr == ""


@_lines("engine")
def _engine_lines(tmp, c):
    return {"new": ["plan", c["src"], "--gpus", "1", "--target", "vllm", "--json"],
            "old": ["plan", c["src"], "--gpus", "1", "--engine", "vllm", "--json"],
            "clash": ["plan", c["src"], "--engine", "vllm", "--target", "sglang", "--json"]}


def test_plan_takes_target_and_engine_is_a_deprecated_alias(run):
    new, old, clash = run["engine", "new"], run["engine", "old"], run["engine", "clash"]
    assert new.returncode == 0 == old.returncode, new.stderr + old.stderr
    new = _one_object(new)
    assert "deprecated" in old.stderr and "--target" in old.stderr
    assert _one_object(old) == new and new["engine"] == "vllm"
    assert clash.returncode == 2 and _one_object(clash)["error"]["id"] == "usage.flags"


HELPED = ["nvfp4-to-marlin", "mxfp4-to-marlin", "marlin-to-source", "validate", "plan"]


@_lines("help")
def _help_lines(tmp, c):
    return {cmd: [cmd, "--help"] for cmd in HELPED}


@pytest.mark.parametrize("cmd", HELPED)
def test_help_lists_the_exit_codes(run, cmd):
    assert run["help", cmd].returncode == 0, run["help", cmd].stderr
    text = run["help", cmd].stdout
    assert "Exit codes" in text and "130" in text and "--report" in text and "--json" in text


def test_progress_bar_only_on_a_terminal_unless_asked(run, tmp_path):
    src = run["src", None]
    quiet = run_cli("nvfp4-to-marlin", src, tmp_path / "a", *FAST)  # stderr is a pipe here
    assert "converting" not in quiet.stderr
    forced = run_cli("nvfp4-to-marlin", src, tmp_path / "b", *FAST, "--progress")
    assert "converting" in forced.stderr
    validated = run_cli("validate", src, *VALIDATE, "--progress")
    assert "%" in validated.stderr or "it/s" in validated.stderr or "/s" in validated.stderr


@_lines("overhead")
def _overhead_lines(tmp, c):
    return {"plan": ["plan", c["src"], "--gpus", "1", "--gpu-mem-gib", "1", "--json"]}


def test_plan_names_the_fixed_overhead_when_it_is_the_cause(run):
    proc = run["overhead", "plan"]
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


SHARD_KINDS = ["directory", "fifo"]


@_lines("not-a-file")
def _not_a_file_lines(tmp, c):
    lines = {}
    for kind in SHARD_KINDS:
        src = write_synthetic_checkpoint(tmp / kind, format="nvfp4-modelopt-dsv4", layers=1, experts=4)
        shard = sorted(src.glob("*.safetensors"))[0]
        shard.unlink()
        shard.mkdir() if kind == "directory" else os.mkfifo(shard)
        lines[kind] = ["inspect", src, "--json"]
    return lines


@pytest.mark.parametrize("kind", SHARD_KINDS)
def test_a_shard_that_is_not_a_file_is_not_called_missing(run, kind):
    shard = sorted((run["dir", "not-a-file"] / kind).glob("*.safetensors"))[0]
    proc = run["not-a-file", kind]
    doc = _one_object(proc)
    assert proc.returncode == 3 and doc["error"]["id"] == "index.shard_not_a_file", proc.stderr
    assert "does not exist" not in proc.stderr and shard.name in proc.stderr


@_lines("trailing")
def _trailing_lines(tmp, c):
    src = write_synthetic_checkpoint(tmp / "src", format="nvfp4-modelopt-dsv4", layers=1, experts=4)
    with open(sorted(src.glob("*.safetensors"))[0], "ab") as f:
        f.write(b"\0" * 64)
    return {"validate": ["validate", src, *VALIDATE, "--json"]}


def test_trailing_bytes_are_one_finding_not_two(run):
    proc = run["trailing", "validate"]
    doc = _one_object(proc)
    errors = [f["check"] for f in doc["findings"] if f["severity"] == "error"]
    assert proc.returncode == 1 and errors == ["structure.shard.header"], errors


@_lines("inside")
def _inside_lines(tmp, c):
    src, out = c["src"], tmp / "out"
    return {i: [*args, "--json", "--report", report] for i, (args, report) in enumerate((
        (["validate", src, *VALIDATE], src / "report.json"),
        (["validate", src, *VALIDATE], src / "config.json"),  # would overwrite an input file
        (["nvfp4-to-marlin", src, out], src / "r.json"),
        (["inspect", src], src / "sub" / ".." / "r.json")))}


def test_a_report_inside_a_checkpoint_is_refused_before_any_work(run):
    for i in range(4):
        proc = run["inside", i]
        doc = _one_object(proc)
        assert proc.returncode == 2 == doc["exit_code"], (proc.args, proc.stderr)
        assert doc["error"]["id"] == "report.inside_checkpoint", doc
    assert tree_hashes(run["src", None]) == run["src-before", None] and not (run["dir", "inside"] / "out").exists()


@_lines("missing-dir")
def _missing_dir_lines(tmp, c):
    return {"convert": ["nvfp4-to-marlin", c["src"], tmp / "out", "--json", "--report", tmp / "no" / "r.json"]}


def test_a_report_in_a_missing_directory_is_refused_before_the_conversion(run):
    proc, out = run["missing-dir", "convert"], run["dir", "missing-dir"] / "out"
    doc = _one_object(proc)
    assert doc["error"]["id"] == "report.not_writable" and proc.returncode == 5 and not out.exists()
    assert not Path(f"{out}.partial").exists()
