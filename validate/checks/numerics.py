"""Format-independent numerics, from per-block masks (validate/inputs.py)."""

from __future__ import annotations

from collections.abc import Iterator

from ..check import Finding, Scope, Severity, check
from ..inputs import ExpertTensors, Options, ProjectionTensors
from ._util import count_first, fmt_coords, roles_text

__all__ = ["all_zero_expert", "dequant_nonfinite"]


@check(id="numerics.dequant.nonfinite", severity=Severity.ERROR, scope=Scope.PROJECTION,
       hint="find the bad scale or global named by the other findings for this tensor and re-export it")
def dequant_nonfinite(p: ProjectionTensors, opts: Options) -> Iterator[Finding]:
    """Weights that dequantize to NaN or Inf poison every token that reaches this expert."""
    count, first = count_first(p.nonfinite_blocks)
    if count:
        scale = p.scale_values[first].item()
        g = "" if p.global_scale is None else f", global {float(p.global_scale.float().reshape(-1)[0]):g}"
        yield Finding(p.proj.weight.name, f"{count} of {p.nonfinite_blocks.size} blocks dequantize to NaN/Inf "
                      f"in fp32, first at block {fmt_coords(first)} (scale {scale:g}{g}).", count=count,
                      first=first, file=p.file, layer=p.proj.layer, expert=p.proj.expert)


@check(id="expert.all_zero", severity=Severity.ERROR, scope=Scope.EXPERT,
       hint="re-export the expert; if it was pruned on purpose, remove it from the router instead")
def all_zero_expert(e: ExpertTensors, opts: Options) -> Iterator[Finding]:
    """An expert projection whose weights are all zero outputs nothing, yet the router still sends tokens to it."""
    zero = [role for role, p in e.projections.items() if bool(p.zero_blocks.all())]
    if zero:
        any_p = next(iter(e.projections.values()))
        prefix = any_p.proj.key.rsplit(".", 1)[0]
        yield Finding(prefix, f"expert {e.expert} of layer {e.layer}: projection(s) {roles_text(zero)} "
                      "dequantize to all zeros.", count=len(zero), file=any_p.file, layer=e.layer, expert=e.expert)
