"""Issue 23 items 3, 4 and 11: what the tool reads back from its own records, and the directories
`--force` may replace. A name read from a record (the staging progress record, the manifest, the
source record) is only ever a plain name of this tool's making; `--force` replaces only what a
record shows this tool wrote, never a directory another run holds locked; a kill inside publish
leaves a state the next run recovers or explains. Real synth checkpoints, the real CLI in
subprocesses.

Substitutions: the interrupted runs are made with the converter's kill hook DSV4_CONVERT_KILL_AT
(SIGKILL at a chosen step, what `kill -9` does); a live run holding its lock is stood in for by this
test process taking the same flock on the lock file the tool uses, which is what a running
converter holds (the tool cannot tell the two apart)."""

from __future__ import annotations

import fcntl
import json
import os
import signal
from pathlib import Path

import pytest

from dsv4_convert.synth import write_synthetic_checkpoint
from tests.helpers.cli import run_cli, tree_hashes

ARGS = ("--workers", "1", "-q", "--max-shard-size", "60KB")
PROGRESS = "dsv4-convert.progress.json"
LOCK = "dsv4-convert.lock"


@pytest.fixture
def src(tmp_path) -> Path:
    return write_synthetic_checkpoint(tmp_path / "src", format="nvfp4-modelopt-dsv4", layers=1, experts=4)


def _staged(partial: Path) -> dict:
    """The staging directory's files but its lock (whose content is the pid of the last run to take it)."""
    return {k: v for k, v in tree_hashes(partial).items() if k != LOCK}


def _killed_run(src: Path, out: Path) -> Path:
    proc = run_cli("nvfp4-to-marlin", src, out, *ARGS, env={"DSV4_CONVERT_KILL_AT": "40"}, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    partial = Path(f"{out}.partial")
    assert json.loads((partial / PROGRESS).read_text())["shards"], "the kill left finished shards"
    return partial


def test_resume_never_follows_a_name_out_of_the_staging_directory(src, tmp_path):
    out = tmp_path / "out"
    partial = _killed_run(src, out)
    state = json.loads((partial / PROGRESS).read_text())
    first = next(iter(state["shards"].values()))
    victim = sorted(src.glob("*.safetensors"))[0]
    bystander = tmp_path / "bystander.safetensors"
    bystander.write_bytes(b"not ours")
    for name in (f"../src/{victim.name}", "../src/config.json", str(bystander), "", ".", "a/b.safetensors",
                 "config.json"):
        edited = dict(state, shards={**state["shards"], name: first})
        (partial / PROGRESS).write_text(json.dumps(edited))
        staged = _staged(partial)
        before = tree_hashes(src)
        proc = run_cli("nvfp4-to-marlin", src, out, *ARGS, "--resume", "--json", check=False)
        doc = json.loads(proc.stdout)
        assert proc.returncode == 5 and doc["error"]["id"] == "paths.partial_bad_record", (name, proc.stderr)
        assert tree_hashes(src) == before and bystander.read_bytes() == b"not ours"
        assert _staged(partial) == staged, "a refused staging directory is left as it was"
    (partial / PROGRESS).write_text(json.dumps(state))  # the real record: the run resumes and completes
    run_cli("nvfp4-to-marlin", src, out, *ARGS, "--resume")
    assert (out / "dsv4-convert.manifest.json").is_file()


def test_force_never_replaces_a_staging_directory_whose_lock_is_held(src, tmp_path):
    """A live run's OUT.partial (its lock held) is neither replaced by `--force` onto OUT nor onto
    OUT.partial itself; the refusal names the lock."""
    out = tmp_path / "out"
    partial = _killed_run(src, out)
    staged = _staged(partial)
    fd = os.open(partial / LOCK, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        for target in (out, partial):
            proc = run_cli("nvfp4-to-marlin", src, target, *ARGS, "--force", "--json", check=False)
            doc = json.loads(proc.stdout)
            assert proc.returncode == 5 and doc["error"]["id"] == "output.locked", (target, proc.stderr)
            assert _staged(partial) == staged
        assert not out.exists() and not Path(f"{partial}.partial").exists()
    finally:
        os.close(fd)


def test_force_replaces_a_synth_output_only_while_it_holds_nothing_else(tmp_path):
    out = tmp_path / "synth"
    run_cli("synth", out, "--layers", "1", "--experts", "4", "-q")
    (out / "notes.txt").write_text("the user's own notes")
    proc = run_cli("synth", out, "--layers", "1", "--experts", "4", "--seed", "1", "--force", "--json", check=False)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 5 and doc["error"]["id"] == "paths.unlisted_files", proc.stderr
    assert doc["error"]["file"].endswith("notes.txt") and (out / "notes.txt").read_text() == "the user's own notes"
    (out / "notes.txt").unlink()
    run_cli("synth", out, "--layers", "1", "--experts", "4", "--seed", "1", "--force", "-q")  # all its own: replaced
    assert json.loads((out / "synth.json").read_text())["seed"] == 1


def test_force_onto_a_staging_directory_that_holds_a_copied_synth_record_is_refused(tmp_path):
    """A conversion of a synth checkpoint copies synth.json into OUT.partial; that record does not make
    the staging directory a synth output that `--force` may replace (the live-run case is above)."""
    src = write_synthetic_checkpoint(tmp_path / "src", format="nvfp4-modelopt-dsv4", layers=1, experts=4)
    out = tmp_path / "x"
    partial = _killed_run(src, out)
    (partial / "synth.json").write_bytes((src / "synth.json").read_bytes())  # as finalize copies it
    staged = _staged(partial)
    proc = run_cli("synth", partial, "--layers", "1", "--experts", "4", "--force", "--json", check=False)
    assert proc.returncode == 5 and json.loads(proc.stdout)["error"]["id"] == "paths.unlisted_files", proc.stderr
    assert _staged(partial) == staged


def _leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name != out.name and p.name.startswith(out.name))


@pytest.mark.parametrize("force", [False, True])
def test_every_kill_inside_finalize_and_publish_is_recovered(src, tmp_path, force):
    """Kill the run at each step past the last tensor (finalize, then publish's renames), with and
    without an OUT being replaced; the next run finishes the job, with OUT identical to an
    uninterrupted run's and nothing left beside it."""
    reference = tmp_path / "ref" / "out"  # same basename: SERVING.md names OUT
    run_cli("nvfp4-to-marlin", src, reference, *ARGS)
    expected = tree_hashes(reference)
    tensors = json.loads(run_cli("nvfp4-to-marlin", src, "--dry-run", "--json", *ARGS).stdout)["tensors_out"]
    flag = ("--force",) if force else ("--resume",)
    states, step = 0, tensors
    while True:
        step += 1
        out = tmp_path / f"k{step}" / "out"
        if force:
            run_cli("nvfp4-to-marlin", src, out, *ARGS)  # the OUT a --force run replaces
        proc = run_cli("nvfp4-to-marlin", src, out, *ARGS, *flag, env={"DSV4_CONVERT_KILL_AT": str(step)},
                       check=False)
        if proc.returncode == 0:
            break
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        states += 1
        left = _leftovers(out)
        if any(".replaced-" in name for name in left):  # the kill fell between publish's two renames
            plain = run_cli("nvfp4-to-marlin", src, out, *ARGS, "--resume", "--json", check=False)
            doc = json.loads(plain.stdout)
            assert plain.returncode == 5 and doc["error"]["id"] == "output.replaced_leftover", plain.stderr
            assert "--force" in doc["error"]["fix"]
        if out.exists() and not left:  # killed after the last rename: OUT is complete, nothing to recover
            assert tree_hashes(out) == expected
            continue
        done = run_cli("nvfp4-to-marlin", src, out, *ARGS, *flag, check=False)
        assert done.returncode == 0, (step, left, done.stderr)
        assert tree_hashes(out) == expected and _leftovers(out) == [], (step, left)
    assert states >= 6 + force  # finalize's steps, then one (two with an OUT to replace) inside publish


def test_a_leftover_replaced_directory_never_breaks_force(src, tmp_path):
    """An `OUT.replaced-1` left behind (a container's pid 1 was killed in publish) does not collide with
    the next --force run's holder, and --force removes it once the new OUT is in place."""
    out = tmp_path / "out"
    run_cli("nvfp4-to-marlin", src, out, *ARGS)
    expected = tree_hashes(out)
    leftover = tmp_path / "out.replaced-1"
    run_cli("nvfp4-to-marlin", src, leftover / "out", *ARGS)
    proc = run_cli("nvfp4-to-marlin", src, out, *ARGS, "--force", check=False)
    assert proc.returncode == 0, proc.stderr
    assert tree_hashes(out) == expected and _leftovers(out) == []
    foreign = tmp_path / "out.replaced-2"  # not this tool's: never touched, never a reason to refuse
    foreign.mkdir()
    (foreign / "mine.txt").write_text("user data")
    run_cli("nvfp4-to-marlin", src, out, *ARGS, "--force")
    assert (foreign / "mine.txt").read_text() == "user data"
