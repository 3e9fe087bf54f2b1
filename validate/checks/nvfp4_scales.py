"""NVFP4 E4M3 block scales (docs/spec/MARLIN_FP4.md §3.3, §5.2). Coordinates are [n, group] of the
source scale tensor [N, K/16]; group g covers k = 16g .. 16g+15."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from ...formats.constants import S0E5M3_MIN, S0E5M3_MULTIPLIER
from ...formats.e4m3 import e4m3_is_nan
from ..check import Finding, Scope, Severity, check
from ..inputs import Options, ProjectionTensors
from ._util import count_first, fmt_coords

__all__ = ["nan_scales", "negative_scales", "subnormal_scales", "zero_scales"]

_SIGN = 0x80


def _finding(p: ProjectionTensors, mask, text: str, **kw) -> Iterator[Finding]:
    count, first = count_first(mask)
    if count:
        value = p.scale_values[first].item()
        yield Finding(p.scale_name, f"{count} of {mask.size} block scales {text}, first at "
                      f"{fmt_coords(first)} (value {value:g}).", count=count, first=first, file=p.file,
                      layer=p.proj.layer, expert=p.proj.expert, **kw)


@check(id="nvfp4.scale.nan", severity=Severity.ERROR, scope=Scope.PROJECTION, quant="nvfp4",
       hint="re-export or re-quantize the source checkpoint; a NaN block scale cannot be repaired")
def nan_scales(p: ProjectionTensors, opts: Options) -> Iterator[Finding]:
    """A NaN block scale makes its 16 weights NaN, and NaN spreads to every token's output."""
    yield from _finding(p, e4m3_is_nan(p.scale_np), "are NaN (E4M3 0x7F/0xFF)")


@check(id="nvfp4.scale.negative", severity=Severity.ERROR, scope=Scope.PROJECTION, quant="nvfp4",
       hint="re-quantize with non-negative block scales (the sign belongs in the FP4 codes)")
def negative_scales(p: ProjectionTensors, opts: Options) -> Iterator[Finding]:
    """Marlin has no sign bit for scales: vLLM zeroes negative scales, SGLang silently uses |s|."""
    b = p.scale_np
    mask = (b > _SIGN) & ~e4m3_is_nan(b)
    t = opts.target
    effect = f"{t.facts.display} " + ("zeroes these blocks" if t.clamps_scales else "serves them as |s| (sign lost)")
    yield from _finding(p, mask, f"are negative; {effect}")


@check(id="nvfp4.scale.subnormal", severity=Severity.ERROR, scope=Scope.PROJECTION, quant="nvfp4",
       hint="re-quantize with a smaller global scale so block scales stay >= 2**-6, or serve with "
            "--target sglang --act-dtype float16, which decodes subnormal scales correctly")
def subnormal_scales(p: ProjectionTensors, opts: Options) -> Iterator[Finding]:
    """E4M3 subnormal scales (< 2**-6) are zeroed by vLLM unless its rescale lifts them, and SGLang's bf16 kernel decodes them wrongly."""
    b = p.scale_np
    sub = (b < _SIGN) & ((b & 0x78) == 0) & ((b & 0x07) != 0)
    if not sub.any():
        return
    used = sub & p.block_nonzero
    if opts.target.clamps_scales:
        v = p.scale_values.to(torch.float16)
        lifted = ((v.float() * p.sf).to(torch.float16) * S0E5M3_MULTIPLIER >= S0E5M3_MIN).numpy()
        lost = used & ~lifted
        how = f"vLLM zeroes them (rescale factor {p.sf:g} does not lift them to >= 2**-6)"
    elif opts.target.act_dtype == "bfloat16":
        lost = used
        how = "SGLang's bf16 kernel cannot decode S0E5M3 bytes below 0x80"
    else:
        lost = np.zeros_like(used)
        how = ""
    if lost.any():
        yield from _finding(p, lost, f"are E4M3 subnormals (< 2**-6) in blocks with non-zero codes; {how}")
    else:
        yield from _finding(p, sub, f"are E4M3 subnormals; harmless for {opts.target.engine}/{opts.target.act_dtype}",
                            severity=Severity.INFO)


@check(id="nvfp4.scale.zero", severity=Severity.ERROR, scope=Scope.PROJECTION, quant="nvfp4",
       hint="re-quantize: a block with non-zero codes needs a non-zero scale (ModelOpt uses 1.0 for empty blocks)")
def zero_scales(p: ProjectionTensors, opts: Options) -> Iterator[Finding]:
    """A zero block scale with non-zero FP4 codes silently zeroes those 16 weights."""
    yield from _finding(p, ((p.scale_np & 0x7F) == 0) & p.block_nonzero, "are 0 while their codes are not")
