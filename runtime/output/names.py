"""The two rules of the output path that modules outside it read without an output tree: which names read
back from a record may become paths (runtime/manifest.py, marlin-to-source), and whether a path lies inside
a live run's staging directory (runtime/side_files.py). A leaf: it imports nothing of the project but file
names."""

from __future__ import annotations

import os
from pathlib import Path

from ...core.files import LOCK

__all__ = ["inside_staging", "record_name_ok"]


def record_name_ok(name, *, nested: bool = False) -> bool:
    """A name read back from one of this tool's records (progress, manifest, marker, the source
    record) becomes a path under that record's directory, to read, replace or delete: only a name
    this tool could have written passes. A plain file name; with `nested`, a relative path of plain
    names. Never absolute, never `.` or `..`, never empty, no NUL or backslash."""
    if not isinstance(name, str) or not name or "\0" in name or "\\" in name:
        return False
    parts = name.split("/")
    return (nested or len(parts) == 1) and all(part not in ("", ".", "..") for part in parts)


def inside_staging(p: Path) -> bool:
    """Whether `p` lies inside a directory that holds this tool's lock: a run's OUT.partial, which it publishes
    (runtime/side_files.py writes no side file there)."""
    return any(os.path.lexists(d / LOCK) for d in p.parents)
