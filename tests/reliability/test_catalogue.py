"""Every entry of the corrupt-input catalogue (catalogue.py, docs/ERRORS.md) through the real CLI.

Each entry damages its own copy of a small synth checkpoint, then runs the converter, `inspect` and
`validate` on it. The converter and inspect must refuse it with the entry's stable error id, exit
code class, a message naming the file or tensor and a `fix:` line, and leave no OUT and no
OUT.partial; validate must report it as a finding (exit 1) or as unreadable input (exit 2); and no
command may touch the input. All commands run in one CLI process (cli_batch.py: `main(argv)` per
command, as the console script runs it) because a fresh interpreter per command costs seconds;
`test_batch_matches_a_real_process` checks that the batch and a real process agree.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.catalogue import CATALOGUE, CONFIG_FINDINGS, MX, NV, VALUE_FINDINGS, Entry
from tests.helpers.cli import run_cli, tree_hashes
from tests.helpers.corrupt import INDEX, copy_checkpoint

SMALL = {"layers": 1, "experts": 4, "shards": 2}
QUIET = ("-q", "--workers", "1")
BATCH = Path(__file__).parents[1] / "helpers" / "cli_batch.py"
BY_NAME = {e.name: e for e in CATALOGUE}


def _convert_cmd(fmt: str) -> str:
    return "nvfp4-to-marlin" if fmt.startswith("nvfp4") else "mxfp4-to-marlin"


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory, synth_source):
    """name -> {"root", "out", "before", "after", and one result per command}: all built, then one batch."""
    work = tmp_path_factory.mktemp("catalogue")
    cases: dict[str, dict] = {}
    commands: list[list[str]] = []

    def add(name: str, root: Path, fmt: str) -> None:
        out = work / f"{name}.out"
        cases[name] = {"root": root, "out": out, "before": tree_hashes(root), "at": len(commands)}
        commands.extend([[_convert_cmd(fmt), str(root), str(out), *QUIET], ["inspect", str(root)],
                         ["validate", str(root), "--quiet", "--workers", "1", "--gemm-experts", "1"]])

    for e in CATALOGUE:
        root = copy_checkpoint(synth_source(e.fmt, **SMALL), work / e.name)
        e.build(root)
        add(e.name, root, e.fmt)
    for name, fmt, build, _ in VALUE_FINDINGS + CONFIG_FINDINGS:
        root = copy_checkpoint(synth_source(fmt, **SMALL), work / name)
        build(root)
        add(name, root, fmt)
    # already converted: convert a clean copy, then give the result to the converter again
    converted = work / "converted"
    commands.append(["nvfp4-to-marlin", str(synth_source(NV, **SMALL)), str(converted), *QUIET])
    add("already-converted", converted, NV)

    listing = work / "commands.json"
    listing.write_text(json.dumps(commands))
    proc = subprocess.run([sys.executable, str(BATCH), str(listing)], capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout)
    for case in cases.values():
        case["convert"], case["inspect"], case["validate"] = results[case["at"]:case["at"] + 3]
        case["after"] = tree_hashes(case["root"])
    cases["already-converted"]["setup"] = results[cases["already-converted"]["at"] - 1]
    # (its "before" was taken before the setup command wrote it; test_read_only_input covers it)
    return cases


def _no_crash(result: dict) -> None:
    assert result["crash"] is None, f"{result['argv'][:1]} crashed:\n{result['crash']}"


def _assert_refused(result: dict, error_id: str, code: int, names: str) -> None:
    _no_crash(result)
    err = result["stderr"]
    assert result["code"] == code, f"exit {result['code']}, expected {code}:\n{err}"
    assert f"error[{error_id}]" in err, err
    assert names in err, f"the message does not name {names!r}:\n{err}"
    assert "\n  fix: " in err, f"no fix: line:\n{err}"


def _assert_nothing_written(case: dict) -> None:
    out = case["out"]
    assert not out.exists(), f"{out} exists after a refused conversion"
    assert not out.with_name(out.name + ".partial").exists(), "the staging directory was left behind"


@pytest.mark.parametrize("entry", CATALOGUE, ids=lambda e: e.name)
def test_converter_refuses(outcomes, entry: Entry):
    case = outcomes[entry.name]
    _assert_refused(case["convert"], entry.error_id, entry.code, entry.names)
    _assert_nothing_written(case)
    assert case["after"] == case["before"], "the input changed"


@pytest.mark.parametrize("entry", CATALOGUE, ids=lambda e: e.name)
def test_inspect(outcomes, entry: Entry):
    result = outcomes[entry.name]["inspect"]
    if entry.inspect_ok:  # a value or completeness defect: headers alone look fine
        _no_crash(result)
        assert result["code"] == 0, result["stderr"]
    else:
        _assert_refused(result, entry.error_id, entry.code, entry.names)


@pytest.mark.parametrize("entry", CATALOGUE, ids=lambda e: e.name)
def test_validate(outcomes, entry: Entry):
    result = outcomes[entry.name]["validate"]
    _no_crash(result)
    if entry.validate is None:  # unreadable input: the reader's error, exit 2 (issue 5)
        assert result["code"] == 2, result["stdout"] + result["stderr"]
        assert f"error[{entry.error_id}]" in result["stderr"] and "\n  fix: " in result["stderr"]
    else:  # a finding, exit 1
        assert result["code"] == 1, result["stdout"] + result["stderr"]
        assert f"error[{entry.validate}]" in result["stdout"] and "\n  fix: " in result["stdout"]


@pytest.mark.parametrize("name,check", [(n, c) for n, _, _, c in VALUE_FINDINGS])
def test_bad_scale_values_are_validator_findings_not_crashes(outcomes, name, check):
    case = outcomes[name]
    for command in ("convert", "inspect", "validate"):
        _no_crash(case[command])
    assert case["inspect"]["code"] == 0
    v = case["validate"]
    assert v["code"] == 1 and f"error[{check}] {'layers.0.ffn.experts.1'}" in v["stdout"], v["stdout"]
    assert "\n  fix: " in v["stdout"]
    convert = case["convert"]
    # The converter repacks scale bytes as the engine would at load time (validate is where they are
    # reported); refusing them would be a content error. Either way, no half-written output.
    assert convert["code"] in (0, 4), convert["stderr"]
    out = case["out"]
    if convert["code"] == 0:
        assert (out / INDEX).is_file()
    else:
        _assert_nothing_written(case)
    assert not out.with_name(out.name + ".partial").exists()
    assert case["after"] == case["before"], "the input changed"


@pytest.mark.parametrize("name,check", [(n, c) for n, _, _, c in CONFIG_FINDINGS])
def test_quant_config_contradictions_are_validator_findings(outcomes, name, check):
    case = outcomes[name]
    for command in ("convert", "inspect", "validate"):
        _no_crash(case[command])
    v = case["validate"]
    assert v["code"] == 1 and f"error[{check}]" in v["stdout"] and "\n  fix: " in v["stdout"], v["stdout"]
    assert f"error[{check}]" not in outcomes["nan-e4m3-scale"]["validate"]["stdout"], "fires on a sound config"
    convert = case["convert"]
    assert convert["code"] in (0, 4), convert["stderr"]
    if convert["code"] == 0:
        assert (case["out"] / INDEX).is_file()
    else:
        _assert_nothing_written(case)
    assert not case["out"].with_name(case["out"].name + ".partial").exists()
    assert case["after"] == case["before"], "the input changed"


def test_already_converted_input_is_refused(outcomes):
    case = outcomes["already-converted"]
    assert case["setup"]["code"] == 0, case["setup"]["stderr"]
    _assert_refused(case["convert"], "convert.already_marlin", 4, "config.json")
    _assert_nothing_written(case)
    assert case["inspect"]["code"] == 0 and "marlin" in case["inspect"]["stdout"]
    assert case["validate"]["code"] == 0, case["validate"]["stdout"]


def test_catalogue_covers_the_issue(outcomes):
    """At least 15 distinct corruptions, every exit code class that bad input can give."""
    assert len(CATALOGUE) + len(VALUE_FINDINGS) + len(CONFIG_FINDINGS) + 1 >= 15
    assert {e.code for e in CATALOGUE} == {3, 4}
    assert len({e.build for e in CATALOGUE}) == len(CATALOGUE)


def test_batch_matches_a_real_process(outcomes):
    """The batch runner gives what the console script gives: exit code and stderr."""
    case = outcomes["header-not-utf8"]
    proc = run_cli(*case["convert"]["argv"], check=False)
    assert proc.returncode == case["convert"]["code"] == 3
    assert proc.stderr.strip() == case["convert"]["stderr"].strip()
    assert not case["out"].exists()


@pytest.mark.parametrize("fmt", [MX])
def test_mxfp4_header_corruption_is_refused_by_its_command(tmp_path, synth_source, fmt):
    """The same header checks guard mxfp4-to-marlin (one real process end to end)."""
    root = copy_checkpoint(synth_source(fmt, **SMALL), tmp_path / "mx")
    BY_NAME["header-length-past-eof"].build(root)
    before = tree_hashes(root)
    out = tmp_path / "out"
    proc = run_cli("mxfp4-to-marlin", root, out, *QUIET, check=False)
    assert proc.returncode == 3 and "error[header.length_past_eof]" in proc.stderr and "fix:" in proc.stderr
    assert not out.exists() and not (tmp_path / "out.partial").exists()
    assert tree_hashes(root) == before
