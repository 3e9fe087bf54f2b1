"""The README's layering claim, checked on the source: every `dsv4_convert` import (module level or
inside a function) of every file, parsed with ast, must follow an allowed arrow.

  formats   -> nothing of the project, except the engine facts table (core.engines)
  core      -> formats
  convert, validate, serving -> core, formats
  cli       -> everything
plus the named exceptions below, each with its reason. No substitutions: the real tree is read.
"""

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("formats", "core", "convert", "validate", "serving")  # package-dir mapping of pyproject.toml

ALLOWED = {
    "formats": set(),
    "core": {"formats"},
    "convert": {"core", "formats"},
    "validate": {"core", "formats"},
    "serving": {"core", "formats"},
    "cli": {"core", "formats", "convert", "validate", "serving"},
}

# (importing layer, imported module): the few arrows that cross the layering on purpose
EXCEPTIONS = {
    # one home for each engine fact (layout tags, versions, MXFP4 needs bf16): the codecs read it
    ("formats", "dsv4_convert.core.engines"),
    # validate verifies what the converter records, through the records' one home: the hash
    # (convert/digest.py), the manifest and its file name, and the producer version in reports
    ("validate", "dsv4_convert.digest"),
    ("validate", "dsv4_convert.manifest"),
    ("validate", "dsv4_convert.staging"),
    ("validate", "dsv4_convert"),
    # validate's batches run on the one executor seam (local process pool or Ray tasks) the converter uses
    ("validate", "dsv4_convert.executors"),
}


def _layer_of_file(path: Path) -> str:
    rel = path.relative_to(ROOT).parts
    return "cli" if rel[:2] == ("convert", "cli") else rel[0]


def _layer_of_module(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "dsv4_convert":
        return None
    if len(parts) > 1 and parts[1] in ("formats", "core", "validate", "serving", "cli"):
        return parts[1]
    return "convert"  # dsv4_convert itself and its top-level modules live in convert/ (synth too)


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import (every import is absolute)"
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names)


def _arrows() -> dict[tuple[str, str], set[str]]:
    arrows = defaultdict(set)
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            src = _layer_of_file(path)
            for module in _imports(path):
                dst = _layer_of_module(module)
                if dst is not None and dst != src:
                    arrows[(src, module)].add(str(path.relative_to(ROOT)))
    return arrows


def test_every_import_follows_an_allowed_arrow():
    arrows = _arrows()
    assert arrows, "no project imports found: the tree walk is broken"
    bad = sorted(f"{', '.join(sorted(files))}: {src} -> {module}" for (src, module), files in arrows.items()
                 if _layer_of_module(module) not in ALLOWED[src] and (src, module) not in EXCEPTIONS)
    assert bad == []


def test_every_exception_is_still_needed():
    used = set(_arrows())
    assert sorted(EXCEPTIONS - used) == []


def test_the_walk_sees_a_violation():
    """The check can fail: a formats -> validate arrow is not allowed."""
    assert _layer_of_module("dsv4_convert.validate.runner") not in ALLOWED["formats"]
    assert _layer_of_module("dsv4_convert.pipeline") == "convert"
    assert "convert" not in ALLOWED["core"]
