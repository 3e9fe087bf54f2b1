"""Issue 23 items 6 and 10: a `--tp/--ep` output is one Marlin block per MoE-TP rank, and its padding
must be zero. W4A16 and W4A8 outputs at MoE-TP 2 validate clean (decoded and `--against`) and reverse
byte for byte; non-zero padding (codes and scales, in every expert) fails `validate` with
`marlin.padding` and is refused by `marlin-to-source` with `reverse.padding_not_zero`: the same rule.
Real checkpoints (tests/helpers/ckpt_factory.py), real CLI command lines.

Substitutions: the command lines run in two CLI processes (run_cli_batch: `main(argv)` each, as the console script
runs it, its exit code, stdout and stderr), the clean outputs' then the dirtied copies', not one process each: a
process start costs more than these commands. An edit made consistently (the manifest re-recorded with the tool's own digest,
corrupt.rerecord_manifest) stands for someone with write access to the checkpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers.ckpt_factory import make_checkpoint
from tests.helpers.cli import restored_tree, run_cli_batch, tree_hashes
from tests.helpers.corrupt import poke_tensor_bytes, rerecord_manifest, shard_of

pytestmark = pytest.mark.slow  # every test reads the CLI's answers

H, I_ = 256, 128  # MoE-TP 2: I_shard 64 -> i_pad 128 (both engines pad MXFP4 I to 128)
EXPERTS = 2
LAYOUTS = {"w4a16-tp2": ("--target", "vllm", "--tp", "2"), "w4a8-tp2": ("--target", "vllm", "--tp", "2", "--w4a8"),
           "w4a8-tp2-ep2": ("--target", "vllm", "--tp", "2", "--ep", "2", "--w4a8")}


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("mx") / "src", "mxfp4-dsv4", layers=1, experts=EXPERTS,
                           hidden=H, inter=I_, shards=2).root


DIRTY = ["w4a16-tp2", "w4a8-tp2"]
VALIDATIONS = ("decoded", "against")  # against: --against the source


@pytest.fixture(scope="module")
def runs(src, tmp_path_factory) -> dict:
    """Each layout converted, validated (decoded and --against the source) and reversed, in one CLI process; then
    DIRTY's outputs copied with non-zero padding, validated and reversed, in another: (layout, step) -> the CLI's
    answer, (layout, "out" | "back" | "dirty" | "dirty-back") -> the paths."""
    base = tmp_path_factory.mktemp("out")
    paths = {(n, step): base / f"{n}-{step}" for n in LAYOUTS for step in ("out", "back", "dirty", "dirty-back")}
    steps = {}
    for name, args in LAYOUTS.items():
        steps[name, "convert"] = ["mxfp4-to-marlin", src, paths[name, "out"], *args, "-q"]
        steps.update({(name, v): ["validate", paths[name, "out"], "--json", *extra]
                      for v, extra in zip(VALIDATIONS, ((), ("--against", src)))})
        steps[name, "reverse"] = ["marlin-to-source", paths[name, "out"], paths[name, "back"], "-q"]
    runs = dict(zip(steps, run_cli_batch(list(steps.values()), base)))
    dirty = {}
    for name in DIRTY:
        assert runs[name, "convert"].returncode == 0, runs[name, "convert"].stderr
        _dirty_padding(paths[name, "out"], paths[name, "dirty"])
        dirty[name, "dirty-validate"] = ["validate", paths[name, "dirty"], "--json"]
        dirty[name, "dirty-reverse"] = ["marlin-to-source", paths[name, "dirty"], paths[name, "dirty-back"], "--json"]
    return {**runs, **dict(zip(dirty, run_cli_batch(list(dirty.values()), base))), **paths}


def _validate(proc) -> tuple[int, dict]:
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_padded_outputs_validate_clean_and_reverse_exactly(src, runs, layout):
    assert runs[layout, "convert"].returncode == 0, runs[layout, "convert"].stderr
    for v in VALIDATIONS:
        code, report = _validate(runs[layout, v])
        s = report["summary"]
        # a W4A8 output carries one expected warning: the releases without W4A8 Marlin (vLLM 0.34) refuse it
        expected = {"marlin.w4a8_releases"} if layout.startswith("w4a8") else set()
        assert {f["check"] for f in report["findings"]} == expected, report["findings"][:3]
        assert code == 0 and s["errors"] == 0 and s["warnings"] == len(expected), report["findings"][:3]
        assert s["experts_checked"] == EXPERTS and s["projections_checked"] == 3 * EXPERTS
        assert {c["id"]: c["status"] for c in report["checks"]}["marlin.padding"] == "pass"
    assert runs[layout, "reverse"].returncode == 0, runs[layout, "reverse"].stderr
    assert restored_tree(runs[layout, "back"]) == tree_hashes(src)


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


@pytest.mark.parametrize("layout", DIRTY)
def test_non_zero_padding_fails_validate_and_marlin_to_source_alike(runs, layout):
    code, report = _validate(runs[layout, "dirty-validate"])
    assert code == 1, report["summary"]
    found = [f for f in report["findings"] if f["check"] == "marlin.padding"]
    assert {f["tensor"] for f in found} == {f"layers.0.ffn.experts.{e}.w2.{p}" for e in range(EXPERTS)
                                             for p in ("weight", "weight_scale")}, found
    assert all("TP 2 / EP 1" in f["message"] and f["severity"] == "error" for f in found)
    proc = runs[layout, "dirty-reverse"]
    assert proc.returncode == 4 and json.loads(proc.stdout)["error"]["id"] == "reverse.padding_not_zero", proc.stdout
    assert not runs[layout, "dirty-back"].exists()
