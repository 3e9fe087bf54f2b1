"""Issue 23 items 1, 2, 5 and 13: files written beside the checkpoints (`--report`, `validate --plot`,
DSV4_CONVERT_PROFILE) never land on or inside an input or OUT, whatever the spelling, and are never
written in place; the small JSON files are never read from a FIFO or a device. Real synth
checkpoints, the real CLI; every refusal leaves the inputs byte for byte as they were.

Substitutions: the Hugging Face cache is a folder built here in the hub's own layout (blobs,
snapshots of symlinks, refs/main) and read with HF_HUB_OFFLINE=1, which is what a machine with a
downloaded repo and no network sees. A hang would show as the subprocess timeout (a safety net
only: each case waits for the process's exit, never for a time). The refusals of the report's spellings and of
the small files' FIFOs and devices run their command lines in one CLI process per environment (run_cli_batch:
`main(argv)` each, as the console script runs it, its exit code, stdout and stderr; the Hub's runs with its HF_*
variables, which huggingface_hub reads at import), not one process each: a process start costs more than a
refusal; what they must not touch is hashed before the batch and compared after it. The profile directory (read
at start) and the other cases keep a process each."""

from __future__ import annotations

import hashlib
import json
import os
import pstats
import shutil
from pathlib import Path

import pytest

from dsv4_convert.synth import write_synthetic_checkpoint
from tests.helpers.cli import CLI, run_cli, run_cli_batch, tree_hashes

pytestmark = pytest.mark.slow  # every test here starts the CLI

VALIDATE = ("--workers", "1", "--gemm-experts", "1")
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def ck(tmp_path_factory):
    d = tmp_path_factory.mktemp("side")
    src = write_synthetic_checkpoint(d / "src", format="nvfp4-modelopt-dsv4", layers=1, experts=4)
    one = write_synthetic_checkpoint(d / "one", format="nvfp4-modelopt-dsv4", layers=1, experts=4, shards=1)
    (one / "model.safetensors.index.json").unlink()  # the one-file form: model.safetensors, no index
    (one / "model-00001-of-00001.safetensors").rename(one / "model.safetensors")
    marlin = d / "marlin"
    run_cli("nvfp4-to-marlin", src, marlin, "-q", "--workers", "1")
    hub = _hub_cache(d / "hf", "org/tiny", one)
    return {"dir": d, "src": src, "one": one, "marlin": marlin, "hub": hub}


def _hub_cache(hf_home: Path, repo: str, files: Path) -> dict:
    """The hub's cache layout: each file a blob named by its hash, the snapshot a folder of symlinks."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    base = hf_home / "hub" / ("models--" + repo.replace("/", "--"))
    snap = base / "snapshots" / commit
    (base / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in sorted(files.iterdir()):
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copyfile(f, base / "blobs" / digest)
        (snap / f.name).symlink_to(Path("..", "..", "blobs", digest))
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text(commit)
    env = {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hf_home / "hub")}
    return {"repo": repo, "base": base, "snap": snap, "env": env,
            "blob": (snap / "config.json").resolve()}


def _one_object(proc) -> dict:
    assert "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


def _state(p: Path):
    return tree_hashes(p) if p.is_dir() else p.read_bytes()


def _refusals(steps: dict, work: Path, env=None) -> dict:
    """key -> (argv, error id, exit code, protected paths): each run with --json in one CLI process; key -> (its
    answer, the protected paths' state before the batch)."""
    before = {key: {p: _state(p) for p in protect} for key, (_, _, _, protect) in steps.items()}
    answers = run_cli_batch([[*argv, "--json"] for argv, _, _, _ in steps.values()], work, env=env)
    return {key: (proc, before[key]) for key, proc in zip(steps, answers)}


def _check(steps: dict, answers: dict, key) -> dict:
    """The refusal of `key` as planned, its protected paths as they were (the test's _refused, read from a batch)."""
    argv, error_id, code, _ = steps[key]
    proc, before = answers[key]
    doc = _one_object(proc)
    assert (proc.returncode, doc["exit_code"], doc["error"]["id"]) == (code, code, error_id), (argv, proc.stderr)
    for p, h in before.items():
        assert _state(p) == h, f"{p} was modified"
    return doc


def _refused(args, error_id: str, code: int, *protect: Path, env=None) -> dict:
    before = {p: tree_hashes(p) if p.is_dir() else p.read_bytes() for p in protect}
    proc = run_cli(*args, "--json", env=env, check=False)
    doc = _one_object(proc)
    assert (proc.returncode, doc["exit_code"], doc["error"]["id"]) == (code, code, error_id), (args, proc.stderr)
    for p, h in before.items():
        assert (tree_hashes(p) if p.is_dir() else p.read_bytes()) == h, f"{p} was modified"
    return doc


def _spellings(ck) -> tuple[dict, dict]:
    """The report's spellings that reach an input: key -> (argv, error id, exit code, protected), the default
    environment's and the Hub's (HF_*) apart."""
    src, one, marlin, hub, d = ck["src"], ck["one"], ck["marlin"], ck["hub"], ck["dir"] / "spellings"
    d.mkdir()
    shard = sorted(src.glob("*.safetensors"))[0]
    hard = d / "hard-link-of-a-shard.json"
    os.link(shard, hard)
    inside = "report.inside_checkpoint"
    plain = {
        # the `=` forms, which argv matching missed
        "equals": (["validate", marlin, f"--against={src}", f"--report={src}/config.json", *VALIDATE], inside, 2, (src,)),
        # IN given as its model.safetensors: the checkpoint is its folder
        "one-inspect": (["inspect", one / "model.safetensors", "--report", one / "config.json"], inside, 2, (one,)),
        "one-convert": (["nvfp4-to-marlin", one / "model.safetensors", d / "o", "--report", one / "config.json"],
                        inside, 2, (one,)),
        # a snapshot of symlinks: the snapshot's name for the blob, and the blob
        "snapshot-name": (["inspect", hub["snap"], "--report", hub["snap"] / "config.json"], inside, 2, (hub["base"],)),
        "snapshot-blob": (["inspect", hub["snap"], "--report", hub["blob"]], inside, 2, (hub["base"],)),
        # a hard link outside IN to an input shard: same inode, refused (it used to be truncated in place)
        "hard-link": (["inspect", src, "--report", hard], inside, 2, (src, hard)),
        # OUT (or its staging directory) is no place for the report either
        "staging": (["nvfp4-to-marlin", src, d / "o2", "--report", d / "o2.partial" / "r.json"], inside, 2, (src,))}
    hub_steps = {  # a Hub repo id: the blob; and the error path, where click refuses the command line
        "repo": (["inspect", hub["repo"], "--report", hub["blob"]], inside, 2, (hub["base"],)),
        "repo-bad-flag": (["inspect", hub["repo"], "--report", hub["blob"], "--no-such-flag"], inside, 2, (hub["base"],))}
    return plain, hub_steps


SMALL_FILES = [("config.json", "fifo", "config.not_json"), ("config.json", "/dev/zero", "config.not_json"),
               ("model.safetensors.index.json", "/dev/urandom", "index.not_json")]


def _small_files(ck) -> dict:
    """Each small file replaced by a FIFO or a device link: key -> (argv, error id, exit code, protected)."""
    steps = {}
    for i, (name, make, error_id) in enumerate(SMALL_FILES):
        d = ck["dir"] / f"small-{i}"
        src = d / "src"
        shutil.copytree(ck["src"], src)
        (src / name).unlink()
        if make == "fifo":
            os.mkfifo(src / name)
        else:
            (src / name).symlink_to(make)
        for command in (["inspect", src], ["nvfp4-to-marlin", src, d / "out"]):
            steps[i, command[0]] = (command, error_id, 3, (ck["src"],))
    return steps


@pytest.fixture(scope="module")
def batched(ck) -> dict:
    """The spellings' and the small files' refusals: name -> (steps, answers), one CLI process per environment."""
    plain, hub_steps = _spellings(ck)
    small = _small_files(ck)
    work = ck["dir"]
    return {"spellings": (plain, _refusals(plain, work)),
            "hub": (hub_steps, _refusals(hub_steps, work, env=ck["hub"]["env"])),
            "small": (small, _refusals(small, work))}


def test_a_report_never_reaches_an_input_through_any_spelling(ck, batched):
    for group in ("spellings", "hub"):
        steps, answers = batched[group]
        for key in steps:
            _check(steps, answers, key)
    assert not (ck["dir"] / "spellings" / "o").exists()


def test_a_report_replaces_its_name_and_never_writes_through_it(ck, tmp_path):
    """A report path that shares its inode with a user's file (outside every input) gets a new file:
    the other name keeps its bytes."""
    keep = tmp_path / "keep.txt"
    keep.write_text("the user's own file\n")
    report = tmp_path / "r.json"
    os.link(keep, report)
    proc = run_cli("inspect", ck["src"], "-q", "--report", report, check=False)
    assert proc.returncode == 0, proc.stderr
    assert keep.read_text() == "the user's own file\n"
    assert json.loads(report.read_text())["format"] == "nvfp4-modelopt-dsv4"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt", "r.json"]  # no temporary file left


def test_a_report_at_a_fifo_is_refused_without_blocking(ck, tmp_path):
    fifo = tmp_path / "r.json"
    os.mkfifo(fifo)
    doc = _refused(["inspect", ck["src"], "--report", fifo], "report.not_writable", 5, ck["src"])
    assert "regular file" in doc["error"]["message"]


@pytest.mark.parametrize("i", range(len(SMALL_FILES)))
def test_small_files_are_never_read_from_a_fifo_or_a_device(ck, batched, i):
    name = SMALL_FILES[i][0]
    steps, answers = batched["small"]
    for command in ("inspect", "nvfp4-to-marlin"):
        doc = _check(steps, answers, (i, command))
        assert doc["error"]["file"].endswith(name)
    assert not (ck["dir"] / f"small-{i}" / "out").exists()


def test_validate_plot_follows_the_same_rule(ck, tmp_path):
    pytest.importorskip("matplotlib", reason="the plot extra (dsv4-convert[plot]) is not installed")
    src, marlin = ck["src"], ck["marlin"]
    shard = sorted(src.glob("*.safetensors"))[0]
    link = tmp_path / "heat.png"
    link.symlink_to(shard)
    inside = "plot.inside_checkpoint"
    _refused(["validate", marlin, "--plot", marlin / "heat.png", *VALIDATE], inside, 2, marlin)
    _refused(["validate", marlin, f"--against={src}", f"--plot={link}", *VALIDATE], inside, 2, src, marlin)
    doc = _refused(["validate", marlin, "--plot", tmp_path / "missing" / "p.png", *VALIDATE], "plot.not_writable",
                   2, marlin)
    assert doc["error"]["file"].endswith("p.png")
    # a name matplotlib would not know how to write: the plot is a PNG whatever the suffix
    odd = tmp_path / "p.json"
    proc = run_cli("validate", marlin, "--plot", odd, "--json", *VALIDATE, check=False)
    assert proc.returncode == 0 and _one_object(proc)["summary"], proc.stderr
    assert odd.read_bytes().startswith(PNG)


def test_the_profile_directory_is_never_inside_an_input(ck, tmp_path):
    src = ck["src"]
    out = tmp_path / "out"
    env = {"DSV4_CONVERT_PROFILE": str(src / "prof")}
    _refused(["nvfp4-to-marlin", src, out, "--workers", "1"], "profile.inside_checkpoint", 2, src, env=env)
    assert not out.exists() and not Path(f"{out}.partial").exists()
    prof = tmp_path / "prof"
    run_cli("nvfp4-to-marlin", src, out, "-q", "--workers", "1", env={"DSV4_CONVERT_PROFILE": str(prof)})
    assert json.loads((prof / "driver.json").read_text())[0][0] == "start"
    stats = sorted(prof.glob("*.prof"))
    assert stats and pstats.Stats(str(stats[0])).total_calls > 0


def test_help_and_version_need_no_guard(tmp_path):
    """--help with a --report at an input still prints help (nothing is written)."""
    import subprocess
    proc = subprocess.run([*CLI, "inspect", "--help", "--report", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 0 and "--report FILE" in proc.stdout
