"""Issue 23 item 10 (issue 14 of the attack): index entries in subfolders are refused before any work
(they used to be flattened into one folder, and marlin-to-source then called the tool's own record
damaged), and the downloader's bookkeeping in IN/.cache/huggingface/ (not copied) may change while a
run reads IN. Real synth checkpoints, the real CLI in subprocesses.

Substitutions: "appears during a run" is made deterministic with the converter's kill hook
(DSV4_CONVERT_KILL_AT, tests/hooks): the lock file appears between a killed run and its --resume,
which compares the same input stamp as the check at publish."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from dsv4_convert.synth import write_synthetic_checkpoint
from tests.helpers.cli import run_cli, tree_hashes

ARGS = ("--workers", "1", "-q", "--max-shard-size", "60KB")
INDEX = "model.safetensors.index.json"


@pytest.fixture
def src(tmp_path) -> Path:
    return write_synthetic_checkpoint(tmp_path / "src", format="nvfp4-modelopt-dsv4", layers=1, experts=4)


@pytest.mark.parametrize("layout", ["one subfolder", "one name in two folders"])
def test_shards_in_subfolders_are_refused_before_any_work(src, tmp_path, layout):
    index = json.loads((src / INDEX).read_text())
    shards = sorted(set(index["weight_map"].values()))
    moves = {shards[0]: f"a/{shards[0]}"} if layout == "one subfolder" else \
        {shards[0]: f"a/{shards[0]}", shards[1]: f"b/{shards[0]}"}
    for old, new in moves.items():
        (src / new).parent.mkdir(exist_ok=True)
        shutil.move(src / old, src / new)
    index["weight_map"] = {k: moves.get(v, v) for k, v in index["weight_map"].items()}
    (src / INDEX).write_text(json.dumps(index))
    before = tree_hashes(src)
    out = tmp_path / "out"
    for args in (["nvfp4-to-marlin", src, out], ["inspect", src]):
        proc = run_cli(*args, "--json", check=False)
        assert "Traceback" not in proc.stderr
        doc = json.loads(proc.stdout)
        assert proc.returncode == 3 and doc["error"]["id"] == "index.nested_shard", proc.stderr
        assert "a/" in doc["error"]["message"]
    assert tree_hashes(src) == before and not out.exists() and not Path(f"{out}.partial").exists()


def test_the_downloaders_lock_files_may_change_during_a_run(src, tmp_path):
    out = tmp_path / "out"
    proc = run_cli("nvfp4-to-marlin", src, out, *ARGS, env={"DSV4_CONVERT_KILL_AT": "40"}, check=False)
    assert proc.returncode == -signal.SIGKILL
    meta = src / ".cache" / "huggingface" / "download"
    meta.mkdir(parents=True)
    (meta / "model-00001-of-00003.safetensors.lock").write_text("")
    run_cli("nvfp4-to-marlin", src, out, *ARGS, "--resume")
    assert not (out / ".cache").exists(), "the downloader's bookkeeping is not part of the checkpoint"
    (src / "generation_config.json").write_text("{}")  # a real input file still counts
    proc = run_cli("nvfp4-to-marlin", src, tmp_path / "o2", *ARGS, env={"DSV4_CONVERT_KILL_AT": "40"}, check=False)
    (src / "generation_config.json").write_text('{"changed": true}')
    proc = run_cli("nvfp4-to-marlin", src, tmp_path / "o2", *ARGS, "--resume", check=False)
    assert proc.returncode == 5 and "output.resume_mismatch" in proc.stderr


def _flip_data_byte(shard: Path) -> None:
    """Change one byte of tensor data in place: same size, same header."""
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 0xFF
    with open(shard, "r+b") as f:
        f.write(raw)


def test_an_edit_with_size_and_mtime_restored_is_still_refused_by_resume(src, tmp_path):
    """`touch -r` sets the mtime back; the ctime it cannot: --resume refuses, nothing mixed."""
    out = tmp_path / "out"
    proc = run_cli("nvfp4-to-marlin", src, out, *ARGS, env={"DSV4_CONVERT_KILL_AT": "40"}, check=False)
    assert proc.returncode == -signal.SIGKILL
    shard = sorted(src.glob("*.safetensors"))[0]
    st = shard.stat()
    _flip_data_byte(shard)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (shard.stat().st_size, shard.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    proc = run_cli("nvfp4-to-marlin", src, out, *ARGS, "--resume", "--json", check=False)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 5 and doc["error"]["id"] == "output.resume_mismatch", proc.stderr
    assert shard.name in doc["error"]["message"] and not out.exists()


def test_a_shard_replaced_during_the_run_with_size_and_mtime_kept_is_refused(src, tmp_path):
    """At a known step of the run, another file with the same size and mtime is renamed over a shard
    (what a sync tool does): nothing is published."""
    out = tmp_path / "out"
    shard = sorted(src.glob("*.safetensors"))[-1]
    twin = tmp_path / "twin"
    shutil.copy2(shard, twin)
    _flip_data_byte(twin)
    st = shard.stat()
    os.utime(twin, ns=(st.st_atime_ns, st.st_mtime_ns))
    cmd = f"mv {twin} {shard}"
    proc = run_cli("nvfp4-to-marlin", src, out, *ARGS, "--json", env={"DSV4_CONVERT_RUN_AT": f"5:{cmd}"}, check=False)
    assert not twin.exists(), "the hook ran"
    doc = json.loads(proc.stdout)
    assert proc.returncode == 3 and doc["error"]["id"] == "input.changed_during_run", proc.stderr
    assert not out.exists() and not Path(f"{out}.partial").exists()
