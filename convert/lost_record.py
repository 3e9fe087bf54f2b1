"""`dsv4-convert-source/lost_scales.safetensors`, read back by marlin-to-source: the NVFP4 block scale
bytes a target cannot represent, as `{key}.index` (int64 flat indices into the source [N, K/16] scale)
and `{key}.bytes` (uint8, the original bytes). Every entry is checked before it is used, so a damaged
or edited record is refused (reverse.bad_source_record) instead of crashing or writing wrong bytes:
the pairs, dtypes and lengths at load; at use, indices inside the scale and unique, each original
byte one the target loses, and each decoded byte what the target makes of it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..core.errors import InputError

__all__ = ["bad_record", "check_lost_record", "restore_lost"]


def bad_record(path: Path | str, why: str):
    # the manifest check catches edits; this guards the reader itself (a record edited with its manifest)
    raise InputError(f"the source record {Path(path).name} cannot be used: {why}",
                     error_id="reverse.bad_source_record", file=str(path),
                     hint="convert again from the source; the record is damaged")


def check_lost_record(lost: dict, path: Path, nvfp4_keys: set[str]) -> None:
    """The record's shape: `.index`/`.bytes` pairs of 1-D int64 / uint8 of one length, for NVFP4
    projections of the converted checkpoint."""
    for name, t in lost.items():
        key, _, part = name.rpartition(".")
        partner = f"{key}.{'bytes' if part == 'index' else 'index'}"
        if part not in ("index", "bytes") or partner not in lost:
            bad_record(path, f"entry {name!r} is not one of a {{projection}}.index / .bytes pair")
        if key not in nvfp4_keys:
            bad_record(path, f"entry {name!r} names no NVFP4 projection of this checkpoint")
        want = torch.int64 if part == "index" else torch.uint8
        if t.dtype != want or t.dim() != 1 or t.numel() != lost[partner].numel():
            bad_record(path, f"entry {name!r} is {t.dtype} {list(t.shape)}; expected 1-D {want} of the length "
                       f"of {partner!r} ({list(lost[partner].shape)})")


def restore_lost(scale: torch.Tensor, key: str, lost: dict, round_trip: np.ndarray, path: Path | str) -> None:
    """Put the recorded original bytes of projection `key` back into its decoded scale (uint8, in place)."""
    if f"{key}.index" not in lost:
        return
    flat = scale.view(torch.uint8).reshape(-1)
    idx, orig = lost[f"{key}.index"].numpy(), lost[f"{key}.bytes"].numpy()
    if idx.size and (idx.min() < 0 or idx.max() >= flat.numel()):
        bad_record(path, f"{key}: an index lies outside its scale of {flat.numel()} bytes")
    if np.unique(idx).size != idx.size:
        bad_record(path, f"{key}: an index is recorded twice")
    stored = flat.numpy()[idx]
    wrong = (round_trip[orig] == orig) | (round_trip[orig] != stored)
    if wrong.any():
        i = int(np.argmax(wrong))
        bad_record(path, f"{key}: scale byte {int(idx[i])} is {int(stored[i]):#04x}, which the target does not "
                   f"make of the recorded original {int(orig[i]):#04x}")
    flat[torch.from_numpy(idx)] = torch.from_numpy(orig)
