"""Issue 10, items 2 and 3: --resume never mixes inputs, and what the tool records it verifies
(manifest after publishing, validate --against on every non-expert tensor, marlin-to-source refusing
a checkpoint that no longer matches its manifest). Real synth checkpoints, the real CLI; the kill hook
DSV4_CONVERT_KILL_AT is the converter's own crash-test switch.

Substitutions: the tests of what the manifest and --against find run their command lines in two CLI processes
(run_cli_batch: `main(argv)` each, as the console script runs it, its exit code, stdout and stderr), the
conversions, then the checks of the edited outputs, not one process each: a process start costs more than
these commands. The kill and resume tests keep a process per command."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from dsv4_convert.runtime.digest import HASH_ALGORITHM
from dsv4_convert.synth import write_synthetic_checkpoint
from tests.helpers.cli import run_cli, run_cli_batch, tree_hashes

ARGS = ("--workers", "1", "-q", "--max-shard-size", "60KB")
MANIFEST = "dsv4-convert.manifest.json"


@pytest.fixture
def src(tmp_path) -> Path:
    p = tmp_path / "src"
    write_synthetic_checkpoint(p, format="nvfp4-modelopt-dsv4", layers=1, experts=4)
    return p


def _tensor_offset(shard: Path, pick) -> tuple[str, int]:
    raw = shard.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    name = next(k for k in sorted(header) if k != "__metadata__" and pick(k))
    return name, 8 + n + header[name]["data_offsets"][0]


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x01]))


def _non_expert_shard(root: Path) -> tuple[Path, str, int]:
    index = json.loads((root / "model.safetensors.index.json").read_text())["weight_map"]
    name = next(k for k in sorted(index) if "experts" not in k and "embed" in k)
    shard = root / index[name]
    _, off = _tensor_offset(shard, lambda k: k == name)
    return shard, name, off


@pytest.fixture(scope="module")
def checked(tmp_path_factory) -> dict:
    """The manifest and --against tests' CLI answers: each test's source ("src") converted ("out") in one CLI process,
    then, after each test's edit, its checks in a second; (test, step) -> the answer or a path, (test, "edited")
    -> what the edit changed (the shard, the tensor)."""
    work = tmp_path_factory.mktemp("integrity")
    tests = ("manifest", "flipped", "copy", "record")
    d = {t: work / t for t in tests}
    runs = {(t, "src"): write_synthetic_checkpoint(d[t] / "src", format="nvfp4-modelopt-dsv4", layers=1, experts=4)
            for t in tests}
    runs.update({(t, "out"): d[t] / "out" for t in tests})
    first = {(t, "convert"): ["nvfp4-to-marlin", runs[t, "src"], runs[t, "out"], *ARGS] for t in ("manifest", "flipped", "record")}
    runs.update(zip(first, run_cli_batch(list(first.values()), work)))
    for key in first:
        assert runs[key].returncode == 0, runs[key].stderr
    shard, name, off = runs["flipped", "edited"] = _non_expert_shard(runs["flipped", "out"])
    _flip(shard, off)
    write_synthetic_checkpoint(d["copy"] / "copy", format="nvfp4-modelopt-dsv4", layers=1, experts=4)
    shard, name, off = runs["copy", "edited"] = _non_expert_shard(d["copy"] / "copy")
    _flip(shard, off)
    rec = runs["record", "out"] / "dsv4-convert-source" / "headers.json"
    runs["record", "edited"] = rec.read_text()
    rec.write_text(runs["record", "edited"].replace("F8_E4M3", "F8_E5M2", 1))
    then = {("manifest", "validate"): ["validate", runs["manifest", "out"], "--quiet"],
            ("flipped", "validate"): ["validate", runs["flipped", "out"], "--quiet"],
            ("flipped", "against"): ["validate", runs["flipped", "out"], "--quiet", "--against", runs["flipped", "src"],
                                     "--no-verify-manifest"],
            ("flipped", "reverse"): ["marlin-to-source", runs["flipped", "out"], d["flipped"] / "back", "-q"],
            ("copy", "against"): ["validate", d["copy"] / "copy", "--quiet", "--against", runs["copy", "src"]],
            ("record", "validate"): ["validate", runs["record", "out"], "--quiet"],
            ("record", "reverse"): ["marlin-to-source", runs["record", "out"], d["record"] / "back", "-q"]}
    runs.update(zip(then, run_cli_batch(list(then.values()), work)))
    return runs


def test_manifest_names_its_algorithm_and_lists_every_file(checked):
    out = checked["manifest", "out"]
    m = json.loads((out / MANIFEST).read_text())
    assert m["hash_algorithm"] == HASH_ALGORITHM
    on_disk = set(tree_hashes(out)) - {MANIFEST}
    assert set(m["files"]) == on_disk
    assert any(f.startswith("dsv4-convert-source/") for f in m["files"])
    proc = checked["manifest", "validate"]
    assert proc.returncode == 0, proc.stdout


def test_a_flipped_byte_is_found_and_never_reversed(checked):
    shard, name, _ = checked["flipped", "edited"]
    proc = checked["flipped", "validate"]
    assert proc.returncode == 1 and "integrity.manifest" in proc.stdout and shard.name in proc.stdout
    proc = checked["flipped", "against"]
    assert proc.returncode == 1 and "against.tensor_mismatch" in proc.stdout and name in proc.stdout
    assert "error[integrity.manifest]" not in proc.stdout  # skipped: no finding, and it says so
    assert "note: integrity.manifest not run: --no-verify-manifest" in proc.stdout
    back = checked["flipped", "out"].parent / "back"
    proc = checked["flipped", "reverse"]
    assert proc.returncode == 4 and "reverse.manifest_mismatch" in proc.stderr and shard.name in proc.stderr
    assert not back.exists() and not back.with_name("back.partial").exists()


def test_against_compares_non_expert_tensors_of_a_source_copy(checked):
    _, name, _ = checked["copy", "edited"]
    proc = checked["copy", "against"]
    assert proc.returncode == 1 and "against.tensor_mismatch" in proc.stdout and name in proc.stdout


def test_an_edited_source_record_is_found(checked):
    assert "F8_E4M3" in checked["record", "edited"]
    proc = checked["record", "validate"]
    assert proc.returncode == 1 and "dsv4-convert-source/headers.json" in proc.stdout
    proc = checked["record", "reverse"]
    assert proc.returncode == 4 and "reverse.manifest_mismatch" in proc.stderr


def test_resume_after_the_input_changed_refuses_never_mixes(src, tmp_path):
    out = tmp_path / "out"
    proc = run_cli("nvfp4-to-marlin", src, out, *ARGS, env={"DSV4_CONVERT_KILL_AT": "40"}, check=False)
    assert proc.returncode == -signal.SIGKILL
    shard = sorted(src.glob("*.safetensors"))[-1]
    _, off = _tensor_offset(shard, lambda k: "experts" in k and k.endswith(".weight"))
    _flip(shard, off)  # same size, same headers: only the data (and so the mtime) changed
    proc = run_cli("nvfp4-to-marlin", src, out, *ARGS, "--resume", check=False)
    assert proc.returncode == 5 and "output.resume_mismatch" in proc.stderr and shard.name in proc.stderr
    assert not out.exists()
    run_cli("nvfp4-to-marlin", src, out, *ARGS, "--force")  # start over: everything from the new bytes
    fresh = tmp_path / "fresh" / "out"  # same name: SERVING.md names OUT
    run_cli("nvfp4-to-marlin", src, fresh, *ARGS)
    assert tree_hashes(out) == tree_hashes(fresh)


def test_an_edit_with_its_mtime_restored_is_caught_by_its_size(src, tmp_path):
    """An edit that changes the size but restores the mtime (touch -r) is refused too."""
    out = tmp_path / "out"
    run_cli("nvfp4-to-marlin", src, out, *ARGS, env={"DSV4_CONVERT_KILL_AT": "40"}, check=False)
    cfg = src / "generation_config.json" if (src / "generation_config.json").exists() else src / "synth.json"
    st = cfg.stat()
    cfg.write_text(cfg.read_text() + " ")
    os.utime(cfg, ns=(st.st_atime_ns, st.st_mtime_ns))
    proc = run_cli("nvfp4-to-marlin", src, out, *ARGS, "--resume", check=False)
    assert proc.returncode == 5 and "output.resume_mismatch" in proc.stderr and cfg.name in proc.stderr


def test_ctrl_c_during_resume_keeps_the_verified_shards(src, tmp_path):
    out = tmp_path / "out"
    partial = tmp_path / "out.partial"
    run_cli("nvfp4-to-marlin", src, out, *ARGS, env={"DSV4_CONVERT_KILL_AT": "40"}, check=False)
    before = json.loads((partial / "dsv4-convert.progress.json").read_text())["shards"]
    assert before
    proc = run_cli("nvfp4-to-marlin", src, out, *ARGS, "--resume", env={"DSV4_CONVERT_KILL_AT": "3:INT"},
                   check=False)
    assert proc.returncode == 130 and "Traceback" not in proc.stderr
    assert "the verified shards stay in" in proc.stderr and "partial output was removed" not in proc.stderr
    after = json.loads((partial / "dsv4-convert.progress.json").read_text())["shards"]
    assert set(before) <= set(after) and all((partial / f).is_file() for f in before)
    assert not list(partial.glob("*.tmp"))
    run_cli("nvfp4-to-marlin", src, out, *ARGS, "--resume")
    fresh = tmp_path / "fresh" / "out"  # same name: SERVING.md names OUT
    run_cli("nvfp4-to-marlin", src, fresh, *ARGS)
    assert tree_hashes(out) == tree_hashes(fresh)
