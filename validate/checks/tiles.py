"""Marlin tile rules per tensor-parallel rank for the requested --tp / --ep (validate/tiles.py)."""

from __future__ import annotations

from collections.abc import Iterator

from dsv4_convert.core.tensor_model import Role, SourceFormat
from dsv4_convert.validate.check import Finding, Scope, Severity, check
from dsv4_convert.validate.checks.structure import model_dims
from dsv4_convert.validate.inputs import CheckpointInput, Options
from dsv4_convert.validate.tiles import moe_shard_verdict

__all__ = ["containers", "tile_rules_per_rank"]


def containers(c: CheckpointInput) -> dict[str, dict]:
    """experts container -> {quant, hidden, intermediate, experts, layer} from the gate/down projections."""
    out: dict[str, dict] = {}
    for p in c.checkpoint.projections:
        name = p.key.rsplit(".", 2)[0]
        info = out.setdefault(name, {"quant": p.quant.value, "layer": p.layer, "experts": set(),
                                     "hidden": None, "intermediate": None})
        info["experts"].add(p.expert)
        if p.role is Role.DOWN:
            info["hidden"], info["intermediate"] = p.n, p.k
        elif info["hidden"] is None:
            info["hidden"], info["intermediate"] = p.k, p.n
    return out


@check(id="structure.tile.tp", severity=Severity.ERROR, scope=Scope.CHECKPOINT,
       hint="choose another --tp/--ep (`dsv4-convert plan` lists the valid ones), or serve the unconverted "
            "source with an engine that pads")
def tile_rules_per_rank(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """Each rank repacks its own shard; a shard that breaks the Marlin tile rule is refused, padded, or (converted) unsliceable."""
    if c.checkpoint is None:
        return
    n_experts = model_dims(c.config)["experts"]
    marlin = c.checkpoint.format is SourceFormat.MARLIN
    seen = {}
    for name, info in containers(c).items():
        if info["hidden"] is None:
            continue
        key = (info["quant"], info["hidden"], info["intermediate"])
        if key in seen:
            seen[key].append(info["layer"])
            continue
        seen[key] = [info["layer"]]
        g = 16 if info["quant"] == "nvfp4" else 32
        v = moe_shard_verdict(hidden=info["hidden"], intermediate=info["intermediate"],
                              experts=n_experts or len(info["experts"]), group=g, quant=info["quant"], tp=opts.tp,
                              ep=opts.ep, engine=opts.engine)
        if v.ok and (v.sliceable or not marlin):
            continue
        if not v.servable or (marlin and not v.sliceable):
            severity = Severity.ERROR
        else:
            severity = Severity.WARNING
        text = "; ".join(v.problems + ([v.padding] if v.padding else []))
        yield Finding(name, f"TP {opts.tp} / EP {opts.ep} ({info['quant']}, H={info['hidden']}, "
                      f"I={info['intermediate']}, I_shard={v.i_shard}): {text}.", severity=severity,
                      layer=info["layer"])
