"""Byte- and JSON-level edits that damage a copy of a synth checkpoint in one precise way.

Every helper edits files in place under a checkpoint root that the test owns (see `copy_checkpoint`);
none of them goes through safetensors, so the damage is exactly what the helper says and nothing is
"repaired" on the way (a safetensors writer would refuse to write most of these files).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "INDEX",
    "Shard",
    "add_tensor",
    "copy_checkpoint",
    "drop_tensors",
    "edit_header",
    "edit_json",
    "poke_tensor_bytes",
    "read_shard",
    "shard_of",
    "write_shard",
]

INDEX = "model.safetensors.index.json"


def copy_checkpoint(src: Path, dst: Path) -> Path:
    """A writable copy of a (read-only, shared) checkpoint."""
    shutil.copytree(src, dst)
    for p in [dst, *dst.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    return dst


class Shard:
    """A shard split into its three parts: the raw header bytes, the parsed header, the data buffer."""

    def __init__(self, raw_header: bytes, data: bytes):
        self.raw_header = raw_header
        self.header: dict = json.loads(raw_header)
        self.data = data

    def tensors(self) -> dict[str, dict]:
        return {k: v for k, v in self.header.items() if k != "__metadata__"}


def read_shard(path: Path) -> Shard:
    buf = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", buf[:8])
    return Shard(buf[8:8 + n], buf[8 + n:])


def write_shard(path: Path, header: dict | bytes, data: bytes, *, length: int | None = None) -> None:
    """Write a shard from a header (a dict is serialized compactly) and a data buffer; `length`
    overrides the 8-byte length field (to lie about the header size)."""
    raw = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    Path(path).write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)


def edit_header(path: Path, edit: Callable[[dict], None]) -> None:
    """Apply `edit` to the parsed header in place and write it back; the data buffer is unchanged."""
    shard = read_shard(path)
    edit(shard.header)
    write_shard(path, shard.header, shard.data)


def add_tensor(path: Path, name: str, dtype: str, shape: list[int], payload: bytes) -> None:
    """Append one tensor (entry + bytes) at the end of the data buffer."""
    shard = read_shard(path)
    end = len(shard.data)
    shard.header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [end, end + len(payload)]}
    write_shard(path, shard.header, shard.data + payload)


def drop_tensors(path: Path, names: set[str]) -> None:
    """Remove tensors from a shard and close the holes they leave (a valid, smaller shard)."""
    shard = read_shard(path)
    kept = sorted(((k, v) for k, v in shard.tensors().items() if k not in names),
                  key=lambda kv: kv[1]["data_offsets"][0])
    header = {"__metadata__": shard.header["__metadata__"]} if "__metadata__" in shard.header else {}
    data, pos = bytearray(), 0
    for k, v in kept:
        begin, end = v["data_offsets"]
        data += shard.data[begin:end]
        header[k] = dict(v, data_offsets=[pos, pos + end - begin])
        pos += end - begin
    write_shard(path, header, bytes(data))


def poke_tensor_bytes(path: Path, name: str, at: int, values: bytes) -> None:
    """Overwrite bytes `at..` of tensor `name`'s data (header untouched)."""
    shard = read_shard(path)
    begin, end = shard.header[name]["data_offsets"]
    assert begin + at + len(values) <= end, "poke stays inside the tensor"
    data = bytearray(shard.data)
    data[begin + at:begin + at + len(values)] = values
    write_shard(path, shard.raw_header, bytes(data))


def edit_json(path: Path, edit: Callable[[dict], None]) -> None:
    obj = json.loads(Path(path).read_text())
    edit(obj)
    Path(path).write_text(json.dumps(obj, indent=2))


def shard_of(root: Path, tensor: str) -> Path:
    """The shard file that the index names for `tensor`."""
    return root / json.loads((root / INDEX).read_text())["weight_map"][tensor]
