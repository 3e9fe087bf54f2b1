"""MXFP4 E8M0 block scales (docs/spec/MARLIN_FP4.md §3.5, §5.5-5.6). Coordinates are [n, group] of the
source scale tensor [N, K/32]; group g covers k = 32g .. 32g+31."""

from __future__ import annotations

from collections.abc import Iterator

from ...formats.constants import E8M0_NAN, W4A8_MAX_SOURCE_BYTE
from ..check import Finding, Scope, Severity, check
from ..inputs import Options, ProjectionTensors
from ._util import count_first, fmt_coords

__all__ = ["nan_scale_bytes", "overflow_scale_bytes", "w4a8_scale_range", "zero_scale_bytes"]

_BF16_OVERFLOW_BYTE = 253  # 6 * 2**(253 - 127) = 1.5 * 2**128 > bf16 max (3.39e38)


def _finding(p: ProjectionTensors, mask, text: str) -> Iterator[Finding]:
    count, first = count_first(mask)
    if count:
        byte = int(p.scale_np[first])
        yield Finding(p.scale_name, f"{count} of {mask.size} scale bytes {text}, first at "
                      f"{fmt_coords(first)} (byte {byte:#04x}).", count=count, first=first, file=p.file,
                      layer=p.proj.layer, expert=p.proj.expert)


@check(id="mxfp4.scale.nan", severity=Severity.ERROR, scope=Scope.PROJECTION, quant="mxfp4",
       hint="re-export the source checkpoint; NaN scales cannot be repacked")
def nan_scale_bytes(p: ProjectionTensors, opts: Options) -> Iterator[Finding]:
    """Marlin decodes E8M0 0xFF as Inf, so that output channel becomes Inf (or NaN) for every token."""
    yield from _finding(p, p.scale_np == E8M0_NAN, "are 0xFF (E8M0 NaN)")


@check(id="mxfp4.scale.overflow", severity=Severity.ERROR, scope=Scope.PROJECTION, quant="mxfp4",
       hint="re-quantize: block exponents above 2**125 cannot be served with bf16 activations")
def overflow_scale_bytes(p: ProjectionTensors, opts: Options) -> Iterator[Finding]:
    """With E8M0 byte >= 253 the value 6 * 2**(e-127) overflows bf16, the kernel's scale type."""
    b = p.scale_np
    yield from _finding(p, (b >= _BF16_OVERFLOW_BYTE) & (b != E8M0_NAN), ">= 253 (6 * 2**(e-127) overflows bf16)")


@check(id="mxfp4.scale.zero", severity=Severity.WARNING, scope=Scope.PROJECTION, quant="mxfp4",
       hint="nothing to do if these blocks are meant to be empty; otherwise re-quantize")
def zero_scale_bytes(p: ProjectionTensors, opts: Options) -> Iterator[Finding]:
    """Marlin decodes E8M0 byte 0 as +0 (the checkpoint means 2**-127), so those blocks become exactly zero."""
    yield from _finding(p, (p.scale_np == 0) & p.block_nonzero, "are 0 while their codes are not")


@check(id="mxfp4.scale.w4a8_range", severity=Severity.ERROR, scope=Scope.PROJECTION, quant="mxfp4",
       hint="serve without W4A8 (16-bit activations) or re-quantize with smaller block exponents")
def w4a8_scale_range(p: ProjectionTensors, opts: Options) -> Iterator[Finding]:
    """W4A8 adds 6 to each scale byte and the kernel builds the fp32 scale as byte << 23: a source byte above 248 becomes Inf."""
    if opts.target.w4a8:
        b = p.scale_np
        yield from _finding(p, (b > W4A8_MAX_SOURCE_BYTE) & (b != E8M0_NAN), f"are > {W4A8_MAX_SOURCE_BYTE} (W4A8 +6 overflows)")
