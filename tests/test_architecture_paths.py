"""docs/ARCHITECTURE.md matches the code: every file or folder it names exists. A name with a folder
(`runtime/output/tree.py`, `core/sources/`) must exist at that path from the repository root (or, in the
serving-proofs section, under serving_tests/); a bare file name (`hybrid.py`, listed beside its folder) must
exist somewhere in the tree. Placeholders (`serving/<engine>_*.py`) are skipped. The last test runs the
same walk over a made-up document. No substitutions: the real document and tree are read."""

from __future__ import annotations

import re
from pathlib import Path

from tests.test_layering import ROOT

DOC = ROOT / "docs" / "ARCHITECTURE.md"
# a path-like token: words, dots and slashes, ending in a file suffix or a slash
NAMED = re.compile(r"(?<![\w./-])((?:[\w.][\w.-]*/)*[\w.][\w.-]*\.(?:py|md|toml|sh|json|lock)|(?:[\w.][\w.-]*/)+)(?![\w/<*])")
_SKIP = {"OUT.partial/", "OUT/", "dsv4-convert-source/", "tests/golden/"}  # run-time names and one data folder


def missing(doc: str, root: Path = ROOT) -> list[str]:
    """The paths `doc` names that the tree at `root` does not hold."""
    bare = {p.name for p in root.rglob("*") if ".venv" not in p.parts and ".git" not in p.parts}
    gone = []
    for token in NAMED.findall(doc.replace("<br/>", " ")):
        if "<" in token or token in _SKIP or token.startswith(("http", "www.")):
            continue
        if "/" not in token.rstrip("/"):
            ok = token.rstrip("/") in bare
        else:
            ok = any((base / token).exists() for base in (root, root / "serving_tests", root / "docs"))
        if not ok:
            gone.append(token)
    return sorted(set(gone))


def test_every_path_architecture_md_names_exists():
    assert missing(DOC.read_text()) == []


def test_the_walk_finds_a_made_up_stale_path(tmp_path):
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "jobs.py").write_text("")
    doc = "| staging | `runtime/jobs.py` (`RunDir`), `runtime/staging.py`, `jobs.py`, `gone.py`, `serving/<engine>_*.py` |"
    assert missing(doc, tmp_path) == ["gone.py", "runtime/staging.py"]
