"""validate never passes what it did not check: a run that found no FP4 expert, checked none of
those it found, or was asked to compare with `--against` and found nothing to compare, is a finding."""

from __future__ import annotations

from collections.abc import Iterator

from ..check import Finding, Scope, Severity, check
from ..inputs import Coverage, Options

__all__ = ["against_compared", "experts_checked"]


@check(id="coverage.nothing_checked", severity=Severity.ERROR, scope=Scope.RUN,
       hint="pass an FP4 MoE checkpoint (or this tool's output); `dsv4-convert inspect` shows what was found")
def experts_checked(c: Coverage, opts: Options) -> Iterator[Finding]:
    """A checkpoint whose experts were not read was not validated, whatever the other checks say."""
    if c.found == 0:
        yield Finding("checkpoint", f"no FP4 expert projection was found (read as {c.format}): no expert weight, "
                      "scale or layout was checked.", count=0)
    elif c.checked == 0:
        yield Finding("checkpoint", f"none of the {c.found} FP4 expert projections could be read and checked "
                      "(the other findings say why).", count=c.found)


@check(id="coverage.against_unmatched", severity=Severity.ERROR, scope=Scope.RUN,
       hint="pass the checkpoint this one was converted from (or copied from) as --against SRC")
def against_compared(c: Coverage, opts: Options) -> Iterator[Finding]:
    """`--against` promises a byte comparison; a projection without a counterpart in SRC was not compared."""
    if c.against and c.checked and c.compared < c.checked:
        yield Finding("--against", f"{c.checked - c.compared} of {c.checked} checked projections have no "
                      "counterpart (same name) in the --against checkpoint, so their bytes were not compared.",
                      count=c.checked - c.compared)
