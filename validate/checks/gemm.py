"""GEMM spot check: random activations x the weights the Marlin kernel would see, against the same
activations x the source weights (validate/emulate.py; threshold GEMM_REL_ERROR_MAX)."""

from __future__ import annotations

import math
from collections.abc import Iterator

from ..check import Finding, Scope, Severity, check
from ..emulate import GEMM_REL_ERROR_MAX
from ..inputs import GemmCase, Options

__all__ = ["gemm_rel_error"]


@check(id="gemm.rel_error", severity=Severity.ERROR, scope=Scope.GEMM,
       hint="look at the other findings for this expert (scales, globals, layout); they name the cause")
def gemm_rel_error(case: GemmCase, opts: Options) -> Iterator[Finding]:
    """The product the kernel computes must match the checkpoint's own product, or the served model is not the checkpoint."""
    rel, max_abs = case.errors
    if not (rel <= GEMM_REL_ERROR_MAX):
        p = case.source.proj
        text = "non-finite" if not math.isfinite(rel) else f"{rel:.3g}"
        yield Finding(p.weight.name, f"x @ W.T with the Marlin weights ({case.target.engine}/{case.target.act_dtype}) differs "
                      f"from the source product by relative error {text} (max abs {max_abs:.3g}); "
                      f"threshold {GEMM_REL_ERROR_MAX:g}.", value=rel, file=case.file, layer=p.layer,
                      expert=p.expert)
