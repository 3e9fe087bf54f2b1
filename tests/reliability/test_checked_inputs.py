"""Issue 28, items 7, 8 and 11: every file the converter copies is checked (a non-weight file that is a
dangling symlink or a FIFO, GLM's mtp.safetensors outside the index as a link to a non-safetensors file,
a FIFO or a directory), and `validate --json` answers an output whose NVFP4 global is NaN, 0 or Inf
with a finding, not a traceback. Real synth checkpoints, the real CLI (one process for the batch,
tests/helpers/cli_batch.py).

Substitutions: none (the edited output's manifest is re-recorded, as a consistent attacker would,
tests/helpers/cli.py rerecord)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from dsv4_convert.synth import write_synthetic_checkpoint
from tests.helpers.cli import rerecord, run_cli, tree_hashes

pytestmark = pytest.mark.slow  # starts the CLI

ARGS = ("--workers", "1", "-q")
BATCH = Path(__file__).parents[1] / "helpers" / "cli_batch.py"


def _batch(tmp_path: Path, commands: list[list]) -> list[dict]:
    listing = tmp_path / "commands.json"
    listing.write_text(json.dumps([[str(a) for a in c] for c in commands]))
    proc = subprocess.run([sys.executable, str(BATCH), str(listing)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _source(tmp_path: Path, name: str, fmt: str = "nvfp4-modelopt-dsv4", **kw) -> Path:
    return write_synthetic_checkpoint(tmp_path / name, format=fmt, layers=1, experts=4, **kw)


def test_files_that_cannot_be_copied_byte_for_byte_are_refused_by_name(tmp_path):
    outside = tmp_path / "not-weights.bin"
    outside.write_bytes(b"\x00" * 64)
    cases = {}
    ck = _source(tmp_path, "dangling")
    (ck / "tokenizer.json").unlink(missing_ok=True)
    (ck / "tokenizer.json").symlink_to(tmp_path / "blobs" / "lost")  # a snapshot whose blob is gone
    cases[ck] = ("tokenizer.json", "input.not_a_regular_file")
    ck = _source(tmp_path, "fifo")
    (ck / "generation_config.json").unlink()
    os.mkfifo(ck / "generation_config.json")
    cases[ck] = ("generation_config.json", "input.not_a_regular_file")
    for kind in ("link", "fifo", "dir"):  # GLM's file outside the index
        ck = _source(tmp_path, f"mtp-{kind}")
        mtp = ck / "mtp.safetensors"
        if kind == "link":
            mtp.symlink_to(outside)
        elif kind == "fifo":
            os.mkfifo(mtp)
        else:
            mtp.mkdir()
        cases[ck] = ("mtp.safetensors", None if kind == "link" else "input.not_a_regular_file")
    before = {ck: tree_hashes(ck) for ck in cases if ck.name != "fifo"}
    commands = [["nvfp4-to-marlin", ck, tmp_path / f"out-{ck.name}", *ARGS, "--json"] for ck in cases]
    results = _batch(tmp_path, commands)
    for (ck, (name, error_id)), r in zip(cases.items(), results):
        assert r["crash"] is None and "Traceback" not in r["stderr"], r
        assert r["code"] == 3, (ck.name, r["stderr"])
        doc = json.loads(r["stdout"])
        assert doc["error"]["file"].endswith(name), doc
        assert error_id is None or doc["error"]["id"] == error_id, doc  # the link: the header reader's own id
        assert not (tmp_path / f"out-{ck.name}").exists()
    for ck, hashes in before.items():
        assert tree_hashes(ck) == hashes


@pytest.mark.parametrize("value", [float("nan"), 0.0, float("inf")])
def test_validate_json_on_an_invalid_kept_global_is_a_finding(tmp_path, value):
    src = _source(tmp_path, "src")
    out = tmp_path / "out"
    run_cli("nvfp4-to-marlin", src, out, *ARGS)
    for f in sorted(out.glob("*.safetensors")):
        with safe_open(f, "pt") as h:
            meta, tensors = h.metadata(), {k: h.get_tensor(k) for k in h.keys()}
        names = [k for k in tensors if k.endswith("weight_scale_2")]
        if names:
            tensors[names[0]] = torch.full_like(tensors[names[0]], value)
            save_file(tensors, f, metadata=meta)
            rerecord(out, f.name)
            break
    else:
        raise AssertionError("the output keeps its weight_scale_2")
    proc = run_cli("validate", out, "--json", check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout, parse_constant=_refuse)  # strict JSON: no NaN / Infinity literals
    found = {(f["check"], f["tensor"]) for f in doc["findings"]}
    assert {("nvfp4.global.invalid", names[0]), ("marlin.layout.global", names[0])} <= found, found


def _refuse(literal: str):
    raise AssertionError(f"{literal} is not JSON (RFC 8259)")
