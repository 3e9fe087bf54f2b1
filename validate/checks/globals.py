"""NVFP4 global scales (ModelOpt `weight_scale_2`, a multiplier; docs/spec/MARLIN_FP4.md §3.4, §5.3-5.4)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from ...core.checkpoint.tensor_model import Quant, Role
from ...core.sources.input_scales import invalid_input_scales
from ..check import Finding, Scope, Severity, check
from ..inputs import CheckpointInput, ExpertTensors, Options, ProjectionTensors

__all__ = ["gate_up_mismatch", "global_invalid", "global_range", "input_scale_invalid"]

_BF16_GLOBAL_LIMIT = 512.0  # g * 2**119 must stay below 2**128 (fp32 for vLLM, bf16 for SGLang)
_FP16_MAX = 65504.0
_FP16_MIN_NORMAL = 2.0**-14  # 6.1e-5: SGLang's fp16 global loses precision below this


def _global_name(p: ProjectionTensors) -> str:
    return p.proj.global_scale.name if p.proj.global_scale is not None else f"{p.proj.key}.weight_scale_2"


def _value(p: ProjectionTensors) -> float | None:
    if p.global_scale is None or p.global_scale.numel() == 0:
        return None
    return float(p.global_scale.float().reshape(-1)[0])


@check(id="nvfp4.global.invalid", severity=Severity.ERROR, scope=Scope.PROJECTION, quant="nvfp4",
       hint="re-export the checkpoint: the global scale must be a finite number > 0 (amax / 2688)")
def global_invalid(p: ProjectionTensors, opts: Options) -> Iterator[Finding]:
    """A missing, NaN, Inf, zero or negative global scale makes the whole projection NaN, zero or sign-flipped."""
    g = _value(p)
    where = dict(file=p.file, layer=p.proj.layer, expert=p.proj.expert)
    if g is None:
        yield Finding(_global_name(p), "NVFP4 projection has no global scale (weight_scale_2).", **where)
    elif not math.isfinite(g) or g <= 0:
        yield Finding(_global_name(p), f"global scale is {g!r}; expected a finite value > 0.", value=g, **where)


@check(id="nvfp4.global.range", severity=Severity.ERROR, scope=Scope.PROJECTION, quant="nvfp4",
       hint="serve with the other activation dtype or target (see the message), or re-quantize so "
            "that the global scale (amax / 2688) is in range")
def global_range(p: ProjectionTensors, opts: Options) -> Iterator[Finding]:
    """The processed global g * 2**(B-7) must fit the dtype the engine keeps it in (fp32 for vLLM, the activation dtype for SGLang)."""
    g = _value(p)
    if g is None or not math.isfinite(g) or g <= 0:
        return
    where = dict(file=p.file, layer=p.proj.layer, expert=p.proj.expert, value=g)
    name = _global_name(p)
    if opts.target.act_dtype == "bfloat16":
        fp32 = opts.target.fp32_global
        limit = _BF16_GLOBAL_LIMIT * (p.sf if fp32 else 1.0)
        if g >= limit:
            yield Finding(name, f"global scale {g:g} >= {limit:g}: g * 2**119 overflows "
                          f"{'fp32' if fp32 else 'bf16'} ({opts.target.engine}, bfloat16).", **where)
    elif not opts.target.fp32_global:  # the global is kept in float16
        g16 = torch.tensor(g).to(torch.float16).item()
        if g16 * 128 > _FP16_MAX:
            yield Finding(name, f"global scale {g:g}: 128 * fp16(g) = {g16 * 128:g} overflows fp16 "
                          "(SGLang keeps the global in float16).", **where)
        elif g16 == 0:
            yield Finding(name, f"global scale {g:g} flushes to 0 in fp16 (SGLang keeps the global in float16).",
                          **where)
        elif g < _FP16_MIN_NORMAL:
            yield Finding(name, f"global scale {g:g} < 6.1e-5 is an fp16 subnormal: SGLang's float16 global "
                          f"is off by {abs(g16 - g) / g:.1%}.", severity=Severity.WARNING, **where)


@check(id="nvfp4.global.gate_up_mismatch", severity=Severity.ERROR, scope=Scope.EXPERT, quant="nvfp4",
       hint="re-quantize gate and up with one shared global (ModelOpt shares w1/w3 amax), or convert "
            "with a rescale of the up block scales")
def gate_up_mismatch(e: ExpertTensors, opts: Options) -> Iterator[Finding]:
    """Both engines apply the gate's global to all of w13, so an up projection with a different global is silently scaled wrong."""
    gate, up = e.projections.get(Role.GATE), e.projections.get(Role.UP)
    if gate is None or up is None or gate.quant is not Quant.NVFP4 or up.quant is not Quant.NVFP4:
        return
    gg, gu = _value(gate), _value(up)
    if gg is None or gu is None or not (math.isfinite(gg) and math.isfinite(gu)) or gg == gu:
        return
    ratio = gg / gu if gu else float("inf")
    yield Finding(_global_name(up), f"up global {gu:g} != gate global {gg:g} ({gate.proj.key}); both engines "
                  f"use the gate's for w13, so the up projection is served scaled by {ratio:.4g}x.",
                  file=up.file, layer=e.layer, expert=e.expert, value=ratio)


@check(id="nvfp4.input_scale.invalid", severity=Severity.WARNING, scope=Scope.CHECKPOINT,
       hint="re-export the checkpoint with calibrated activations (input_scale = amax / (6 * 448)); Marlin W4A16 "
            "does not use it, but a W4A4/W4A8 path would compute NaN or zero activations")
def input_scale_invalid(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """A NaN, infinite, zero or negative activation scale is a broken export even where the Marlin path ignores it."""
    if c.checkpoint is None:
        return
    for ref, v in invalid_input_scales(c.checkpoint):
        yield Finding(ref.name, f"input scale is {v!r}; expected a finite value > 0.", file=ref.file, value=v)
