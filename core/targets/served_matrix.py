"""The README's support matrix, rendered from the served table (core/targets/served.py): family x source format x
engine release, the method each engine builds for the non-expert layers, the proving tests, and the engines' own
refusals. tests/core/test_served.py compares it with the README. Pure: no engine import."""

from __future__ import annotations

from ..sources.families import FAMILIES
from . import served as table  # read at call time: the table's rows, as tests patch them
from .engines import RELEASES
from .served import Served, entries

MATRIX_BEGIN = "<!-- served matrix: generated from core/targets/served.py by core/targets/served_matrix.py; tests/core/test_served.py -->"
MATRIX_END = "<!-- end of served matrix -->"


def _proof_cell(rows: list[Served]) -> str:
    """The proving tests, by file and case: `test_families.py [qwen3-moe-nvfp4-ct]`."""
    cells: dict[str, set[str]] = {}
    for p in (p for s in rows for p in s.proofs):
        file, _, test = p.partition("::")
        cells.setdefault(file.removeprefix("serving_tests/"), set()).add(test.partition("[")[2].rstrip("]"))
    return "; ".join(f"`{f}`" + (f" [{', '.join(sorted(c - {''}))}]" if c - {""} else "") for f, c in cells.items())


def matrix_markdown() -> str:
    """The README's support matrix: every family, and for each source format the engine versions whose plugin
    is proven to serve it (with the method the engine builds for the non-expert layers) and the proof."""
    columns = sorted(RELEASES)  # every release the engine table knows; one without rows serves nothing yet
    head = ["family", "releases", "source format", *columns, "proof (serving_tests/)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for f in FAMILIES:
        formats = list(dict.fromkeys(s.source_format for s in (*table.SERVED, *table.REFUSED) if s.family == f.name))
        if not formats:
            lines.append(f"| {f.name} | {f.examples} | | " + " | ".join("refused" for _ in columns)
                         + " | none: no serving test loads it yet |")
        for fmt in formats:
            rows = entries(f.name, fmt)
            said = {r.engine: r for r in table.REFUSED if r.family == f.name and r.source_format == fmt}
            cells = [next((f"served ({'/'.join(sorted(s.methods))})" for s in rows if s.engine == key),
                          "refused by the engine (see below)" if key in said else "refused") for key in columns]
            lines.append(f"| {f.name} | {f.examples} | {fmt} | " + " | ".join(cells) + f" | {_proof_cell(rows)} |")
    lines += ["", *(f"- {r.family} {r.source_format} on {r.engine}: {r.reason} (`{r.proof.removeprefix('serving_tests/')}`)"
                    for r in table.REFUSED)] if table.REFUSED else []
    return "\n".join([MATRIX_BEGIN, *lines, MATRIX_END])
