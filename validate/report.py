"""Collect findings, summarise them per check, render text or JSON (docs/VALIDATE.md), pick the exit code.

Exit codes: 0 clean (infos, and warnings unless --strict), 1 errors (or warnings with --strict),
2 usage or unreadable input (decided by the CLI, which never builds a Report then).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field

from ..core.units import plural
from ..core.version import __version__
from .check import Result, Severity
from .checks import BY_ID
from .inputs import Options

__all__ = ["SCHEMA_VERSION", "CheckSummary", "Report"]

SCHEMA_VERSION = 1
_STATUS = {Severity.ERROR: "fail", Severity.WARNING: "warn", Severity.INFO: "info"}


@dataclass
class CheckSummary:
    id: str
    severity: str
    status: str  # pass | info | warn | fail | not run
    findings: int
    count: int
    layers: dict[str, int]
    worst_layers: list[str]
    why: str
    hint: str


@dataclass
class Report:
    path: str
    against: str | None
    format: str | None
    options: Options
    results: list[Result] = field(default_factory=list)
    ran: set[str] = field(default_factory=set)
    gemm: list[dict] = field(default_factory=list)
    kernel: list[dict] = field(default_factory=list)  # validate --kernel: one row per layer stack
    notes: list[str] = field(default_factory=list)
    projections: int = 0
    experts: int = 0
    seconds: float = 0.0
    skipped: dict[str, str] = field(default_factory=dict)  # check id -> what it needed (not run for lack of it)
    compared: int = 0  # projections compared with the --against reference

    def add(self, outcome) -> None:
        """One expert's outcome (validate/expert_worker.py _Outcome)."""
        self.results += outcome.results
        self.ran |= outcome.ran
        self.gemm += outcome.gemm
        self.projections += outcome.projections
        self.skipped.update(outcome.skipped)
        self.compared += outcome.compared

    def not_run_notes(self) -> list[str]:
        """A check skipped for want of its input is named, never counted as a pass."""
        return [f"{cid} not run: {why}" for cid, why in sorted(self.skipped.items()) if cid not in self.ran]

    def severity(self, r: Result) -> Severity:
        return BY_ID[r.check_id].severity_of(r.finding)

    def counts(self) -> Counter:
        return Counter(self.severity(r) for r in self.results)

    def exit_code(self, *, strict: bool = False) -> int:
        c = self.counts()
        return 1 if c[Severity.ERROR] or (strict and c[Severity.WARNING]) else 0

    def summaries(self) -> list[CheckSummary]:
        by_check = defaultdict(list)
        for r in self.results:
            by_check[r.check_id].append(r)
        out = []
        for chk in BY_ID.values():
            rs = by_check.get(chk.id, [])
            worst = max((self.severity(r) for r in rs), key=lambda s: s.rank, default=None)
            status = _STATUS[worst] if worst else ("pass" if chk.id in self.ran else "not run")
            layers = Counter()
            for r in rs:
                if r.finding.layer is not None:
                    layers[str(r.finding.layer)] += r.finding.count
            out.append(CheckSummary(chk.id, chk.severity.value, status, len(rs), sum(r.finding.count for r in rs),
                                    dict(layers), [f"{k}" for k, _ in layers.most_common(3)], chk.why, chk.hint))
        return out

    # ------------------------------------------------------------------------------------ JSON
    def to_json(self, *, strict: bool = False) -> dict:
        c = self.counts()
        rels = [g["rel_error"] for g in self.gemm if g["rel_error"] is not None]
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": {"name": "dsv4-convert", "version": __version__},
            "path": self.path,
            "against": self.against,
            "format": self.format,
            # the target's fields at the top, as the schema has always had them (docs/VALIDATE.md)
            "options": {**asdict(self.options.target), **{k: v for k, v in asdict(self.options).items() if k != "target"},
                        "strict": strict},
            "summary": {
                "status": "fail" if self.exit_code(strict=strict) else ("warn" if c[Severity.WARNING] else "pass"),
                "exit_code": self.exit_code(strict=strict),
                "errors": c[Severity.ERROR], "warnings": c[Severity.WARNING], "infos": c[Severity.INFO],
                "experts_checked": self.experts, "projections_checked": self.projections,
                "gemm_cases": len(self.gemm), "gemm_max_rel_error": max(rels) if rels else None,
                "seconds": round(self.seconds, 3), "notes": list(self.notes),
            },
            "checks": [asdict(s) for s in self.summaries()],
            "findings": [self._finding_json(r) for r in self.results],
            "gemm": list(self.gemm),
            "kernel": list(self.kernel),
        }

    def _finding_json(self, r: Result) -> dict:
        f = r.finding
        return {"check": r.check_id, "severity": self.severity(r).value, "tensor": f.tensor, "file": f.file,
                "layer": f.layer, "expert": f.expert, "message": f.message, "count": f.count,
                "first": list(f.first) if f.first is not None else None, "cause": f.cause, "value": f.value,
                "hint": BY_ID[r.check_id].hint}

    # ------------------------------------------------------------------------------------ text
    def render_text(self, *, strict: bool = False, per_check: int = 5, quiet: bool = False) -> str:
        """Findings (INFO ones left out), the per-check table, the verdict line and notes. `quiet` (validate -q)
        drops the table: a clean run is then one verdict line."""
        lines = []
        shown = Counter()
        for r in sorted(self.results, key=lambda r: -self.severity(r).rank):
            sev = self.severity(r)
            if sev is Severity.INFO:
                continue
            shown[r.check_id] += 1
            if shown[r.check_id] > per_check:
                continue
            chk, f = BY_ID[r.check_id], r.finding
            where = f.tensor + (f"  ({f.file})" if f.file else "")
            lines += [f"{sev.value}[{r.check_id}] {where}", f"  {f.message}", f"  why: {chk.why}",
                      f"  fix: {chk.hint}", ""]
        for cid, n in shown.items():
            if n > per_check:
                lines += [f"... {n - per_check} more {cid} findings (see --json)", ""]
        if not quiet:
            lines += [self._table(), ""]
        c = self.counts()
        code = self.exit_code(strict=strict)
        lines.append(f"{plural(self.experts, 'expert')}, {plural(self.projections, 'projection')}, "
                     f"{plural(len(self.gemm), 'GEMM spot check')} in {self.seconds:.1f} s: "
                     f"{plural(c[Severity.ERROR], 'error')}, {plural(c[Severity.WARNING], 'warning')}, "
                     f"{plural(c[Severity.INFO], 'info')} -> {'FAIL' if code else 'OK'} (exit {code})")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def _table(self) -> str:
        rows = [("check", "status", "findings", "count", "worst layers")]
        for s in self.summaries():
            if s.status == "not run":
                continue
            worst = ", ".join(f"{k} ({s.layers[k]})" for k in s.worst_layers)
            rows.append((s.id, s.status.upper() if s.status in ("fail", "warn") else s.status, str(s.findings),
                         str(s.count), worst or "-"))
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        out = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
        out.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(out)
