"""Issue 37 item 9: every text that tells a user to `pip install` something names only a path (the user's
clone, a wheel built from it) or a package the project depends on by name (torch, the engines, the
extras' packages): never `dsv4-convert`, a name no package index holds for this project (anyone could
register it and be installed into the server's environment). Scanned: every Markdown file of the
project, the string text of every module, and what the real CLI generates (a conversion's SERVING.md for
each engine, `plan` on the converted checkpoint, every command's --help).

Substitution: real files and the real CLI's command lines, run in one CLI process (run_cli_batch: `main(argv)` each,
as the console script runs it, its exit code, stdout and stderr), not one process each: a process start costs more
than these commands."""

from __future__ import annotations

import re
import shlex
from importlib.metadata import requires
from pathlib import Path

import pytest

from dsv4_convert.core.targets.engines import ENGINES
from dsv4_convert.core.version import install_command
from tests.helpers.cli import run_cli_batch, succeeded

ROOT = Path(__file__).resolve().parents[2]
_PIP = re.compile(r"pip install\s+([^`\n;)#&|\"]*)")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*")


def _owned_names() -> set[str]:
    """Packages the project installs by name: its dependencies, its extras' packages, the engines'."""
    names = {_NAME.match(r).group(0).lower() for r in requires("dsv4-convert")}  # extras' included
    return names | {p.dist.lower() for e in ENGINES.values() for p in e.packages}


def unowned_installs(text: str) -> list[str]:
    """Every `pip install` word in `text` that is neither an option, a path nor an owned package name."""
    owned, bad = _owned_names(), []
    for m in _PIP.finditer(text):
        try:
            words = shlex.split(m.group(1))
        except ValueError:  # an unclosed quote in prose: split on blanks
            words = m.group(1).split()
        for w in words:
            w = w.strip("'\"")
            if not w or w.startswith("-") or w == "\\" or "{" in w or w.startswith(("/", ".", "~", "$")) or "/" in w:
                continue  # an option, a line continuation, a template, a path
            name = _NAME.match(w)
            if name is None or name.group(0).lower() not in owned:
                bad.append(f"pip install {m.group(1).strip()}")
                break
    return bad


def test_the_walk_finds_an_unowned_name():
    """The scanner itself: it flags the old line and a bare name, and passes paths and owned pins."""
    assert unowned_installs("run `pip install dsv4-convert` first")
    assert unowned_installs("pip install 'dsv4-convert[ray]' (on every node)")
    assert unowned_installs("pip install numpy evil-package")
    assert not unowned_installs(f"`{install_command()}` and {install_command('ray')}; pip install 'vllm==0.34.0'")
    assert not unowned_installs("pip install torch==2.13.0 -e '.[test]' \\")


def _project_texts():
    for p in sorted(ROOT.rglob("*.md")):
        if not any(part.startswith(".") for part in p.relative_to(ROOT).parts):
            yield p
    for folder in ("cli", "convert", "core", "formats", "runtime", "serving", "synth", "validate"):
        yield from sorted((ROOT / folder).rglob("*.py"))


def test_no_doc_or_module_names_an_unowned_package():
    found = {str(p.relative_to(ROOT)): bad for p in _project_texts() if (bad := unowned_installs(p.read_text()))}
    assert not found, found


HELPED = ("nvfp4-to-marlin", "mxfp4-to-marlin", "marlin-to-source", "validate", "plan", "inspect", "doctor")


@pytest.mark.slow
def test_generated_serving_notes_plan_and_help_name_no_unowned_package(synth_source, tmp_path):
    src = synth_source("nvfp4-modelopt-dsv4", layers=1, experts=4)
    steps = {**{(engine, step): argv for engine in ENGINES for step, argv in (
        ("convert", ["nvfp4-to-marlin", src, tmp_path / engine, "--target", engine, "--workers", "1", "-q"]),
        ("plan", ["plan", tmp_path / engine, "--gpus", "2", "--target", engine]))},
             **{(cmd, "help"): [cmd, "--help"] for cmd in HELPED}}
    runs = dict(zip(steps, run_cli_batch(list(steps.values()), tmp_path)))
    for key, proc in runs.items():
        succeeded(proc)
    texts = {}
    for engine in ENGINES:
        serving = (tmp_path / engine / "SERVING.md").read_text()
        assert install_command() in serving  # the one install line, from the clone
        texts[f"{engine} SERVING.md"] = serving
        plan = runs[engine, "plan"]
        assert install_command() in plan.stdout + plan.stderr
        texts[f"{engine} plan"] = plan.stdout + plan.stderr
    for cmd in HELPED:
        texts[f"{cmd} --help"] = runs[cmd, "help"].stdout
    found = {k: bad for k, t in texts.items() if (bad := unowned_installs(t))}
    assert not found, found
