"""Reading back what the tool recorded: the manifest of a converted checkpoint (and the marker of a
marlin-to-source output) names its hash algorithm and every file written with its size and hash.
`verify` re-hashes them; validate reports each mismatch, marlin-to-source refuses on any."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..core.checkpoint.small_files import read_small
from .digest import file_digest, new_hash
from .output.names import record_name_ok

__all__ = ["Mismatch", "read_manifest", "verify"]


@dataclass(frozen=True)
class Mismatch:
    file: str  # relative to the checkpoint root, or the record itself
    problem: str  # "missing" | "size" | "hash" | "unreadable" | "record"
    detail: str


def read_manifest(root: Path, name: str) -> dict | None:
    """The parsed record, None when there is none; raises ValueError when it is not a valid record."""
    path = Path(root) / name
    if not path.exists():
        return None
    obj = json.loads(read_small(path))
    if not isinstance(obj, dict) or not isinstance(obj.get("files"), dict) or "hash_algorithm" not in obj:
        raise ValueError("no hash_algorithm/files: written by an older dsv4-convert, or edited")
    try:
        new_hash(obj["hash_algorithm"])
    except (ValueError, TypeError):
        raise ValueError(f"unknown hash algorithm {obj['hash_algorithm']!r}") from None
    return obj


def verify(root: Path, name: str) -> list[Mismatch] | None:
    """Every mismatch between the record `name` in `root` and the files; None when there is no record."""
    root = Path(root)
    try:
        obj = read_manifest(root, name)
    except (OSError, ValueError, RecursionError) as e:  # RecursionError: JSON nested too deep
        return [Mismatch(name, "record", f"the record cannot be used: {e}")]
    if obj is None:
        return None
    out = []
    for rel, rec in sorted(obj["files"].items()):
        f = root / rel
        if not isinstance(rec, dict) or not record_name_ok(rel, nested=True):
            out.append(Mismatch(rel, "record", "malformed entry"))
            continue
        if not f.is_file():
            out.append(Mismatch(rel, "missing", "listed in the record, not on disk"))
            continue
        size = f.stat().st_size
        if size != rec.get("size"):
            out.append(Mismatch(rel, "size", f"{size} bytes, recorded {rec.get('size')}"))
            continue
        try:
            digest = file_digest(f, obj["hash_algorithm"])
        except OSError as e:
            out.append(Mismatch(rel, "unreadable", e.strerror or str(e)))
            continue
        if digest != rec.get("hash"):
            out.append(Mismatch(rel, "hash", f"{obj['hash_algorithm']} {digest[:16]}..., recorded "
                                             f"{str(rec.get('hash'))[:16]}..."))
    return out
