"""CONTRIBUTING's "modules stay <= 350 lines", checked on the source: every .py file of every layer (the folders
pyproject.toml's package-dir maps, as tests/test_layering.py reads them). The last test runs the same walk over a
small tree made to break the rule. No substitutions: the real tree is read."""

from __future__ import annotations

from pathlib import Path

from tests.test_layering import ROOT, package_dirs

MAX_LINES = 350


def oversized(root: Path = ROOT, limit: int = MAX_LINES) -> dict[str, int]:
    """module path -> its line count, for every module of the package longer than `limit` lines."""
    found = {}
    for folder in package_dirs(root).values():
        for path in sorted((root / folder).rglob("*.py")):
            lines = len(path.read_text().splitlines())
            if lines > limit:
                found[path.relative_to(root).as_posix()] = lines
    return found


def test_every_module_is_at_most_350_lines():
    assert oversized() == {}, "split these modules by concern (CONTRIBUTING.md, 'Code')"


def test_the_walk_finds_a_made_up_long_module(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools]\npackage-dir = {"dsv4_convert.core" = "core"}\n')
    (tmp_path / "core" / "deep").mkdir(parents=True)
    (tmp_path / "core" / "short.py").write_text("x = 1\n" * MAX_LINES)
    (tmp_path / "core" / "deep" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert oversized(tmp_path) == {"core/deep/long.py": MAX_LINES + 1}
