"""`validate --kernel`: the engine's own Marlin kernels on this GPU (validate/kernel_runner.py).

kernel.gemm: the engine's MoE GEMM on the prepared experts against an fp32 reference (dequant of
--against SRC, else the project's own decode of the Marlin bytes), relative Frobenius error per
expert. Limits by activation dtype: measured on vLLM 0.33.0's kernels on an H200 (worst case over
every source format and target of the GPU suite, docs/VALIDATE.md), with a margin; wrong bytes,
scales or globals give errors of 0.3 and more.
kernel.repack: the engine's repack kernel on the source bytes must give the weight words we hold.
kernel.build: an engine that compiles its Marlin kernels on first use (SGLang 0.5.23's JIT) could build them here;
where it cannot (no nvcc, no ninja, an arch the compiler lacks) the finding says what failed and what to install.

Policy on rounding the engine itself introduces (docs/VALIDATE.md): SGLang keeps the NVFP4 global in
the activation dtype, so an fp16-subnormal global (nvfp4.global.range warns about it) is served off
by up to several 1e-3. Where the reference is the source, the runner also measures each expert
against the source scaled by the global the engine really keeps. An error above the limit that this
explains (with the kept global the error is within the limit) is that engine rounding: a warning,
like the CPU check's, naming the cause. Anything beyond it, or a global the engine flushes to 0 or
to Inf, stays an error of the conversion.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..check import Finding, Scope, Severity, check

__all__ = ["KERNEL_LAYER_REL_ERROR_MAX", "KERNEL_REL_ERROR_MAX", "KernelCase", "engine_rounding", "kernel_build",
           "kernel_gemm", "kernel_repack"]

KERNEL_REL_ERROR_MAX = {"bfloat16": 6e-3, "float16": 2e-3}
# a layer run whole (w13, ReLU-squared or the clamped SwiGLU's product of two outputs, w2): squaring doubles the
# first GEMM's relative error and the activation is rounded to the activation dtype once more, so about 2.5x one GEMM's limit; broken bytes
# still give 0.1 and more (not measured on a GPU yet: docs/VALIDATE.md)
KERNEL_LAYER_REL_ERROR_MAX = {"bfloat16": 1.5e-2, "float16": 5e-3}


@dataclass
class KernelCase:
    """One layer's w13 or w2 stack, after the kernel ran: per expert errors and repack mismatches."""
    layer: str
    stack: str  # "w13" / "w2"
    act_dtype: str
    provider: str
    reference: str  # "--against SRC", "source", "Marlin bytes decoded"
    rel: dict[int, float] = field(default_factory=dict)  # expert -> relative error
    names: dict[int, tuple[str, str]] = field(default_factory=dict)  # expert -> (tensor, file)
    repack: dict[int, tuple[str, int, int, tuple]] = field(default_factory=dict)  # expert -> (tensor, bad, total, first)
    # expert -> (the engine's kept global / the exact one, relative error against the reference scaled by
    # that ratio): only experts whose global the engine rounds (SGLang: the activation dtype)
    engine_global: dict[int, tuple[float, float]] = field(default_factory=dict)
    limit: float | None = None  # this case's own limit (a whole non-gated layer), else KERNEL_REL_ERROR_MAX
    build_error: tuple[str, str] | None = None  # (what failed, what to install): the engine could not build its kernel


@check(id="kernel.gemm", severity=Severity.ERROR, scope=Scope.KERNEL,
       hint="with --against the cause is in the conversion (see the layout and against checks); without it the "
            "engine's kernel on this GPU is wrong: run `dsv4-convert doctor` (missing SASS, engine version)")
def kernel_gemm(case: KernelCase, opts) -> Iterator[Finding]:
    """The engine's own Marlin kernel on this GPU must compute what the checkpoint means, or the server serves wrong numbers."""
    limit = case.limit or KERNEL_REL_ERROR_MAX[case.act_dtype]
    bad = sorted(((r, e) for e, r in case.rel.items() if not (r <= limit)), key=lambda t: (-_key(t[0]), t[1]))
    for rel, expert in bad:
        tensor, file = case.names[expert]
        text = "non-finite output" if not math.isfinite(rel) else f"relative error {rel:.3g}"
        head = (f"{case.provider} MoE GEMM on layer {case.layer} {case.stack} expert {expert} ({case.act_dtype}) "
                f"differs from the fp32 reference ({case.reference}): {text}; limit {limit:g}")
        where = dict(layer=case.layer, expert=expert, value=rel if math.isfinite(rel) else None, file=file)
        rounding = engine_rounding(case, expert)
        if rounding is None:
            yield Finding(tensor, head, **where)
        elif rounding[2]:
            yield Finding(tensor, f"{head}. {rounding[1]}: the engine's own rounding, not the conversion "
                          "(a warning, as nvfp4.global.range gives)", severity=Severity.WARNING,
                          cause=rounding[0], **where)
        else:
            yield Finding(tensor, f"{head}. {rounding[1]}, which does not explain it", **where)


def engine_rounding(case: KernelCase, expert: int) -> tuple[str, str, bool] | None:
    """(cause, what the engine's kept global does, whether that explains the expert's error) where the
    engine keeps this expert's global rounded, else None (the policy in the module docstring)."""
    if expert not in case.engine_global:
        return None
    ratio, rel_kept = case.engine_global[expert]
    limit = KERNEL_REL_ERROR_MAX[case.act_dtype]
    explained = math.isfinite(ratio) and ratio > 0 and rel_kept <= limit
    return ("nvfp4.global.range", f"The engine keeps this expert's global {abs(ratio - 1):.2%} off the exact value "
            f"(its {case.act_dtype} global; nvfp4.global.range); against the global it keeps, the error is "
            f"{rel_kept:.3g}", explained)


def _key(r: float) -> float:
    return r if math.isfinite(r) else math.inf


@check(id="kernel.repack", severity=Severity.ERROR, scope=Scope.KERNEL,
       hint="the converted weight words are not the engine's: reconvert with the matching --target")
def kernel_repack(case: KernelCase, opts) -> Iterator[Finding]:
    """The engine's repack kernel on the source bytes is the layout the engine serves; the converted words must equal it."""
    for expert, (tensor, bad, total, first) in sorted(case.repack.items()):
        if bad:
            yield Finding(tensor, f"{case.provider} gptq_marlin_repack of the source differs from the converted "
                          f"weight in {bad} of {total} int32 words (layer {case.layer} {case.stack} expert {expert})",
                          count=bad, first=first, layer=case.layer, expert=expert)


@check(id="kernel.build", severity=Severity.ERROR, scope=Scope.KERNEL,
       hint="install what the finding names on the serving machine (`dsv4-convert doctor` shows what the engine's "
            "JIT finds), then run validate --kernel again")
def kernel_build(case: KernelCase, opts) -> Iterator[Finding]:
    """An engine that compiles its Marlin kernels on first use must be able to build them here, or its server cannot run the MoE layers."""
    if case.build_error:
        what, fix = case.build_error
        yield Finding(case.stack, f"{what}. Fix: {fix}", layer=case.layer)
