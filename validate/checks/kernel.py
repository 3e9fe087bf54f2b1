"""`validate --kernel`: the engine's own Marlin kernels on this GPU (validate/kernel_runner.py).

kernel.gemm: the engine's MoE GEMM on the prepared experts against an fp32 reference (dequant of
--against SRC, else the project's own decode of the Marlin bytes), relative Frobenius error per
expert. Limits by activation dtype: measured on vLLM 0.33.0's kernels on an H200 (worst case over
every source format and target of the GPU suite, docs/VALIDATE.md), with a margin; wrong bytes,
scales or globals give errors of 0.3 and more.
kernel.repack: the engine's repack kernel on the source bytes must give the weight words we hold.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from dsv4_convert.validate.check import Finding, Scope, Severity, check

__all__ = ["KERNEL_REL_ERROR_MAX", "KernelCase", "kernel_gemm", "kernel_repack"]

KERNEL_REL_ERROR_MAX = {"bfloat16": 6e-3, "float16": 2e-3}


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


@check(id="kernel.gemm", severity=Severity.ERROR, scope=Scope.KERNEL,
       hint="with --against the cause is in the conversion (see the layout and against checks); without it the "
            "engine's kernel on this GPU is wrong: run `dsv4-convert doctor` (missing SASS, engine version)")
def kernel_gemm(case: KernelCase, opts) -> Iterator[Finding]:
    """The engine's own Marlin kernel on this GPU must compute what the checkpoint means, or the server serves wrong numbers."""
    limit = KERNEL_REL_ERROR_MAX[case.act_dtype]
    bad = sorted(((r, e) for e, r in case.rel.items() if not (r <= limit)), key=lambda t: (-_key(t[0]), t[1]))
    for rel, expert in bad:
        tensor, file = case.names[expert]
        text = "non-finite output" if not math.isfinite(rel) else f"relative error {rel:.3g}"
        yield Finding(tensor, f"{case.provider} MoE GEMM on layer {case.layer} {case.stack} expert {expert} "
                      f"({case.act_dtype}) differs from the fp32 reference ({case.reference}): {text}; limit {limit:g}",
                      layer=case.layer, expert=expert, value=rel if math.isfinite(rel) else None, file=file)


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
