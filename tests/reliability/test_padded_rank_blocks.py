"""Issue 23 items 6 and 10: a `--tp/--ep` output is one Marlin block per MoE-TP rank, and its padding
must be zero. W4A16 and W4A8 outputs at MoE-TP 2 validate clean (decoded and `--against`) and reverse
byte for byte; non-zero padding (codes and scales, in every expert) fails `validate` with
`marlin.padding` and is refused by `marlin-to-source` with `reverse.padding_not_zero`: the same rule.
Real checkpoints (tests/helpers/ckpt_factory.py), real CLI subprocesses.

Substitutions: an edit made consistently (the manifest re-recorded with the tool's own digest,
corrupt.rerecord_manifest) stands for someone with write access to the checkpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers.ckpt_factory import make_checkpoint
from tests.helpers.cli import restored_tree, run_cli, tree_hashes
from tests.helpers.corrupt import poke_tensor_bytes, rerecord_manifest, shard_of

pytestmark = pytest.mark.slow  # every test starts the CLI

H, I_ = 256, 128  # MoE-TP 2: I_shard 64 -> i_pad 128 (both engines pad MXFP4 I to 128)
EXPERTS = 2
LAYOUTS = {"w4a16-tp2": ("--target", "vllm", "--tp", "2"), "w4a8-tp2": ("--target", "vllm", "--tp", "2", "--w4a8"),
           "w4a8-tp2-ep2": ("--target", "vllm", "--tp", "2", "--ep", "2", "--w4a8")}


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("mx") / "src", "mxfp4-dsv4", layers=1, experts=EXPERTS,
                           hidden=H, inter=I_, shards=2).root


@pytest.fixture(scope="module")
def outputs(src, tmp_path_factory):
    base = tmp_path_factory.mktemp("out")
    done = {}
    for name, args in LAYOUTS.items():
        run_cli("mxfp4-to-marlin", src, base / name, *args, "-q")
        done[name] = base / name
    return done


def _validate(path, *extra) -> tuple[int, dict]:
    proc = run_cli("validate", path, "--json", *extra, check=False)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_padded_outputs_validate_clean_and_reverse_exactly(src, outputs, layout, tmp_path):
    out = outputs[layout]
    for extra in ((), ("--against", src)):
        code, report = _validate(out, *extra)
        s = report["summary"]
        # a W4A8 output carries one expected warning: the releases without W4A8 Marlin (vLLM 0.34) refuse it
        expected = {"marlin.w4a8_releases"} if layout.startswith("w4a8") else set()
        assert {f["check"] for f in report["findings"]} == expected, report["findings"][:3]
        assert code == 0 and s["errors"] == 0 and s["warnings"] == len(expected), report["findings"][:3]
        assert s["experts_checked"] == EXPERTS and s["projections_checked"] == 3 * EXPERTS
        assert {c["id"]: c["status"] for c in report["checks"]}["marlin.padding"] == "pass"
    run_cli("marlin-to-source", out, tmp_path / "back", "-q")
    assert restored_tree(tmp_path / "back") == tree_hashes(src)


def _dirty_padding(out: Path, dst: Path) -> Path:
    """Non-zero codes and scales in rank 0's K padding of every expert's down projection (w2: Marlin
    [2 * 128 / 16, 2 * 256] int32 and [2 * 128 / 32, 256] E8M0; rank 0's real K is 0..63, its padding
    64..127, i.e. weight rows 4..7 and scale rows 2..3), manifest re-recorded."""
    shutil.copytree(out, dst)
    for e in range(EXPERTS):
        for part, at in (("weight", 5 * 2 * H * 4), ("weight_scale", 2 * H)):
            name = f"layers.0.ffn.experts.{e}.w2.{part}"
            poke_tensor_bytes(shard_of(dst, name), name, at, b"\x7f")
            rerecord_manifest(dst, shard_of(dst, name).name)
    return dst


@pytest.mark.parametrize("layout", ["w4a16-tp2", "w4a8-tp2"])
def test_non_zero_padding_fails_validate_and_marlin_to_source_alike(src, outputs, layout, tmp_path):
    dirty = _dirty_padding(outputs[layout], tmp_path / "dirty")
    code, report = _validate(dirty)
    assert code == 1, report["summary"]
    found = [f for f in report["findings"] if f["check"] == "marlin.padding"]
    assert {f["tensor"] for f in found} == {f"layers.0.ffn.experts.{e}.w2.{p}" for e in range(EXPERTS)
                                             for p in ("weight", "weight_scale")}, found
    assert all("TP 2 / EP 1" in f["message"] and f["severity"] == "error" for f in found)
    proc = run_cli("marlin-to-source", dirty, tmp_path / "back", "--json", check=False)
    assert proc.returncode == 4 and json.loads(proc.stdout)["error"]["id"] == "reverse.padding_not_zero", proc.stdout
    assert not (tmp_path / "back").exists()
