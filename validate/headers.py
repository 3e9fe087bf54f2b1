"""The validator's scan of `model.safetensors.index.json` and every shard header, through the one
strict header parser (core/checkpoint/safetensors_header.py).

The reader refuses a broken checkpoint at the first problem; this scan keeps going file by file, so
that `validate` can report every broken or truncated shard as a finding.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..core.checkpoint.index import lone_surrogate, unsafe_shard_paths
from ..core.checkpoint.safetensors_header import read_header
from ..core.checkpoint.small_files import read_small
from ..core.errors import InputError
from ..core.files import INDEX_FILE
from .inputs import HeaderInfo

__all__ = ["scan_checkpoint", "scan_header", "scan_index"]



def scan_index(root: Path) -> tuple[dict | None, str | None]:
    path = root / INDEX_FILE
    if not path.exists():
        return None, None
    try:
        text = read_small(path).decode("utf-8")
        index = json.loads(text)
    except (OSError, ValueError, RecursionError) as e:
        return None, f"{INDEX_FILE} is not valid JSON: {str(e)[:200]}"
    wm = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(wm, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in wm.items()):
        return None, f"{INDEX_FILE} has no 'weight_map' object mapping tensor names to shard file names"
    bad = lone_surrogate(text, [*wm, *wm.values()])
    if bad is not None:
        return None, f"{INDEX_FILE} names {bad!r:.200}, which escapes a lone UTF-16 surrogate: not valid UTF-8"
    return index, None


def scan_header(path: Path, file: str) -> HeaderInfo:
    """The strict parser's view of one shard, except that a shard cut short keeps its tensors (the
    `structure.shard.truncated` check names the ones past the end, and the rest is still validated)."""
    size = path.stat().st_size
    try:
        refs, _ = read_header(path, file=file, allow_truncated=True)
    except InputError as e:
        return HeaderInfo(file, size, {}, f"{e.message} [{e.error_id}]")
    return HeaderInfo(file, size, {n: (r.dtype, r.shape, r.begin, r.end) for n, r in refs.items()})


def scan_checkpoint(root: Path) -> tuple[dict | None, str | None, dict[str, HeaderInfo], tuple[str, ...]]:
    """(index, index error, headers of the shards that exist, *.safetensors files on disk)."""
    index, error = scan_index(root)
    on_disk = tuple(sorted(p.name for p in root.glob("*.safetensors")))
    wanted = set(on_disk)
    if index is not None:  # a name that leads out of root is never opened (the reader refuses the index)
        named = set(index["weight_map"].values())
        wanted |= named - set(unsafe_shard_paths(named))
    headers = {f: scan_header(root / f, f) for f in sorted(wanted) if (root / f).is_file()}
    return index, error, headers, on_disk
