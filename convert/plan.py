"""Headers -> ConvertPlan. Pure: reads no tensor data. Every later stage takes names, dtypes,
shapes and shard assignment from here and never re-decides them."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..core.checkpoint.tensor_model import (
    Checkpoint,
    Projection,
    Quant,
    Role,
    TensorRef,
    moe_layers,
)
from ..core.errors import ContentError
from ..core.files import CONFIG, HF_QUANT_CONFIG, shard_name
from ..core.sources.source_formats import SourceFormat, engine_padding
from ..core.sources.structure import RULES as STRUCTURE_RULES
from ..core.sources.structure import layer_experts
from ..core.targets.engines import MXFP4_NEEDS_BF16, mxfp4_dtype_problem
from ..core.targets.served import refusal, source_block
from ..core.targets.target import MarlinTarget
from ..core.version import __version__
from ..formats.constants import MARLIN_TILE_K
from ..formats.padded_layout import padded_nk, rank_nk
from ..formats.tiles import IMPOSSIBLE, LAYOUT_CANDIDATES, PAD, RankTiles, check_weight_tiles, moe_rank_tiles
from ..runtime.output import refuse_reserved_names
from .safetensors_writer import TensorSpec

__all__ = ["check_structure", "refuse_converted", "check_source", "check_servable", "kept_input_name", "CONVERT_COMMAND", "OutTensor", "ShardPlan", "ConvertPlan",
           "build_plan",
           "serving_layouts", "layout_tiles"]



@dataclass(frozen=True, slots=True)
class OutTensor:
    """One output tensor: a byte copy of `source` (if set), else part `part` of converting `projection`."""
    spec: TensorSpec
    source: TensorRef | None = None
    projection: Projection | None = None
    part: str | None = None
    tiles: RankTiles | None = None  # set for a projection written in the padded per-rank layout (--tp/--ep)


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
    tp_layout: tuple[int, int] | None = None  # --tp/--ep: the one split the output is written for
    rank_tiles: dict[str, RankTiles] = field(default_factory=dict)  # container -> verdict at tp_layout

    @property
    def padded(self) -> bool:
        return any(v.status == PAD for v in self.rank_tiles.values())

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
        for name in (CONFIG, HF_QUANT_CONFIG):
            p = self.checkpoint.root / name
            if p.exists():
                h.update(p.read_bytes())
        return h.hexdigest()


def _projection_outputs(p: Projection, fmt: SourceFormat, target: MarlinTarget,
                        tiles: RankTiles | None = None) -> list[OutTensor]:
    g = p.group_size
    n, k = (p.n, p.k) if tiles is None else padded_nk(p.role is Role.DOWN, tiles)
    out = [
        OutTensor(TensorSpec(f"{p.key}.weight", "I32", (k // MARLIN_TILE_K, 2 * n)), projection=p, part="weight",
                  tiles=tiles),
        OutTensor(TensorSpec(f"{p.key}.weight_scale", "F8_E4M3" if p.quant is Quant.NVFP4 else "F8_E8M0",
                             (k // g, n)), projection=p, part="weight_scale", tiles=tiles),
    ]
    if p.quant is Quant.NVFP4:
        out.append(OutTensor(TensorSpec(f"{p.key}.weight_global_scale", target.global_dtype, ()), projection=p,
                             part="weight_global_scale", tiles=tiles))
        if fmt.global_rule.reciprocal:  # the multiplier is written beside a kept copy of the source's global
            out.append(OutTensor(TensorSpec(f"{p.key}.weight_scale_2", "F32", ()), projection=p, part="weight_scale_2",
                                 tiles=tiles))
        out.append(_keep(p, p.global_scale, f"{p.key}.{fmt.global_rule.kept_as}"))
        if p.input_scale is not None:
            out.append(_keep(p, p.input_scale, kept_input_name(p)))
    return out


def kept_input_name(p: Projection) -> str:
    """Where the converted checkpoint keeps a projection's input scale: under its own name, or for a stacked
    source (one input scale for all experts of the stack) a copy per projection, `P.input_scale`."""
    return p.input_scale.name if p.expert_index is None else f"{p.key}.input_scale"


def _keep(p: Projection, ref: TensorRef, name: str) -> OutTensor:
    """A source tensor kept verbatim (under `name`) so the conversion stays reversible."""
    return OutTensor(TensorSpec(name, ref.dtype, ref.shape), source=ref, projection=p, part="kept")


def _check_convertible(p: Projection, target: MarlinTarget, tiles: RankTiles | None = None) -> None:
    if p.quant is Quant.MXFP4 and mxfp4_dtype_problem(target.act_dtype):
        raise ContentError(
            f"{p.key} is MXFP4, and {MXFP4_NEEDS_BF16}",
            error_id="convert.mxfp4_needs_bf16", tensor=p.weight.name, file=p.weight.file,
            hint="use --act-dtype bfloat16 (MTP experts of NVFP4 DeepSeek-V4 checkpoints are MXFP4 too)")
    if p.quant is Quant.NVFP4 and target.w4a8:
        raise ContentError(f"{p.key} is NVFP4, which has no W4A8 Marlin variant", error_id="convert.w4a8_nvfp4",
                           tensor=p.weight.name, file=p.weight.file, hint="drop --w4a8 (it is for MXFP4 + vllm)")
    try:  # a padded projection: each rank's padded block must be whole tiles
        check_weight_tiles(*((p.n, p.k) if tiles is None else rank_nk(p.role is Role.DOWN, tiles)), w4a8=target.w4a8)
    except ValueError as e:
        raise ContentError(f"{p.key}: {e}", error_id="convert.needs_padding", tensor=p.weight.name,
                           file=p.weight.file, hint=_PAD_HINT) from None


_PAD_HINT = ("convert for one split with --tp N [--ep M] (written padded per rank as the engine pads it), or "
             "serve this checkpoint unconverted (the engine pads at load time); `dsv4-convert plan` shows which "
             "TP/EP splits the engine pads")


def _verdicts(ckpt: Checkpoint, engine: str, tp: int, ep: int, shapes: dict | None = None) -> dict[str, RankTiles]:
    """container -> the tile rule's verdict at TP `tp` / EP `ep`; `shapes`: moe_layers of the checkpoint,
    when the caller has them (one pass over the projections, not one per split)."""
    return {c: moe_rank_tiles(m.quant.value, engine_padding(engine, ckpt.format.value), hidden=m.hidden, intermediate=m.intermediate, tp=tp, ep=ep,
                              experts=layer_experts(ckpt.config, m.layer)[0] or m.experts, gated=m.gated)
            for c, m in (shapes if shapes is not None else moe_layers(ckpt.projections)).items()}


def _split_list(verdicts: dict[tuple[int, int], list[RankTiles]]) -> str:
    ok = [f"TP {t} / EP {e}" for (t, e), vs in verdicts.items() if all(v.ok for v in vs)]
    padded = [f"TP {t} / EP {e}" for (t, e), vs in verdicts.items()
              if all(v.servable for v in vs) and not all(v.ok for v in vs)]
    return (f"unpadded: {', '.join(ok) or 'none'}; padded (--tp/--ep): {', '.join(padded) or 'none'}")


def layout_tiles(ckpt: Checkpoint, engine: str, tp: int, ep: int) -> dict[str, RankTiles]:
    """`--tp/--ep`: container -> the tile rule's verdict at that split. Raises convert.layout_impossible,
    before any work, when some experts layer cannot be served there even with the engine's padding."""
    tiles = _verdicts(ckpt, engine, tp, ep)
    bad = next((v for v in tiles.values() if v.status == IMPOSSIBLE), None)
    if bad is not None:
        name = next(c for c, v in tiles.items() if v is bad)
        others = {tp_ep: list(_verdicts(ckpt, engine, *tp_ep).values()) for tp_ep in LAYOUT_CANDIDATES}
        raise ContentError(
            f"{name} ({bad.fmt}, H={bad.hidden}, I={bad.intermediate}) cannot be served by {engine} at TP {tp} / "
            f"EP {ep}: {bad.reason}", error_id="convert.layout_impossible", tensor=name,
            file=ckpt.index_file or "config.json",
            hint=f"pick a split that works ({_split_list(others)}); `dsv4-convert plan` explains each")
    return tiles


def serving_layouts(ckpt: Checkpoint, engine: str, *, refuse: bool = True) -> tuple[tuple[int, int], ...]:
    """The (TP, EP) splits in {1, 2, 4, 8} that every experts layer serves without padding (formats/tiles.py).
    Raises convert.needs_padding, before any work, when there is none (unless `refuse` is False: --tp/--ep)."""
    shapes = moe_layers(ckpt.projections)
    verdicts = {tp_ep: list(_verdicts(ckpt, engine, *tp_ep, shapes).values()) for tp_ep in LAYOUT_CANDIDATES}
    layouts = tuple(tp_ep for tp_ep, vs in verdicts.items() if all(v.ok for v in vs))
    if refuse and shapes and not layouts:
        m = next(iter(shapes.values()))
        bad = next(v for v in verdicts[(1, 1)] if not v.ok)
        padded = [f"TP {t} / EP {e}" for (t, e), vs in verdicts.items() if all(v.servable for v in vs)]
        raise ContentError(
            f"no TP/EP split in {{1, 2, 4, 8}} serves these experts on {engine} without padding "
            f"({m.quant.value}, H={m.hidden}, I={m.intermediate}; at TP 1: {bad.reason}); layout-agnostic "
            "pre-packed tiles cannot be padded afterwards",
            error_id="convert.needs_padding", tensor=m.container, file=ckpt.index_file or "config.json",
            hint=f"{engine} pads them at " + (", ".join(padded) or "no split: it cannot serve them")
                 + ": convert for one of those with --tp N [--ep M] (the output then serves that split only), "
                 "or serve this checkpoint unconverted (the engine pads at load time)")
    return layouts


def check_structure(ckpt: Checkpoint) -> None:
    """Refuse, before any work, what validate reports as a structure error: the same rules (core/sources/structure.py)."""
    for rule in STRUCTURE_RULES:
        violations = list(rule(ckpt))
        if violations:
            v = violations[0]
            more = f" ({len(violations) - 1} more; `dsv4-convert validate` lists them all)" if len(violations) > 1 else ""
            raise ContentError(v.message + more, error_id=rule.error_id, tensor=v.tensor,
                               file=v.file or ckpt.index_file or "config.json", hint=rule.hint)


def refuse_converted(ckpt: Checkpoint) -> None:
    if ckpt.format.converted:
        raise ContentError(f"{ckpt.root} is already converted to Marlin", error_id="convert.already_marlin",
                           file="config.json", hint="use it as it is, or `dsv4-convert marlin-to-source` to undo")


def check_servable(ckpt: Checkpoint, engine: str) -> None:
    """Refuse, before anything is written, a source whose conversion the `engine` plugin is not proven to serve
    (core/targets/served.py, the table validate's marlin.serving_methods reads too), with the reason."""
    why = refusal(ckpt.config, ckpt.format.value, engine, source_block(ckpt.config, ckpt.hf_quant_config),
                  tensor_names=ckpt.tensors)
    if why is not None:
        raise ContentError(
            f"{ckpt.root} is not proven to serve on {engine} once converted: {why}",
            error_id="convert.unservable_family", file="config.json",
            hint="serve it unconverted, or pass --allow-unservable to convert anyway (the output is validated and "
                 "reversible, but the plugins are not proven to start it); the README's support matrix lists "
                 "what is served")


CONVERT_COMMAND = {q: q.convert_command for q in Quant}


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
               options: dict | None = None, tp: int | None = None, ep: int = 1) -> ConvertPlan:
    """Emit converted tensors at the position of their projection's first source tensor, everything
    else as a byte copy, in input order. Shards mirror the input's unless max_shard_size is set.
    With `tp` (--tp/--ep), containers the engine pads at that split are written in the padded
    per-rank layout (formats/padded_layout.py); the others keep the layout-agnostic bytes."""
    refuse_converted(ckpt)
    refuse_reserved_names(ckpt.root)  # an input file the tool's own would overwrite: refused before any write
    check_structure(ckpt)
    rank_tiles = {} if tp is None else layout_tiles(ckpt, target.engine, tp, ep)
    pads = {c: v for c, v in rank_tiles.items() if v.status == PAD}
    for p in ckpt.projections:
        _check_convertible(p, target, pads.get(p.container))
    layouts = serving_layouts(ckpt, target.engine, refuse=tp is None)
    if pads:
        layouts = ((tp, ep),)  # the padded bytes serve that split only
    elif tp is not None and (tp, ep) not in layouts:  # e.g. --tp 16: unpadded there too
        layouts = (*layouts, (tp, ep))
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
                items.extend((t.file, o) for o in _projection_outputs(p, ckpt.format, target, pads.get(p.container)))
    shards = _mirror_shards(items) if max_shard_size is None else _pack_shards(items, max_shard_size)
    needs_rescale = target.rescales and any(p.quant is Quant.NVFP4 for p in ckpt.projections)
    opts = dict(options or {}, max_shard_size=max_shard_size)
    if tp is not None:  # part of the resume fingerprint: --resume with another --tp/--ep refuses
        opts.update(tp=tp, ep=ep)
    return ConvertPlan(ckpt, target, shards, needs_rescale, opts, layouts,
                       None if tp is None else (tp, ep), rank_tiles)


def _mirror_shards(items) -> tuple[ShardPlan, ...]:
    by_file: dict[str, list[OutTensor]] = {}
    names: dict[str, str] = {}  # a few shards, 10^5 tensors: one Path per shard, not per tensor
    for file, o in items:
        name = names.get(file) or names.setdefault(file, Path(file).name)
        by_file.setdefault(name, []).append(o)
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
    return tuple(ShardPlan(shard_name(i, n), tuple(g)) for i, g in enumerate(groups))
