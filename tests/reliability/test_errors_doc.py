"""docs/ERRORS.md cannot go stale: every error id the code can raise and every validate check id
must be listed there (as `id` in backticks)."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[2]
# every folder of the package (pyproject's package-dir is the one home of that list)
SOURCES = sorted({REPO / d for d in tomllib.loads((REPO / "pyproject.toml").read_text())
                  ["tool"]["setuptools"]["package-dir"].values()})
DOC = REPO / "docs" / "ERRORS.md"

_ID = r"[a-z0-9_]+(?:\.[a-z0-9_\-]+)+"
# error_id="x" (and a conditional's other branch on the same line), the reader's missing_id= /
# bad_id= arguments, the header parser's _err("x", ...), and validate's @check(id="x")
_ID_LINE = re.compile(r"\b(?:error_id|missing_id|bad_id)=")
_LITERAL = re.compile(rf'"({_ID})"')
_HEADER_ERR = re.compile(rf'\b_err\(\s*"({_ID})"')
_FILE_NAMES = (".json", ".safetensors", ".md", ".py")
_CHECK = re.compile(rf'@check\(\s*id="({_ID})"')


def _ids() -> dict[str, str]:
    """id -> first place it is raised (file:line)."""
    found: dict[str, str] = {}
    for root in SOURCES:
        for path in sorted(root.rglob("*.py")) if root.is_dir() else []:
            text = path.read_text()
            for lineno, line in enumerate(text.splitlines(), 1):
                ids = _HEADER_ERR.findall(line) + _CHECK.findall(line)
                if _ID_LINE.search(line):
                    ids += _LITERAL.findall(line)
                for i in ids:
                    if not i.endswith(_FILE_NAMES):  # file= arguments on the same line
                        found.setdefault(i, f"{path.relative_to(REPO)}:{lineno}")
            # a call split over lines: error_id=\n "x"
            for m in re.finditer(rf'\b(?:error_id|missing_id|bad_id)=\s*\n\s*"({_ID})"', text):
                found.setdefault(m.group(1), str(path.relative_to(REPO)))
    return found


def test_the_scan_finds_the_known_kinds_of_id():
    ids = _ids()
    # one of each way an id is written, so a change in style cannot silently empty the scan
    for expected in ("output.locked", "config.missing", "index.not_json", "header.offsets_past_eof",
                     "group.scale_without_weight", "structure.shard.header", "nvfp4.scale.nan"):
        assert expected in ids, expected
    assert len(ids) >= 90


def test_every_error_id_is_documented():
    documented = set(re.findall(r"`([^`\s]+)`", DOC.read_text()))
    missing = {i: where for i, where in _ids().items() if i not in documented}
    assert not missing, "add these ids to docs/ERRORS.md (id, class / exit, cause, fix):\n" + "\n".join(
        f"  {i}  ({where})" for i, where in sorted(missing.items()))
