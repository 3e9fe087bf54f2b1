"""Faults during conversion: kill -9 at many points then --resume, a tampered staged shard, two runs
on one OUT, a full disk, and bad inputs. Each bad case exits with its class's code and leaves no OUT
(and no staging directory, except after kill -9, where it is what --resume continues).

Substitution: the refusals of bad inputs and flags (from test_bad_input_is_refused_before_anything_is_written on)
run their command lines in one CLI process, in order (run_cli_batch: `main(argv)` each, as the console script runs
it, its exit code, stdout and stderr), not one process each: a process start costs more than a refusal. The kills,
signals, locks and the full disk keep a process per command."""

from __future__ import annotations

import fcntl
import json
import os
import random
import resource
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.helpers.cli import CLI, run_cli, run_cli_batch, tree_hashes

FMT = "nvfp4-modelopt-dsv4"
ARGS = ("--target", "vllm", "--workers", "1", "--max-shard-size", "120KB", "-q")  # many small shards


@pytest.fixture(scope="module")
def reference(tmp_path_factory, synth_source):
    src = synth_source(FMT, experts=8, mtp=True)
    out = tmp_path_factory.mktemp("ref") / "out"
    run_cli("nvfp4-to-marlin", src, out, *ARGS)
    plan = json.loads(run_cli("nvfp4-to-marlin", src, "--dry-run", "--json", *ARGS[:-1]).stdout)
    return src, tree_hashes(out), plan


def _killed(src, out, step: int) -> subprocess.CompletedProcess:
    return run_cli("nvfp4-to-marlin", src, out, *ARGS, "--resume", env={"DSV4_CONVERT_KILL_AT": str(step)},
                   check=False)


def _partial(out: Path) -> Path:
    return out.with_name(out.name + ".partial")


def test_kill9_at_random_points_then_resume_gives_identical_output(tmp_path, reference):
    src, expected, plan = reference
    assert len(plan["shards"]) >= 10
    out = tmp_path / "out"
    rng = random.Random(1234)
    kills = 0
    for _ in range(22):  # a chain: every resumed run is itself killed at a random point
        proc = _killed(src, out, rng.randint(1, 40))
        if proc.returncode == 0:
            break
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        kills += 1
        assert not out.exists(), "an interrupted OUT must never look complete"
        assert _partial(out).is_dir()
    assert kills >= 20
    run_cli("nvfp4-to-marlin", src, out, *ARGS, "--resume")
    assert tree_hashes(out) == expected
    assert not _partial(out).exists()


@pytest.mark.parametrize("after_tensors", [1, 2, 3, 4, 5])
def test_kill9_while_finalizing_then_resume(tmp_path, reference, after_tensors):
    src, expected, plan = reference
    out = tmp_path / "out"
    proc = _killed(src, out, plan["tensors_out"] + after_tensors)  # past the last tensor: configs, index, manifest
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists()
    run_cli("nvfp4-to-marlin", src, out, *ARGS, "--resume")
    assert tree_hashes(out) == expected


def test_ctrl_c_removes_the_partial_output(tmp_path, reference):
    src, _, _ = reference
    out = tmp_path / "out"
    proc = run_cli("nvfp4-to-marlin", src, out, *ARGS, env={"DSV4_CONVERT_KILL_AT": "25:INT"}, check=False)
    assert proc.returncode == 130 and "convert.interrupted" in proc.stderr
    assert not out.exists() and not _partial(out).exists()


def test_resume_redoes_a_staged_shard_that_was_modified(tmp_path, reference):
    src, expected, _ = reference
    out = tmp_path / "out"
    assert _killed(src, out, 60).returncode == -signal.SIGKILL
    done = json.loads((_partial(out) / "dsv4-convert.progress.json").read_text())["shards"]
    assert done, "some shards finished before the kill"
    victim = _partial(out) / sorted(done)[0]
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF
    victim.write_bytes(bytes(data))
    run_cli("nvfp4-to-marlin", src, out, *ARGS, "--resume")
    assert tree_hashes(out) == expected


def test_interrupted_run_needs_resume_or_force(tmp_path, reference):
    src, expected, _ = reference
    out = tmp_path / "out"
    assert _killed(src, out, 30).returncode == -signal.SIGKILL
    proc = run_cli("nvfp4-to-marlin", src, out, *ARGS, check=False)
    assert proc.returncode == 5 and "output.interrupted_run" in proc.stderr and "--resume" in proc.stderr
    run_cli("nvfp4-to-marlin", src, out, *ARGS, "--force")
    assert tree_hashes(out) == expected


def test_second_run_on_the_same_out_is_refused_while_the_first_holds_the_lock(tmp_path, reference):
    src, _, _ = reference
    out = tmp_path / "out"
    _partial(out).mkdir()
    fd = os.open(_partial(out) / "dsv4-convert.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # what a running converter holds
    try:
        proc = run_cli("nvfp4-to-marlin", src, out, *ARGS, "--resume", check=False)
    finally:
        os.close(fd)
    assert proc.returncode == 5 and "output.locked" in proc.stderr
    assert _partial(out).exists(), "the refused run must not touch the other run's staging directory"


def test_existing_out_is_refused_without_force(tmp_path, reference):
    src, expected, _ = reference
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    proc = run_cli("nvfp4-to-marlin", src, out, *ARGS, check=False)
    assert proc.returncode == 5 and "output.exists" in proc.stderr
    assert (out / "keep.txt").read_text() == "mine"
    proc = run_cli("nvfp4-to-marlin", src, out, *ARGS, "--force", check=False)  # not ours: never replaced
    assert proc.returncode == 5 and "paths.not_our_output" in proc.stderr
    assert (out / "keep.txt").read_text() == "mine"
    (out / "keep.txt").unlink()
    run_cli("nvfp4-to-marlin", src, out, *ARGS, "--force")  # an empty OUT is
    assert tree_hashes(out) == expected


@pytest.fixture
def tiny_disk(tmp_path):
    """A 1 MiB tmpfs where the test can mount one (CI runs as root); else a 1 MiB file-size limit."""
    mnt = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        def limit():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        yield mnt, limit
        return
    try:
        yield mnt, None
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_disk_full_is_a_clear_error_and_cleans_up(tiny_disk, reference):
    src, _, _ = reference
    mnt, limit = tiny_disk
    before = tree_hashes(src)
    proc = subprocess.run([*CLI, "nvfp4-to-marlin", str(src), str(mnt / "out"), *ARGS], capture_output=True,
                          text=True, preexec_fn=limit)
    assert proc.returncode == 5, proc.stderr
    assert "output.disk_full" in proc.stderr and "free at least" in proc.stderr and "at least 0.0 " not in proc.stderr
    assert list(mnt.iterdir()) == [], "the staging directory is removed"
    assert tree_hashes(src) == before


BAD_INPUTS = [("truncated-shard", 3, "header.offsets_past_eof"), ("missing-shard", 3, "index.missing_shard"),
              ("missing-expert", 4, "convert.incomplete_experts")]
NAN_SCALES = [("nvfp4-modelopt-dsv4", "nvfp4-to-marlin", "nan-scale"), ("mxfp4-dsv4", "mxfp4-to-marlin", "e8m0-nan")]


@pytest.fixture(scope="module")
def refusals(tmp_path_factory, synth_source, reference) -> dict:
    """(test, case) -> the CLI's answer, ("out", test, case) -> its OUT: the bad inputs' and flags' command lines in
    one CLI process, in order."""
    work = tmp_path_factory.mktemp("refusals")
    src = reference[0]
    outs = {}

    def out(test, case=None, name="out"):
        return outs.setdefault(("out", test, case), work / f"{test}-{len(outs)}" / name)
    blocker = work / "a-file"
    blocker.write_text("not a directory")
    steps = {**{("bad-input", d): ["nvfp4-to-marlin", synth_source(FMT, experts=4, defects=(d,)), out("bad-input", d)]
                for d, _, _ in BAD_INPUTS},
             **{("nan", d): [cmd, synth_source(fmt, experts=4, defects=(d,)), out("nan", d)] for fmt, cmd, d in NAN_SCALES},
             ("wrong-command", None): ["mxfp4-to-marlin", synth_source("nvfp4-modelopt-hf", experts=4), out("wrong", name="o")],
             ("converted", "convert"): ["nvfp4-to-marlin", synth_source(FMT, experts=8, mtp=True), out("converted"), "-q"],
             ("converted", "again"): ["nvfp4-to-marlin", out("converted"), work / "again"],
             ("unwritable", None): ["nvfp4-to-marlin", src, blocker / "out"],
             ("usage", "w4a8"): ["mxfp4-to-marlin", src, out("usage", name="o"), "--w4a8", "--target", "sglang"],
             ("usage", "same"): ["nvfp4-to-marlin", src, src]}
    return {**dict(zip(steps, run_cli_batch(list(steps.values()), work))), **outs}


@pytest.mark.parametrize("defect,code,error_id", BAD_INPUTS)
def test_bad_input_is_refused_before_anything_is_written(refusals, defect, code, error_id):
    out = refusals["out", "bad-input", defect]
    proc = refusals["bad-input", defect]
    assert proc.returncode == code, proc.stderr
    assert error_id in proc.stderr and "fix:" in proc.stderr
    assert not out.exists() and not _partial(out).exists()


@pytest.mark.parametrize("fmt,command,defect", NAN_SCALES)
def test_nan_scales_are_refused_not_repacked(refusals, fmt, command, defect):
    out = refusals["out", "nan", defect]
    proc = refusals["nan", defect]
    assert proc.returncode == 4 and "convert.bad_values" in proc.stderr and "NaN" in proc.stderr
    assert "experts.1.w1" in proc.stderr and "validate" in proc.stderr
    assert not out.exists() and not _partial(out).exists()


def test_wrong_command_for_the_format_names_the_right_one(refusals):
    proc = refusals["wrong-command", None]
    assert proc.returncode == 4 and "convert.wrong_command" in proc.stderr and "nvfp4-to-marlin" in proc.stderr


def test_converted_input_is_refused(refusals):
    assert refusals["converted", "convert"].returncode == 0, refusals["converted", "convert"].stderr
    proc = refusals["converted", "again"]
    assert proc.returncode == 4 and "convert.already_marlin" in proc.stderr


def test_unwritable_out_location(refusals):
    proc = refusals["unwritable", None]
    assert proc.returncode == 5 and "output.not_writable" in proc.stderr


def test_usage_errors_exit_2(refusals):
    proc = refusals["usage", "w4a8"]
    assert proc.returncode == 2 and "W4A8" in proc.stderr
    proc = refusals["usage", "same"]
    assert proc.returncode == 2
