"""Injectable defects for `synth`: each one hits one fixed, documented place so validator tests can
find it. Every defect is recorded in `synth.json` ("defects": one entry per defect, see `DefectRecord`).

Targets are in layer "0"; `expert` is taken modulo the number of experts. Scale defects change the
first block scale of row 0 (`[0, 0]`; gpt-oss: `[expert, row, 0]`), except `subnormal-scale`, which
writes bytes 0x01..0x07 into the first (up to) 7 block scales of row 0.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..core.checkpoint.tensor_model import Quant
from ..core.errors import UsageError
from ..core.files import CONFIG
from ..core.sources.source_formats import source_format, synth_formats
from .experts import ROLES, Tweaks, expert_quant, expert_slot

__all__ = [
    "DEFECTS",
    "DefectRecord",
    "DefectSpec",
    "apply_file_defects",
    "apply_tensor_defects",
    "check_defects",
    "tweaks_for",
]

# the formats synth writes (the source-format table's rows with a `synth` entry), by what their experts hold
_NVFP4 = tuple(f for f in synth_formats() if source_format(f).trunk is Quant.NVFP4)
_MXFP4 = tuple(f for f in synth_formats() if source_format(f).trunk is Quant.MXFP4)
_ALL = _NVFP4 + _MXFP4
_NOT_STACKED = tuple(f for f in _ALL if source_format(f).suffixes is not None)  # one tensor per projection


@dataclass(frozen=True, slots=True)
class DefectSpec:
    name: str
    formats: tuple[str, ...]
    expert: int | None  # target expert in layer 0 (mod experts); None for file-level defects
    roles: tuple[str, ...]  # projections it touches
    doc: str


DEFECTS = {d.name: d for d in (
    DefectSpec("nan-scale", _NVFP4, 1, ("gate",), "E4M3 block scale byte 0x7F (NaN) at [0, 0]"),
    DefectSpec("negative-scale", _NVFP4, 1, ("up",), "sign bit set on the E4M3 block scale at [0, 0]"),
    DefectSpec("subnormal-scale", _NVFP4, 1, ("down",), "E4M3 subnormal bytes 0x01..0x07 in row 0"),
    DefectSpec("zero-scale", _NVFP4, 2, ("gate",), "E4M3 block scale 0x00 at [0, 0]"),
    DefectSpec("e8m0-nan", _MXFP4, 1, ("gate",), "E8M0 scale byte 0xFF (NaN) at [0, 0]"),
    DefectSpec("e8m0-overflow", _MXFP4, 1, ("up",), "E8M0 scale byte 253 (2**126) at [0, 0]"),
    DefectSpec("missing-expert", _NOT_STACKED, 3, ROLES,
               "every tensor of the expert is absent from the shards and the index"),
    DefectSpec("swapped-nibbles", _ALL, 2, ("down",), "the two nibbles of every weight byte swapped"),
    DefectSpec("global-mismatch", _NVFP4, 4, ("gate", "up"),
               "gate and up quantized with their own global scale instead of a shared one"),
    DefectSpec("all-zero-expert", _ALL, 5, ROLES, "the expert's matrices are all zero before quantizing"),
    DefectSpec("nan-global", _NVFP4, 2, ("up",), "NaN global scale (weight_scale_2 / weight_global_scale)"),
    DefectSpec("truncated-shard", _ALL, None, (), "the last shard is cut to half of its data after writing"),
    DefectSpec("missing-shard", _ALL, None, (), "the last shard is deleted; the index still points to it"),
    DefectSpec("reshaped-down", _NOT_STACKED, 0, ("down",),
               "down weight and scale stored as [I, H/2] / [I, H/g] (same bytes, the gate/up shape)"),
    DefectSpec("empty-expert", _NOT_STACKED, 0, ("gate",), "gate weight and block scale with 0 rows"),
    DefectSpec("config-intermediate", _ALL, None, (), "config.json's expert intermediate size doubled"),
    DefectSpec("experts-beyond-config", _ALL, None, (), "config.json's n_routed_experts one less than the experts"),
)}


@dataclass(slots=True)
class DefectRecord:
    """One entry of synth.json "defects". `tensors` are the affected tensor names (for missing-expert:
    the names that would have existed), `positions` the element indices changed in `tensors[0]`."""
    defect: str
    layer: str | None
    expert: int | None
    roles: list[str]
    tensors: list[str]
    file: str | None = None
    positions: list[list[int]] | None = None
    detail: dict = field(default_factory=dict)

    def as_json(self) -> dict:
        return asdict(self)


# defect -> (bytes written into row 0's first block scales, or None to OR `mask` into [0, 0])
_SCALE_EDITS = {
    "nan-scale": ([0x7F], 0), "negative-scale": (None, 0x80), "subnormal-scale": (list(range(1, 8)), 0),
    "zero-scale": ([0x00], 0), "e8m0-nan": ([0xFF], 0), "e8m0-overflow": ([253], 0),
}


def _target(spec: DefectSpec, experts: int) -> int | None:
    return None if spec.expert is None else spec.expert % experts


def check_defects(defects: tuple[str, ...], fmt: str, experts: int) -> None:
    """Refuse unknown, inapplicable, repeated or overlapping defects, all problems at once."""
    problems = []
    for name in defects:
        spec = DEFECTS.get(name)
        if spec is None:
            problems.append(f"unknown defect {name!r} (known: {', '.join(DEFECTS)})")
        elif fmt not in spec.formats:
            problems.append(f"defect {name!r} does not apply to {fmt} (it applies to {', '.join(spec.formats)})")
    if len(set(defects)) != len(defects):
        problems.append("a defect is given more than once")
    if not problems:
        claimed: dict[tuple[int, str], str] = {}
        for name in defects:
            spec = DEFECTS[name]
            for role in spec.roles:
                key = (_target(spec, experts), role)
                if key in claimed:
                    problems.append(f"defects {claimed[key]!r} and {name!r} both hit expert {key[0]} {role} "
                                    f"with {experts} experts")
                claimed[key] = name
        if {"truncated-shard", "missing-shard"} <= set(defects):
            problems.append("truncated-shard and missing-shard both hit the last shard")
    if problems:
        raise UsageError("; ".join(problems), error_id="synth.defect",
                         hint="pick defects from the list for this format; use at least 6 experts to combine "
                              "expert-level defects")


def tweaks_for(defects: tuple[str, ...], experts: int) -> Tweaks:
    def pairs(name):
        return frozenset({("0", _target(DEFECTS[name], experts))} if name in defects else ())
    return Tweaks(missing=pairs("missing-expert"), zero=pairs("all-zero-expert"),
                  own_globals=pairs("global-mismatch"))


def _row0(slot, count: int = 1) -> list[tuple[int, ...]]:
    if slot.index is not None:
        e, row, _ = slot.index
        return [(e, row, j) for j in range(count)]
    return [(0, j) for j in range(count)]


def _set_scale_bytes(tensors: dict, slot, values: list[int] | None, or_mask: int = 0) -> list[list[int]]:
    t = tensors[slot.scale]
    raw = t.view(torch.uint8)
    n = len(values) if values else 1
    positions = _row0(slot, min(n, t.shape[-1]))
    for i, pos in enumerate(positions):
        raw[pos] = values[i] if values else raw[pos].item() | or_mask
    return [list(p) for p in positions]


def _swap_nibbles(tensors: dict, slot) -> dict:
    t = tensors[slot.weight]
    region = t.view(torch.uint8)
    if slot.index is not None:
        e, row, step = slot.index
        region = region[e, row::step]
    before = region.contiguous().numpy().tobytes()
    region.copy_(((region & 0x0F) << 4) | (region >> 4))
    return {"original_sha256": hashlib.sha256(before).hexdigest(),
            "swapped_sha256": hashlib.sha256(region.contiguous().numpy().tobytes()).hexdigest(),
            "rows": None if slot.index is None else f"[{slot.index[0]}, {slot.index[1]}::{slot.index[2]}]"}


def apply_tensor_defects(tensors: dict, defects: tuple[str, ...], fmt: str, experts: int) -> list[DefectRecord]:
    """Edit `tensors` in place for the byte-level defects; describe every defect (files filled later)."""
    records = []
    for name in defects:
        spec = DEFECTS[name]
        e = _target(spec, experts)
        slots = [expert_slot(fmt, "0", e, r) for r in spec.roles] if e is not None else []
        rec = DefectRecord(name, "0" if e is not None else None, e, list(spec.roles), [])
        if name in _SCALE_EDITS:
            values, mask = _SCALE_EDITS[name]
            rec.tensors = [slots[0].scale]
            rec.positions = _set_scale_bytes(tensors, slots[0], values, or_mask=mask)
        elif name == "swapped-nibbles":
            rec.tensors = [slots[0].weight]
            rec.detail = _swap_nibbles(tensors, slots[0])
        elif name == "nan-global":
            rec.tensors = [slots[0].global_scale]
            tensors[slots[0].global_scale].fill_(float("nan"))
        elif name == "global-mismatch":
            rec.tensors = [s.global_scale for s in slots]
            rec.detail = {"globals": [tensors[s.global_scale].reshape(-1)[0].item() for s in slots]}
        elif name in ("reshaped-down", "empty-expert"):
            rec.tensors = [slots[0].weight, slots[0].scale]
            inner = tensors[slots[0].weight].shape[1] * 2  # K of the down projection: I
            for t in rec.tensors:  # reshaped: [H, I/2] -> [I, H/2] and [H, I/g] -> [I, H/g]
                tensors[t] = tensors[t][:0] if name == "empty-expert" else tensors[t].reshape(inner, -1)
        elif name in ("missing-expert", "all-zero-expert"):
            rec.tensors = list(dict.fromkeys(
                n for s in slots for n in (s.weight, s.scale, s.global_scale, s.input_scale) if n))
        rec.detail.setdefault("what", spec.doc)
        if e is not None:
            rec.detail["quant"] = expert_quant(fmt, "0")
        records.append(rec)
    return records


def apply_file_defects(file: Callable[[str], Path], shard_files: list[str], records: list[DefectRecord]) -> None:
    """Damage the written shards for truncated-shard / missing-shard (the index stays untouched), and
    config.json for the config defects. `file`: where a written file lies (the output tree's `file`)."""
    last = file(shard_files[-1])
    for rec in records:
        if rec.defect in _CONFIG_EDITS:
            _edit_config(file(CONFIG), rec)
        if rec.defect == "truncated-shard":
            size = last.stat().st_size
            with open(last, "rb") as f:
                header_end = 8 + int.from_bytes(f.read(8), "little")
            new_size = header_end + (size - header_end) // 2
            os.truncate(last, new_size)
            rec.file, rec.detail["original_size"], rec.detail["size"] = last.name, size, new_size
        elif rec.defect == "missing-shard":
            last.unlink()
            rec.file = last.name


# defect -> (config keys, the first present one is edited; new value from the old one)
_CONFIG_EDITS = {
    "config-intermediate": (("moe_intermediate_size", "intermediate_size"), lambda v: 2 * v),
    "experts-beyond-config": (("n_routed_experts", "num_local_experts", "num_experts"), lambda v: v - 1),
}


def _edit_config(path: Path, rec: DefectRecord) -> None:
    keys, change = _CONFIG_EDITS[rec.defect]
    config = json.loads(path.read_text())
    text = config.get("text_config") or config
    key = next(k for k in keys if k in text)
    rec.file, rec.detail["key"], rec.detail["original"] = path.name, key, text[key]
    text[key] = change(text[key])
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
