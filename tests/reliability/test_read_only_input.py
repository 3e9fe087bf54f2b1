"""Every command that reads a checkpoint leaves it exactly as it was: run with the input `chmod -R a-w`
(a write would fail for a normal user), and, because root ignores permission bits (CI runs as root),
compare every file's SHA-256 and every file's and directory's mtime before and after.

`synth` takes no input. Kill -9 / --resume, a tampered staged shard, the lock, a full disk and bad
inputs are in tests/convert/test_convert_faults.py (see tests/reliability/README.md).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import restored_tree, run_cli, tree_hashes

SMALL = {"layers": 1, "experts": 4, "shards": 2}
QUIET = ("-q", "--workers", "1")
BATCH = Path(__file__).parents[1] / "helpers" / "cli_batch.py"


def _mtimes(root: Path) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): p.stat().st_mtime_ns for p in [root, *sorted(root.rglob("*"))]}


def _chmod_tree(root: Path, *, writable: bool) -> None:
    for p in [root, *root.rglob("*")]:
        mode = p.stat().st_mode
        os.chmod(p, mode | stat.S_IWUSR if writable else mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Three read-only inputs of our own (an NVFP4 and an MXFP4 source, and a converted checkpoint),
    with their hashes and mtimes taken once they are read-only."""
    from dsv4_convert.synth import write_synthetic_checkpoint

    base = tmp_path_factory.mktemp("ro-inputs")
    nv = write_synthetic_checkpoint(base / "nv", format="nvfp4-modelopt-dsv4", **SMALL)
    mx = write_synthetic_checkpoint(base / "mx", format="mxfp4-dsv4", **SMALL)
    marlin = base / "marlin"
    run_cli("nvfp4-to-marlin", nv, marlin, *QUIET)
    roots = {"nv": nv, "mx": mx, "marlin": marlin}
    for root in roots.values():
        _chmod_tree(root, writable=False)
    state = {k: (tree_hashes(r), _mtimes(r)) for k, r in roots.items()}
    yield roots, state
    for root in roots.values():
        _chmod_tree(root, writable=True)


def test_every_command_leaves_its_input_untouched(inputs, tmp_path):
    roots, before = inputs
    out = tmp_path / "out"
    out.mkdir()
    commands = {
        "inspect nv": ["inspect", roots["nv"]],
        "inspect --json marlin": ["inspect", roots["marlin"], "--json"],
        "nvfp4-to-marlin": ["nvfp4-to-marlin", roots["nv"], out / "nv-marlin", *QUIET],
        "nvfp4-to-marlin --dry-run": ["nvfp4-to-marlin", roots["nv"], "--dry-run"],
        "mxfp4-to-marlin": ["mxfp4-to-marlin", roots["mx"], out / "mx-marlin", *QUIET],
        "marlin-to-source": ["marlin-to-source", roots["marlin"], out / "nv-again", "-q"],
        "validate nv": ["validate", roots["nv"], "--quiet", "--workers", "1", "--gemm-experts", "1"],
        "validate marlin --against nv": ["validate", roots["marlin"], "--against", roots["nv"], "--quiet",
                                         "--workers", "1", "--gemm-experts", "1"],
        "plan marlin": ["plan", roots["marlin"]],
        # a refused run reads the input too: mxfp4-to-marlin on NVFP4 input
        "mxfp4-to-marlin on nvfp4": ["mxfp4-to-marlin", roots["nv"], out / "refused", *QUIET],
    }
    listing = tmp_path / "commands.json"
    listing.write_text(json.dumps([[str(a) for a in argv] for argv in commands.values()]))
    proc = subprocess.run([sys.executable, str(BATCH), str(listing)], capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = dict(zip(commands, json.loads(proc.stdout), strict=True))
    for name, r in results.items():
        assert r["crash"] is None, f"{name} crashed:\n{r['crash']}"
        expected = 4 if name == "mxfp4-to-marlin on nvfp4" else 0
        assert r["code"] == expected, f"{name}: exit {r['code']}\n{r['stdout'][-2000:]}\n{r['stderr'][-2000:]}"
    for key, root in roots.items():
        hashes, mtimes = before[key]
        assert tree_hashes(root) == hashes, f"{key}: file contents changed"
        assert _mtimes(root) == mtimes, f"{key}: an mtime changed (something wrote or created a file)"
    again = restored_tree(out / "nv-again")  # the source's files alone
    assert again == {k: v for k, v in before["nv"][0].items() if k in again}
    assert not (out / "refused").exists()
