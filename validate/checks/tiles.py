"""Marlin tile rules per tensor-parallel rank for the requested --tp / --ep (the one rule: formats/tiles.py)."""

from __future__ import annotations

from collections.abc import Iterator

from ...core.checkpoint.tensor_model import moe_layers
from ...core.record.converted_config import read_tp_layout, record_or_none
from ...core.sources.source_formats import engine_padding
from ...core.sources.structure import layer_experts
from ...formats.tiles import moe_rank_tiles
from ..check import Finding, Scope, Severity, check
from ..inputs import CheckpointInput, Options

__all__ = ["containers", "tile_rules_per_rank"]


def containers(c: CheckpointInput) -> dict[str, dict]:
    """experts container -> {quant, hidden, intermediate, experts, layer, gated} (core.tensor_model.moe_layers)."""
    return {name: {"quant": m.quant.value, "layer": m.layer, "experts": m.experts, "hidden": m.hidden,
                   "intermediate": m.intermediate, "gated": m.gated}
            for name, m in moe_layers(c.checkpoint.projections).items()}


@check(id="structure.tile.tp", severity=Severity.ERROR, scope=Scope.CHECKPOINT,
       hint="choose another --tp/--ep (`dsv4-convert plan` lists the valid ones), or serve the unconverted "
            "source with an engine that pads")
def tile_rules_per_rank(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """Each rank repacks its own shard; a shard that breaks the Marlin tile rule is refused, padded, or (converted) unsliceable."""
    if c.checkpoint is None:
        return
    marlin = c.checkpoint.format.converted
    padded = {}
    if marlin:  # a --tp/--ep output serves the one split it records (the plugin refuses any other)
        try:
            layout = read_tp_layout(c.config)
        except ValueError as e:
            yield Finding("config.json", f"quantization_config.tp_layout cannot be used: {e}.")
            return
        if layout is not None:
            tp, ep, padded = layout
            if (opts.tp, opts.ep) != (tp, ep):
                yield Finding("config.json", f"converted for TP {tp} / EP {ep} only (quantization_config.tp_layout"
                              f"{', experts padded per rank' if padded else ''}), but validating for TP {opts.tp} / "
                              f"EP {opts.ep}: the plugin refuses any other split. Leave out --tp/--ep (validate "
                              f"takes the recorded layout), or convert the source again with --tp {opts.tp} "
                              f"--ep {opts.ep}.")
                return
    record = record_or_none(c.config) if marlin else None  # the padding of the engine's method for the source
    padding = engine_padding(opts.target.engine, record.source_format if record else c.checkpoint.format.value)
    seen = {}
    for name, info in containers(c).items():
        if info["hidden"] is None or name in padded:  # padded: written for exactly this split (tp_layout)
            continue
        experts = layer_experts(c.config, info["layer"])[0] or info["experts"]  # a draft layer: its own count
        key = (info["quant"], info["hidden"], info["intermediate"], info["gated"], experts)
        if key in seen:
            seen[key].append(info["layer"])
            continue
        seen[key] = [info["layer"]]
        v = moe_rank_tiles(info["quant"], padding, hidden=info["hidden"], intermediate=info["intermediate"],
                           tp=opts.tp, ep=opts.ep, experts=experts, gated=info["gated"])
        if v.ok:
            continue
        # a source is padded by the engine at load (a warning); pre-packed tiles cannot be padded afterwards
        severity = Severity.WARNING if v.servable and not marlin else Severity.ERROR
        text = v.reason + (": converted (pre-packed) tensors cannot be sliced for this split" if marlin and
                           v.servable else "")
        yield Finding(name, f"TP {opts.tp} / EP {opts.ep} ({info['quant']}, H={info['hidden']}, "
                      f"I={info['intermediate']}, I_shard={v.i_shard}): {text}.", severity=severity,
                      layer=info["layer"])
