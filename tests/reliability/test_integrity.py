"""Issue 10, items 2 and 3: --resume never mixes inputs, and what the tool records it verifies
(manifest after publishing, validate --against on every non-expert tensor, marlin-to-source refusing
a checkpoint that no longer matches its manifest). Real synth checkpoints, the real CLI in
subprocesses; the kill hook DSV4_CONVERT_KILL_AT is the converter's own crash-test switch.

Substitutions: none."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from dsv4_convert.runtime.digest import HASH_ALGORITHM
from dsv4_convert.synth import write_synthetic_checkpoint
from tests.helpers.cli import run_cli, tree_hashes

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


def test_manifest_names_its_algorithm_and_lists_every_file(src, tmp_path):
    out = tmp_path / "out"
    run_cli("nvfp4-to-marlin", src, out, *ARGS)
    m = json.loads((out / MANIFEST).read_text())
    assert m["hash_algorithm"] == HASH_ALGORITHM
    on_disk = set(tree_hashes(out)) - {MANIFEST}
    assert set(m["files"]) == on_disk
    assert any(f.startswith("dsv4-convert-source/") for f in m["files"])
    proc = run_cli("validate", out, "--quiet", check=False)
    assert proc.returncode == 0, proc.stdout


def test_a_flipped_byte_is_found_and_never_reversed(src, tmp_path):
    out = tmp_path / "out"
    run_cli("nvfp4-to-marlin", src, out, *ARGS)
    shard, name, off = _non_expert_shard(out)
    _flip(shard, off)
    proc = run_cli("validate", out, "--quiet", check=False)
    assert proc.returncode == 1 and "integrity.manifest" in proc.stdout and shard.name in proc.stdout
    proc = run_cli("validate", out, "--quiet", "--against", src, "--no-verify-manifest", check=False)
    assert proc.returncode == 1 and "against.tensor_mismatch" in proc.stdout and name in proc.stdout
    assert "integrity.manifest" not in proc.stdout.replace("integrity.manifest  ", "")  # skipped: no finding line
    back = tmp_path / "back"
    proc = run_cli("marlin-to-source", out, back, "-q", check=False)
    assert proc.returncode == 4 and "reverse.manifest_mismatch" in proc.stderr and shard.name in proc.stderr
    assert not back.exists() and not (tmp_path / "back.partial").exists()


def test_against_compares_non_expert_tensors_of_a_source_copy(src, tmp_path):
    copy = tmp_path / "copy"
    write_synthetic_checkpoint(copy, format="nvfp4-modelopt-dsv4", layers=1, experts=4)
    shard, name, off = _non_expert_shard(copy)
    _flip(shard, off)
    proc = run_cli("validate", copy, "--quiet", "--against", src, check=False)
    assert proc.returncode == 1 and "against.tensor_mismatch" in proc.stdout and name in proc.stdout


def test_an_edited_source_record_is_found(src, tmp_path):
    out = tmp_path / "out"
    run_cli("nvfp4-to-marlin", src, out, *ARGS)
    rec = out / "dsv4-convert-source" / "headers.json"
    text = rec.read_text()
    assert "F8_E4M3" in text
    rec.write_text(text.replace("F8_E4M3", "F8_E5M2", 1))
    proc = run_cli("validate", out, "--quiet", check=False)
    assert proc.returncode == 1 and "dsv4-convert-source/headers.json" in proc.stdout
    proc = run_cli("marlin-to-source", out, tmp_path / "back", "-q", check=False)
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
