"""This tool's Marlin output: decode each projection with the inverse transforms and compare it byte
for byte with the `--against` source (or, without one, check that the stored bytes re-encode to
themselves). On a mismatch the message names the likely cause (validate/diagnose.py)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from ...core.checkpoint.tensor_model import Role
from ...formats.marlin.scales import nvfp4_global_to_marlin
from ...formats.padded_layout import encode_rank_blocks, padding_masks
from ..check import Finding, Scope, Severity, check
from ..diagnose import expected_marlin_scales, global_cause, scale_cause, weight_cause
from ..inputs import MarlinTensors, Options
from ._util import count_first

__all__ = ["layout_global", "layout_scale", "layout_weight", "padding_zero"]


def _where(m: MarlinTensors) -> dict:
    return dict(file=m.file, layer=m.proj.layer, expert=m.proj.expert)


def _has_reference(m: MarlinTensors, opts: Options) -> bool:
    return m.reference is not None


@check(id="marlin.layout.weight", severity=Severity.ERROR, scope=Scope.MARLIN,
       hint="re-run the conversion from the original source with this version of dsv4-convert",
       needs=(_has_reference, "the decoded codes are compared only with their source projection (--against SRC)"))
def layout_weight(m: MarlinTensors, opts: Options) -> Iterator[Finding]:
    """Packed codes that do not decode to the source's bytes feed the kernel wrong weights."""
    if m.reference is None or m.decoded is None:
        return
    dec = m.decoded.weight.view(torch.uint8)
    ref = m.reference.weight.view(torch.uint8)
    if dec.shape != ref.shape:
        yield Finding(m.proj.weight.name, f"decodes to codes {list(dec.shape)} but the source has {list(ref.shape)}.",
                      cause="shape", **_where(m))
        return
    count, first = count_first(dec != ref)
    if count:
        n, j = first
        cause = weight_cause(m.qweight, dec, ref, w4a8=m.target.w4a8)
        yield Finding(m.proj.weight.name, f"{count} of {ref.numel()} code bytes differ from the source after "
                      f"decoding; first at source [n={n}, k={2 * j}..{2 * j + 1}] ({int(dec[n, j]):#04x} != "
                      f"{int(ref[n, j]):#04x}). Likely cause: {cause}.", count=count, first=first, cause=cause,
                      **_where(m))


@check(id="marlin.layout.scale", severity=Severity.ERROR, scope=Scope.MARLIN,
       hint="re-run the conversion for the target you serve with (--target / --act-dtype) from the original source")
def layout_scale(m: MarlinTensors, opts: Options) -> Iterator[Finding]:
    """Scale bytes that are not exactly the target's encoding of the source scales scale the wrong weights."""
    ref = m.reference if m.reference is not None else m.decoded
    if ref is None:
        return
    quant = m.proj.quant
    stored = m.mscale.contiguous().view(torch.uint8)
    def encode(s):
        return (expected_marlin_scales(s, quant, engine=m.target.engine, sf=m.sf, w4a8=m.target.w4a8),)

    if m.tiles is None or ref.scale_bytes.shape != (m.proj.n, m.proj.k // quant.group_size):
        (expected,) = encode(ref.scale_bytes)
    else:  # a --tp/--ep output: one Marlin block per rank (formats/padded_layout.py)
        (expected,) = encode_rank_blocks((ref.scale_bytes,), down=m.proj.role is Role.DOWN, t=m.tiles,
                                         encode=encode)
    what = "the source's scales" if m.reference is not None else "the re-encoding of its own decoded scales"
    if stored.shape != expected.shape:
        yield Finding(m.proj.scale.name, f"shape {list(stored.shape)}, expected {list(expected.shape)} "
                      f"(K/{quant.group_size} x N).", cause="shape", **_where(m))
        return
    count, first = count_first(stored != expected)
    if count:
        cause = scale_cause(m.mscale, ref.scale_bytes, quant, engine=m.target.engine, sf=m.sf, act_dtype=m.target.act_dtype,
                            w4a8=m.target.w4a8)
        yield Finding(m.proj.scale.name, f"{count} of {stored.numel()} scale bytes differ from {what} "
                      f"({m.target.engine}, rescale {m.sf:g}); first at [{first[0]}, {first[1]}] "
                      f"({int(stored[first]):#04x} != {int(expected[first]):#04x}). Likely cause: {cause}.",
                      count=count, first=first, cause=cause, **_where(m))


@check(id="marlin.layout.global", severity=Severity.ERROR, scope=Scope.MARLIN, quant="nvfp4",
       hint="re-run the conversion with the --target and --act-dtype of the engine you serve with")
def layout_global(m: MarlinTensors, opts: Options) -> Iterator[Finding]:
    """The processed global must be g * 2**(B-7) / sf in the target's dtype, or every output of the expert is scaled wrong."""
    name = m.proj.marlin_global.name if m.proj.marlin_global is not None else f"{m.proj.key}.weight_global_scale"
    if m.mglobal is None:
        yield Finding(name, "NVFP4 projection has no processed global (weight_global_scale).", **_where(m))
        return
    if m.reference is not None and m.reference.global_scale is not None and m.kept_global is not None:
        kept, src = m.kept_global.float().reshape(-1), m.reference.global_scale.float().reshape(-1)
        if not torch.equal(kept.view(torch.int32), src.view(torch.int32)):
            yield Finding(f"{m.proj.key}.weight_scale_2", f"kept weight_scale_2 {kept.tolist()} differs from the "
                          f"source's {src.tolist()}.", cause="kept global", **_where(m))
    g = m.reference.global_scale if m.reference is not None else m.kept_global
    if g is None:
        return
    value = float(g.float().reshape(-1)[0])
    if not math.isfinite(value) or value <= 0:  # no processed global follows from it (nvfp4.global.invalid too)
        yield Finding(f"{m.proj.key}.weight_scale_2", f"the global scale is {value!r}, not a finite value > 0: no "
                      "processed global can be checked against it.", value=value, cause="invalid global", **_where(m))
        return
    expected = nvfp4_global_to_marlin(g.float().reshape(-1)[0], fp32_global=m.target.fp32_global,
                                      act_dtype=m.target.act_dtype, sf=m.sf)
    stored = m.mglobal
    same = stored.dtype == expected.dtype and stored.numel() == 1 and torch.equal(
        stored.reshape(1).view(torch.uint8), expected.reshape(1).view(torch.uint8))
    if not same:
        cause = global_cause(stored, g, engine=m.target.engine, act_dtype=m.target.act_dtype, sf=m.sf)
        yield Finding(name, f"stored {stored.dtype} {stored.float().reshape(-1).tolist()}, expected "
                      f"{expected.dtype} {expected.float().reshape(-1).tolist()} (g={float(g.reshape(-1)[0]):g} for "
                      f"{m.target.engine}/{m.target.act_dtype}, rescale {m.sf:g}). Likely cause: {cause}.", cause=cause,
                      **_where(m))



@check(id="marlin.padding", severity=Severity.ERROR, scope=Scope.MARLIN,
       hint="convert again from the source; marlin-to-source refuses this checkpoint (reverse.padding_not_zero)")
def padding_zero(m: MarlinTensors, opts: Options) -> Iterator[Finding]:
    """The engines zero each rank's padding; codes or scales there are not the source's, and the reverse cannot be exact."""
    if m.tiles is None or m.decoded is None:
        return
    wpad, spad = padding_masks(down=m.proj.role is Role.DOWN, t=m.tiles)
    w, s = m.decoded.weight.view(torch.uint8), m.decoded.scale_bytes
    if w.shape != wpad.shape or s.shape != spad.shape:
        return  # structure.experts.dims reports the shape
    for what, name, mask in (("code bytes", m.proj.weight.name, (w != 0) & wpad),
                             ("scale bytes", m.proj.scale.name, (s != 0) & spad)):
        count, first = count_first(mask)
        if count:
            yield Finding(name, f"{count} {what} in the padding of the TP {m.tiles.tp} / EP {m.tiles.ep} layout are "
                          f"not zero; first at source [{first[0]}, {first[1]}] of the padded matrix.", count=count,
                          first=first, **_where(m))
