"""Headers -> ConvertPlan. Pure: reads no tensor data. Every later stage takes names, dtypes,
shapes and shard assignment from here and never re-decides them."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from dsv4_convert import __version__
from dsv4_convert.core.engines import FORMAT_VERSION, MXFP4_NEEDS_BF16, mxfp4_dtype_problem
from dsv4_convert.core.errors import ContentError
from dsv4_convert.core.rescale import rescales
from dsv4_convert.core.structure import RULES as STRUCTURE_RULES
from dsv4_convert.core.structure import model_dims
from dsv4_convert.core.tensor_model import (
    Checkpoint,
    Projection,
    Quant,
    SourceFormat,
    TensorRef,
    moe_layers,
)
from dsv4_convert.formats.constants import MARLIN_TILE_K
from dsv4_convert.formats.marlin import MarlinTarget
from dsv4_convert.formats.tiles import LAYOUT_CANDIDATES, check_weight_tiles, moe_rank_tiles
from dsv4_convert.safetensors_writer import TensorSpec

__all__ = ["check_structure", "refuse_converted", "check_source", "CONVERT_COMMAND", "OutTensor", "ShardPlan", "ConvertPlan",
           "build_plan", "FORMAT_VERSION",
           "serving_layouts"]

_GLOBAL_DTYPE = {"float16": "F16", "bfloat16": "BF16"}


@dataclass(frozen=True, slots=True)
class OutTensor:
    """One output tensor: a byte copy of `source` (if set), else part `part` of converting `projection`."""
    spec: TensorSpec
    source: TensorRef | None = None
    projection: Projection | None = None
    part: str | None = None


@dataclass(frozen=True, slots=True)
class ShardPlan:
    file: str
    tensors: tuple[OutTensor, ...]

    @property
    def nbytes(self) -> int:
        return sum(t.spec.nbytes for t in self.tensors)


@dataclass(frozen=True)
class ConvertPlan:
    checkpoint: Checkpoint
    target: MarlinTarget
    shards: tuple[ShardPlan, ...]
    needs_rescale: bool  # vllm + bf16 + NVFP4: a planning pass over the scales picks sf per stack
    options: dict = field(default_factory=dict)
    layouts: tuple[tuple[int, int], ...] = ()  # (TP, EP) splits every experts layer serves unpadded

    @property
    def projections(self) -> tuple[Projection, ...]:
        return self.checkpoint.projections

    @property
    def output_bytes(self) -> int:
        return sum(s.nbytes for s in self.shards)

    def fingerprint(self) -> str:
        """Identifies input + options + tool version: a staged run resumes only under the same one."""
        h = hashlib.sha256()
        h.update(json.dumps({"version": __version__, "target": [self.target.engine, self.target.act_dtype,
                             self.target.w4a8], "options": self.options}, sort_keys=True).encode())
        for t in self.checkpoint.tensors.values():
            h.update(f"{t.name}|{t.file}|{t.dtype}|{t.shape}|{t.begin}|{t.end}\n".encode())
        for name in ("config.json", "hf_quant_config.json"):
            p = self.checkpoint.root / name
            if p.exists():
                h.update(p.read_bytes())
        return h.hexdigest()


def _projection_outputs(p: Projection, fmt: SourceFormat, target: MarlinTarget) -> list[OutTensor]:
    g = p.group_size
    out = [
        OutTensor(TensorSpec(f"{p.key}.weight", "I32", (p.k // MARLIN_TILE_K, 2 * p.n)), projection=p, part="weight"),
        OutTensor(TensorSpec(f"{p.key}.weight_scale", "F8_E4M3" if p.quant is Quant.NVFP4 else "F8_E8M0",
                             (p.k // g, p.n)), projection=p, part="weight_scale"),
    ]
    if p.quant is Quant.NVFP4:
        gdt = "F32" if target.engine == "vllm" else _GLOBAL_DTYPE[target.act_dtype]
        out.append(OutTensor(TensorSpec(f"{p.key}.weight_global_scale", gdt, ()), projection=p,
                             part="weight_global_scale"))
        if fmt is SourceFormat.NVFP4_CT:
            out.append(OutTensor(TensorSpec(f"{p.key}.weight_scale_2", "F32", ()), projection=p, part="weight_scale_2"))
            out.append(_keep(p, p.global_scale, f"{p.key}.ct_weight_global_scale"))
        else:
            out.append(_keep(p, p.global_scale, f"{p.key}.weight_scale_2"))
        if p.input_scale is not None:
            out.append(_keep(p, p.input_scale, p.input_scale.name))
    return out


def _keep(p: Projection, ref: TensorRef, name: str) -> OutTensor:
    """A source tensor kept verbatim (under `name`) so the conversion stays reversible."""
    return OutTensor(TensorSpec(name, ref.dtype, ref.shape), source=ref, projection=p, part="kept")


def _check_convertible(p: Projection, target: MarlinTarget) -> None:
    if p.quant is Quant.MXFP4 and mxfp4_dtype_problem(target.act_dtype):
        raise ContentError(
            f"{p.key} is MXFP4, and {MXFP4_NEEDS_BF16}",
            error_id="convert.mxfp4_needs_bf16", tensor=p.weight.name, file=p.weight.file,
            hint="use --act-dtype bfloat16 (MTP experts of NVFP4 DeepSeek-V4 checkpoints are MXFP4 too)")
    if p.quant is Quant.NVFP4 and target.w4a8:
        raise ContentError(f"{p.key} is NVFP4, which has no W4A8 Marlin variant", error_id="convert.w4a8_nvfp4",
                           tensor=p.weight.name, file=p.weight.file, hint="drop --w4a8 (it is for MXFP4 + vllm)")
    try:
        check_weight_tiles(p.n, p.k, w4a8=target.w4a8)
    except ValueError as e:
        raise ContentError(f"{p.key}: {e}", error_id="convert.needs_padding", tensor=p.weight.name,
                           file=p.weight.file, hint=_PAD_HINT) from None


_PAD_HINT = ("serve this checkpoint unconverted (the engine pads at load time); `dsv4-convert plan` "
             "shows which TP/EP splits the engine pads")


def serving_layouts(ckpt: Checkpoint, engine: str) -> tuple[tuple[int, int], ...]:
    """The (TP, EP) splits in {1, 2, 4, 8} that every experts layer serves without padding (formats/tiles.py).
    Raises convert.needs_padding, before any work, when there is none."""
    shapes = moe_layers(ckpt.projections)
    n = model_dims(ckpt.config)["experts"]
    verdicts = {tp_ep: [moe_rank_tiles(m.quant.value, engine, hidden=m.hidden, intermediate=m.intermediate,
                                       tp=tp_ep[0], ep=tp_ep[1], experts=n or m.experts) for m in shapes.values()]
                for tp_ep in LAYOUT_CANDIDATES}
    layouts = tuple(tp_ep for tp_ep, vs in verdicts.items() if all(v.ok for v in vs))
    if shapes and not layouts:
        m = next(iter(shapes.values()))
        bad = next(v for v in verdicts[(1, 1)] if not v.ok)
        padded = [f"TP {t} / EP {e}" for (t, e), vs in verdicts.items() if all(v.servable for v in vs)]
        raise ContentError(
            f"no TP/EP split in {{1, 2, 4, 8}} serves these experts on {engine} without padding "
            f"({m.quant.value}, H={m.hidden}, I={m.intermediate}; at TP 1: {bad.reason}); pre-packed tiles "
            "cannot be padded afterwards, so this tool does not convert them",
            error_id="convert.needs_padding", tensor=m.container, file=ckpt.index_file or "config.json",
            hint=f"{_PAD_HINT}; {engine} pads them at " + (", ".join(padded) or "no split: it cannot serve them"))
    return layouts


def check_structure(ckpt: Checkpoint) -> None:
    """Refuse, before any work, what validate reports as a structure error: the same rules (core/structure.py)."""
    for rule in STRUCTURE_RULES:
        violations = list(rule(ckpt))
        if violations:
            v = violations[0]
            more = f" ({len(violations) - 1} more; `dsv4-convert validate` lists them all)" if len(violations) > 1 else ""
            raise ContentError(v.message + more, error_id=rule.error_id, tensor=v.tensor,
                               file=v.file or ckpt.index_file or "config.json", hint=rule.hint)


def refuse_converted(ckpt: Checkpoint) -> None:
    if ckpt.format is SourceFormat.MARLIN:
        raise ContentError(f"{ckpt.root} is already converted to Marlin", error_id="convert.already_marlin",
                           file="config.json", hint="use it as it is, or `dsv4-convert marlin-to-source` to undo")


CONVERT_COMMAND = {Quant.NVFP4: "nvfp4-to-marlin", Quant.MXFP4: "mxfp4-to-marlin"}


def check_source(ckpt: Checkpoint, quant: Quant) -> None:
    """Refuse a checkpoint the converter for `quant` cannot take: converted, no FP4 experts, or the other FP4."""
    refuse_converted(ckpt)
    found = ckpt.routed_quant
    if found is None:
        raise ContentError(f"no FP4 expert projections found in {ckpt.root} (detected {ckpt.format.value})",
                           error_id="convert.no_projections", hint="run `dsv4-convert inspect` on it")
    if found is not quant:
        raise ContentError(f"{ckpt.root} holds {found.value.upper()} experts ({ckpt.format.value})",
                           error_id="convert.wrong_command", hint=f"use `dsv4-convert {CONVERT_COMMAND[found]}`")


def build_plan(ckpt: Checkpoint, target: MarlinTarget, *, max_shard_size: int | None = None,
               options: dict | None = None) -> ConvertPlan:
    """Emit converted tensors at the position of their projection's first source tensor, everything
    else as a byte copy, in input order. Shards mirror the input's unless max_shard_size is set."""
    refuse_converted(ckpt)
    check_structure(ckpt)
    for p in ckpt.projections:
        _check_convertible(p, target)
    layouts = serving_layouts(ckpt, target.engine)
    owners: dict[str, list[Projection]] = {}  # a stacked tensor (gpt-oss) feeds many projections
    for p in ckpt.projections:
        for r in p.source_refs:
            owners.setdefault(r.name, []).append(p)
    emitted: set[str] = set()
    items: list[tuple[str, OutTensor]] = []  # (input shard, output tensor)
    for t in sorted(ckpt.tensors.values(), key=lambda t: (t.file, t.begin)):
        if t.name not in owners:
            items.append((t.file, OutTensor(TensorSpec(t.name, t.dtype, t.shape), source=t)))
            continue
        for p in owners[t.name]:
            if p.key not in emitted:
                emitted.add(p.key)
                items.extend((t.file, o) for o in _projection_outputs(p, ckpt.format, target))
    shards = _mirror_shards(items) if max_shard_size is None else _pack_shards(items, max_shard_size)
    needs_rescale = rescales(target.engine, target.act_dtype) and any(p.quant is Quant.NVFP4 for p in ckpt.projections)
    return ConvertPlan(ckpt, target, shards, needs_rescale, dict(options or {}, max_shard_size=max_shard_size),
                       layouts)


def _mirror_shards(items) -> tuple[ShardPlan, ...]:
    by_file: dict[str, list[OutTensor]] = {}
    for file, o in items:
        by_file.setdefault(Path(file).name, []).append(o)
    return tuple(ShardPlan(f, tuple(ts)) for f, ts in by_file.items())


def _pack_shards(items, max_bytes: int) -> tuple[ShardPlan, ...]:
    groups: list[list[OutTensor]] = [[]]
    size = 0
    for _, o in items:
        # the outputs of one projection stay together in one shard
        if groups[-1] and size + o.spec.nbytes > max_bytes and (o.projection is None or o.part == "weight"):
            groups.append([])
            size = 0
        groups[-1].append(o)
        size += o.spec.nbytes
    n = len(groups)
    return tuple(ShardPlan(f"model-{i + 1:05d}-of-{n:05d}.safetensors", tuple(g)) for i, g in enumerate(groups))
