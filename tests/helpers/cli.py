"""Run the real CLI in a subprocess, and hash directories, for the converter tests."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-m", "dsv4_convert.cli"]


def run_cli(*args, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    e = dict(os.environ, **(env or {}))
    proc = subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, env=e)
    if check and proc.returncode != 0:
        raise AssertionError(f"dsv4-convert {' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stderr}")
    return proc


def tree_hashes(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(root).rglob("*")) if p.is_file()}


MARKER = "dsv4-convert.marker.json"  # marlin-to-source's "this tool wrote it" record (runtime/paths.py)


def restored_tree(root: Path) -> dict[str, str]:
    """tree_hashes of a marlin-to-source output, without its marker (which must be there)."""
    hashes = tree_hashes(root)
    assert MARKER in hashes, "marlin-to-source marks its output"
    del hashes[MARKER]
    return hashes
