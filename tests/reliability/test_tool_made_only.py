"""Issue 28, data loss (items 1-4), reserved names (item 5), the side-file messages (items 12, 15, 16):
the tool opens for writing, truncates or deletes only what it made in this run or what its own
record proves it made; never through a link; the names it reserves never come from the input.
Real synth checkpoints, the real CLI in subprocesses (several command lines share one process
through tests/helpers/cli_batch.py where the cases are independent).

Substitutions: an interrupted run is made with the converter's kill hook DSV4_CONVERT_KILL_AT
(SIGKILL at a chosen step); a run paused inside publish uses DSV4_CONVERT_RUN_AT (tests/hooks), which
runs the second, competing command at that step and waits for it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from dsv4_convert.synth import write_synthetic_checkpoint
from tests.helpers.cli import CLI, run_cli, tree_hashes

pytestmark = pytest.mark.slow  # every test here starts the CLI

ARGS = ("--workers", "1", "-q", "--max-shard-size", "60KB")
BATCH = Path(__file__).parents[1] / "helpers" / "cli_batch.py"
LOCK, PROGRESS, MANIFEST = "dsv4-convert.lock", "dsv4-convert.progress.json", "dsv4-convert.manifest.json"


@pytest.fixture
def src(tmp_path) -> Path:
    return write_synthetic_checkpoint(tmp_path / "src", format="nvfp4-modelopt-dsv4", layers=1, experts=4)


def _batch(tmp_path: Path, commands: list[list]) -> list[dict]:
    listing = tmp_path / "commands.json"
    listing.write_text(json.dumps([[str(a) for a in c] for c in commands]))
    proc = subprocess.run([sys.executable, str(BATCH), str(listing)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout)
    for r in results:
        assert r["crash"] is None and "Traceback" not in r["stderr"], r
    return results


def _refused(result: dict, code: int, error_id: str) -> None:
    assert result["code"] == code and f"error[{error_id}]" in result["stderr"], result


def _snapshot(*paths: Path) -> dict:
    return {p: (tree_hashes(p) if p.is_dir() else p.read_bytes()) for p in paths}


# -- item 1: the staging lock never follows a link -------------------------------------------------
def test_a_hard_linked_or_symlinked_lock_is_refused_and_never_written(src, tmp_path):
    out = tmp_path / "out"
    partial = Path(f"{out}.partial")
    partial.mkdir()
    mine = tmp_path / "home-notes.txt"
    mine.write_text("a user's file")
    os.link(src / "config.json", partial / LOCK)
    (partial / PROGRESS).write_text(json.dumps({"fingerprint": "x", "shards": {}}))
    before = _snapshot(src, mine)
    commands = [["nvfp4-to-marlin", src, out, *ARGS, *flag] for flag in ([], ["--resume"], ["--force"])]
    conv = tmp_path / "conv"
    results = _batch(tmp_path, [*commands, ["nvfp4-to-marlin", src, conv, *ARGS]])
    for r in results[:3]:
        _refused(r, 5, "paths.partial_not_ours")
        assert "hard link" in r["stderr"]
    assert results[3]["code"] == 0
    # marlin-to-source --force onto a staging whose lock is a hard link to a file in the user's home
    back = tmp_path / "back"
    Path(f"{back}.partial").mkdir()
    os.link(mine, Path(f"{back}.partial") / LOCK)
    (Path(f"{back}.partial") / PROGRESS).write_text(json.dumps({"fingerprint": "x", "shards": {}}))
    # and a symlinked lock: named for what it is, not "too many levels of symbolic links"
    (partial / LOCK).unlink()
    (partial / LOCK).symlink_to(src / "config.json")
    results = _batch(tmp_path, [["marlin-to-source", conv, back, "--force", "-q"],
                                ["nvfp4-to-marlin", src, out, *ARGS, "--force"]])
    for r in results:
        _refused(r, 5, "paths.partial_not_ours")
    assert "link" in results[1]["stderr"] and "symbolic links" not in results[1]["stderr"]
    assert _snapshot(src, mine) == before
    assert not out.exists() and not back.exists()


# -- item 2: OUT.replaced-* is deleted only when it is exactly what publish made --------------------
def test_force_keeps_a_users_replaced_named_folder(src, tmp_path):
    out = tmp_path / "out"
    run_cli("nvfp4-to-marlin", src, out, *ARGS)
    backup = tmp_path / "out.replaced-backup"
    shutil.copytree(out, backup / "out")
    (backup / "NOTES.txt").write_text("mine")
    flat = tmp_path / "out.replaced-flat"  # an older version's form (OUT renamed), plus a user file
    shutil.copytree(out, flat)
    (flat / "NOTES.txt").write_text("mine too")
    before = _snapshot(backup, flat)
    run_cli("nvfp4-to-marlin", src, out, *ARGS, "--force")
    assert _snapshot(backup, flat) == before
    (out / "my-empty-folder").mkdir()  # a folder its record does not list is the user's, even empty
    proc = run_cli("nvfp4-to-marlin", src, out, *ARGS, "--force", check=False)
    assert proc.returncode == 5 and "error[paths.unlisted_files]" in proc.stderr, proc.stderr
    assert (out / "my-empty-folder").is_dir()


# -- item 3: --resume adopts X.partial only with the tool's own record and nothing else -------------
def test_resume_never_adopts_a_partial_with_user_files(src, tmp_path):
    out = tmp_path / "out"
    run_cli("nvfp4-to-marlin", src, out, *ARGS)
    partial = Path(f"{out}.partial")
    out.rename(partial)  # a published output under that name: looks "killed inside publish"
    (partial / "thesis.tex").write_text("years of work")
    (partial / "drafts").mkdir()
    (partial / "drafts" / "a.txt").write_text("draft")
    (partial / "empty-folder").mkdir()
    killed = tmp_path / "k"  # a real interrupted run (lock + progress record) plus a user's file
    proc = run_cli("nvfp4-to-marlin", src, killed, *ARGS, env={"DSV4_CONVERT_KILL_AT": "40"}, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    kpartial = Path(f"{killed}.partial")
    (kpartial / "NOTES.txt").write_text("mine")
    before = _snapshot(partial, kpartial / "NOTES.txt")
    results = _batch(tmp_path, [["nvfp4-to-marlin", src, out, *ARGS, "--resume"],
                                ["nvfp4-to-marlin", src, killed, *ARGS, "--resume"],
                                ["nvfp4-to-marlin", src, killed, *ARGS, "--force"]])
    for r in results:
        _refused(r, 5, "paths.partial_not_ours")
    assert _snapshot(partial, kpartial / "NOTES.txt") == before
    (kpartial / "NOTES.txt").unlink()  # without it, the interrupted run is the tool's: resumed
    run_cli("nvfp4-to-marlin", src, killed, *ARGS, "--resume")
    assert run_cli("validate", killed, "-q", "--against", src, check=False).returncode == 0


# -- item 4: an input spelled as a file protects its folder, whether or not the file exists ---------
def test_report_into_the_folder_of_a_missing_input_file_is_refused(src, tmp_path):
    before = _snapshot(src)
    assert not (src / "model.safetensors").exists()  # sharded
    results = _batch(tmp_path, [
        ["nvfp4-to-marlin", src / "model.safetensors", tmp_path / "o", "-q", "--report", src / "config.json"],
        ["validate", src / "model.safetensors", "-q", f"--report={src / 'config.json'}"],
        ["nvfp4-to-marlin", src / "model.safetensors", tmp_path / "o", "-q", "--report", src / "new.json"],
    ])
    for r in results:
        _refused(r, 2, "report.inside_checkpoint")
    assert _snapshot(src) == before


# -- item 5: names the tool reserves never come from the input -------------------------------------
RESERVED = [LOCK, PROGRESS, MANIFEST, "SERVING.md", "dsv4-convert.marker.json", "dsv4-convert-source",
            "model.safetensors.index.json.tmp", "config.json.tmp", "x.lost.safetensors", ".run-0123"]


def test_reserved_names_in_the_input_are_refused_before_anything_is_written(tmp_path):
    commands, roots = [], []
    for i, name in enumerate(RESERVED):
        root = write_synthetic_checkpoint(tmp_path / f"in{i}", format="nvfp4-modelopt-dsv4", layers=1, experts=4)
        if name == "dsv4-convert-source":
            (root / name).mkdir()
            (root / name / "headers.json").write_text("{}")
        elif name.endswith(".safetensors"):  # a real one: the reader checks every .safetensors it copies
            save_file({"t": torch.zeros(2)}, root / name)
        else:
            (root / name).write_text("the user's file")
        roots.append((root, tree_hashes(root)))
        commands.append(["nvfp4-to-marlin", root, tmp_path / f"out{i}", *ARGS])
    # a shard of the index named like the tool's per-shard sidecar
    shard_root = write_synthetic_checkpoint(tmp_path / "shard", format="nvfp4-modelopt-dsv4", layers=1, experts=4)
    index = json.loads((shard_root / "model.safetensors.index.json").read_text())
    first = sorted(set(index["weight_map"].values()))[0]
    (shard_root / first).rename(shard_root / "a.lost.safetensors")
    index["weight_map"] = {k: ("a.lost.safetensors" if v == first else v) for k, v in index["weight_map"].items()}
    (shard_root / "model.safetensors.index.json").write_text(json.dumps(index))
    roots.append((shard_root, tree_hashes(shard_root)))
    commands.append(["nvfp4-to-marlin", shard_root, tmp_path / "out-shard", *ARGS, "--json"])
    commands.append(["nvfp4-to-marlin", shard_root, "--dry-run", "-q"])  # a plan refuses it too
    results = _batch(tmp_path, commands)
    for r, (root, _) in zip(results, roots):
        _refused(r, 3, "input.reserved_name")
    _refused(results[-1], 3, "input.reserved_name")
    assert json.loads(results[-2]["stdout"])["error"]["file"].endswith("a.lost.safetensors")
    for root, hashes in roots:
        assert tree_hashes(root) == hashes
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("out")], "nothing was written"


def test_marlin_to_source_refuses_a_reserved_name_in_its_input_but_reads_its_records(src, tmp_path):
    conv = tmp_path / "conv"
    run_cli("nvfp4-to-marlin", src, conv, *ARGS)
    run_cli("marlin-to-source", conv, tmp_path / "back", "-q")  # its manifest, SERVING.md, source record: fine
    (conv / "dsv4-convert.marker.json").write_text("{}")
    proc = run_cli("marlin-to-source", conv, tmp_path / "back2", "-q", check=False)
    assert proc.returncode == 3 and "error[input.reserved_name]" in proc.stderr, proc.stderr
    assert not (tmp_path / "back2").exists()


# -- items 12, 16: --report names and places ----------------------------------------------------------
def test_report_with_a_name_at_name_max_and_into_a_live_staging(src, tmp_path):
    long_name = "é" * 122 + "x.json"  # 250 bytes of UTF-8: a valid name; a derived temporary must still fit
    assert len(long_name.encode()) <= 255
    out = tmp_path / "out"
    proc = run_cli("nvfp4-to-marlin", src, out, *ARGS, env={"DSV4_CONVERT_KILL_AT": "40"}, check=False)
    assert proc.returncode == -signal.SIGKILL
    partial = Path(f"{out}.partial")
    before = _snapshot(partial)
    results = _batch(tmp_path, [["validate", src, "-q", "--report", tmp_path / long_name],
                                ["validate", src, "-q", "--report", partial / "r.json"],
                                ["inspect", src, "--report", partial / "sub" / "r.json"]])
    assert results[0]["code"] == 0 and json.loads((tmp_path / long_name).read_text())
    _refused(results[1], 2, "report.inside_checkpoint")
    _refused(results[2], 2, "report.inside_checkpoint")
    assert _snapshot(partial) == before
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


# -- item 15: a run inside publish is never taken over ---------------------------------------------
def test_force_during_another_runs_publish_waits_its_turn(src, tmp_path):
    """Run A pauses right after it removed its lock file, before its rename (the step publish
    offers); run B (--force, same OUT) starts there. B must not adopt A's staging directory (A still
    holds the directory's lock): B is refused as locked, A publishes a complete output."""
    out = tmp_path / "out"
    run_cli("nvfp4-to-marlin", src, out, *ARGS)  # B's --force has an output of ours to replace
    b_log, state = tmp_path / "b.json", tmp_path / "state"
    partial = f"{out}.partial"
    b = " ".join(["env -u DSV4_CONVERT_RUN_AT timeout 300",  # B runs no hook itself (else: a chain of Bs)
                  *map(str, CLI), "nvfp4-to-marlin", str(src), str(out), *ARGS, "--force", "--json"])
    where = f"test -d {partial} && ! test -e {partial}/{LOCK} && touch {state}; "  # A is where the test says
    proc = run_cli("nvfp4-to-marlin", src, out, *ARGS, "--force", "--json",
                   env={"DSV4_CONVERT_RUN_AT": f"{_publish_step(src)}:{where}{b} > {b_log} || true"}, check=False)
    assert proc.returncode == 0, proc.stderr
    assert state.exists(), "the competing run started inside A's publish"
    doc = json.loads(b_log.read_text())
    assert doc["exit_code"] == 5 and doc["error"]["id"] == "output.locked", doc
    assert run_cli("validate", out, "-q", "--against", src, check=False).returncode == 0
    assert not Path(f"{out}.partial").exists()


def _publish_step(src: Path) -> int:
    """Publish's first step point: one step per tensor written, finalize's five, then this one."""
    plan = json.loads(run_cli("nvfp4-to-marlin", src, "--dry-run", "--json", *ARGS).stdout)
    return plan["tensors_out"] + 5 + 1
