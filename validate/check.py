"""What a validation check is: a small pure function plus its metadata (id, severity, why, fix).

`@check(...)` wraps a function into a `Check`; it registers nothing. The explicit list of checks is
`validate.checks.ALL_CHECKS`. A check yields `Finding`s about its input and never raises for bad
data; the runner adds the check id, and the report adds counts, layers and the exit code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum

__all__ = ["Check", "Finding", "Result", "Scope", "Severity", "check"]


class Severity(str, Enum):
    ERROR = "error"      # the engine would serve wrong numbers or refuse the checkpoint
    WARNING = "warning"  # works, but lossy, fragile or surprising; fails only with --strict
    INFO = "info"        # a fact worth knowing; never fails

    @property
    def rank(self) -> int:
        return {"info": 0, "warning": 1, "error": 2}[self.value]


class Scope(str, Enum):
    """What a check's first argument is (see validate/inputs.py)."""
    CHECKPOINT = "checkpoint"  # CheckpointInput: headers, config, projections (no tensor data)
    PROJECTION = "projection"  # ProjectionTensors: one projection in source form
    EXPERT = "expert"          # ExpertTensors: gate/up/down of one expert
    MARLIN = "marlin"          # MarlinTensors: one converted projection (+ the reference, if any)
    AGAINST = "against"        # (ProjectionTensors, reference ProjectionTensors): source vs --against source
    GEMM = "gemm"              # GemmCase: one sampled projection, Marlin form and source form
    KERNEL = "kernel"          # checks.kernel.KernelCase: one layer stack through the engine's kernel (--kernel)
    RUN = "run"                # Coverage: what the whole run found, read and compared (after every other check)


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem (or fact) about one tensor. `count` is how many elements/blocks are affected,
    `first` the coordinates of the first one. `severity` overrides the check's default (a check
    whose verdict depends on the target, e.g. subnormal scales, uses it); `cause` names the likely
    cause of a layout mismatch; `value` carries a number such as a GEMM relative error."""
    tensor: str
    message: str
    count: int = 1
    first: tuple[int, ...] | None = None
    file: str | None = None
    layer: str | None = None
    expert: int | None = None
    severity: Severity | None = None
    cause: str | None = None
    value: float | None = None


@dataclass(frozen=True, slots=True)
class Result:
    """A finding tagged with the id of the check that produced it (picklable, for worker processes)."""
    check_id: str
    finding: Finding


@dataclass(frozen=True)
class Check:
    id: str
    severity: Severity
    scope: Scope
    hint: str
    why: str
    fn: Callable[..., Iterator[Finding]] = field(repr=False)
    quant: str | None = None  # "nvfp4" / "mxfp4": run only on projections of that format
    # (predicate(input, opts), what it needs): without it the check has nothing to compare, so it is
    # "not run" (named in the report's notes) rather than a pass that checked nothing
    needs: tuple[Callable[..., bool], str] | None = None

    def applies_to(self, quant) -> bool:
        return self.quant is None or quant is None or self.quant == getattr(quant, "value", quant)

    def missing(self, arg, opts) -> str | None:
        """What this check needs and `arg`/`opts` lack (it is then not run), or None."""
        if self.needs is None or self.needs[0](arg, opts):
            return None
        return self.needs[1]

    def __call__(self, *args, **kwargs) -> Iterator[Finding]:
        return self.fn(*args, **kwargs)

    def severity_of(self, finding: Finding) -> Severity:
        return finding.severity or self.severity


def check(*, id: str, severity: Severity, scope: Scope, hint: str, quant: str | None = None,
          needs: tuple[Callable[..., bool], str] | None = None) -> Callable[[Callable], Check]:
    """Turn a generator function into a Check; its docstring's first line is the `why`."""
    def wrap(fn: Callable[..., Iterator[Finding]]) -> Check:
        why = (fn.__doc__ or "").strip().split("\n")[0]
        if not why:
            raise TypeError(f"check {id} needs a docstring: one line that says why it matters")
        return Check(id=id, severity=severity, scope=scope, hint=hint, why=why, fn=fn, quant=quant, needs=needs)
    return wrap
