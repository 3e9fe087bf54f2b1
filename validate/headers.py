"""The validator's own strict scan of `model.safetensors.index.json` and every shard header.

The reader refuses a broken checkpoint at the first problem; this scan lists every problem, file by
file, so that `validate` can report them all as findings (safetensors layout: an 8-byte
little-endian header length, a JSON header, then the data buffer; offsets relative to the buffer).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from ..tensor_model import DTYPE_SIZES
from .inputs import HeaderInfo

__all__ = ["INDEX_FILE", "scan_checkpoint", "scan_header", "scan_index"]

INDEX_FILE = "model.safetensors.index.json"
_MAX_HEADER = 100_000_000
_MAX_NUMEL = 1 << 64  # no file holds more elements; stopping here bounds the work on a forged shape


def _uint(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _numel(shape: tuple[int, ...]) -> int | None:
    if 0 in shape:
        return 0
    numel = 1
    for d in shape:
        numel *= d
        if numel > _MAX_NUMEL:
            return None
    return numel


def scan_index(root: Path) -> tuple[dict | None, str | None]:
    path = root / INDEX_FILE
    if not path.exists():
        return None, None
    try:
        index = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return None, f"{INDEX_FILE} is not valid JSON: {e}"
    if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):
        return None, f"{INDEX_FILE} has no 'weight_map' object"
    return index, None


def scan_header(path: Path, file: str) -> HeaderInfo:
    size = path.stat().st_size
    problems: list[str] = []
    tensors: dict = {}
    try:
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return HeaderInfo(file, size, {}, f"file is {size} bytes, too short for the 8-byte header length")
            (n,) = struct.unpack("<Q", head)
            if n > _MAX_HEADER or 8 + n > size:
                return HeaderInfo(file, size, {}, f"header length {n} runs past the end of the file ({size} bytes)")
            raw = f.read(n)
        header = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError) as e:
        return HeaderInfo(file, size, {}, f"header is not valid JSON: {str(e)[:200]}")
    if not isinstance(header, dict):
        return HeaderInfo(file, size, {}, "header is not a JSON object")
    base = 8 + n
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
        except (KeyError, TypeError, ValueError):
            problems.append(f"{name}: malformed entry {entry!r:.200}")
            continue
        if not (isinstance(dtype, str) and all(map(_uint, shape)) and _uint(begin) and _uint(end)):
            problems.append(f"{name}: malformed entry {entry!r:.200} (want a dtype string, a shape and "
                            "data_offsets of non-negative integers)")
            continue
        if dtype not in DTYPE_SIZES and dtype != "F4":
            problems.append(f"{name}: unknown dtype {dtype!r}")
            continue
        numel = _numel(shape)
        if numel is None:
            problems.append(f"{name}: shape {list(shape)!r:.200} has more than 2**64 elements")
            continue
        nbytes = numel // 2 if dtype == "F4" else numel * DTYPE_SIZES[dtype]
        if end - begin != nbytes or begin < 0:
            problems.append(f"{name}: offsets [{begin}, {end}) hold {end - begin} bytes, {dtype} {list(shape)} "
                            f"needs {nbytes}")
        tensors[name] = (dtype, shape, base + begin, base + end)
        spans.append((begin, end, name))
    spans.sort()
    pos = 0
    for begin, end, name in spans:
        if begin < pos:
            problems.append(f"{name}: offsets [{begin}, {end}) overlap the previous tensor (ends at {pos})")
        elif begin > pos:
            problems.append(f"{name}: {begin - pos} unused bytes before it (a hole in the data buffer)")
        pos = max(pos, end)
    return HeaderInfo(file, size, tensors, "; ".join(problems) or None)


def scan_checkpoint(root: Path) -> tuple[dict | None, str | None, dict[str, HeaderInfo], tuple[str, ...]]:
    """(index, index error, headers of the shards that exist, *.safetensors files on disk)."""
    index, error = scan_index(root)
    on_disk = tuple(sorted(p.name for p in root.glob("*.safetensors")))
    wanted = set(on_disk)
    if index is not None:
        wanted |= set(index["weight_map"].values())
    headers = {f: scan_header(root / f, f) for f in sorted(wanted) if (root / f).is_file()}
    return index, error, headers, on_disk
