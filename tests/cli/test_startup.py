"""The commands users run many times a day import only what they need: `--help`, `--version` and a
mistyped command import no command module, and `inspect` and `plan` never import torch, numba or
huggingface_hub (torch alone is seconds of start-up). Each command line runs in a fresh interpreter
(the real `main`, as the console script calls it), which then lists the heavy modules it holds: a
check of sys.modules, not a timing (docs/PERFORMANCE.md has the times).

No substitutions: the real CLI on a real synthetic checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dsv4_convert.cli import commands

HEAVY = ("torch", "numba", "huggingface_hub", "numpy", "safetensors", *(m for _, m, _, _ in commands.ALL))

_PROBE = """
import json, sys
from dsv4_convert.cli.main import main
code = 0
try:
    main(sys.argv[1:])
except SystemExit as e:
    code = e.code
sys.stdout.flush()
print("\\n" + json.dumps({"code": code, "heavy": [m for m in %r if m in sys.modules]}))
""" % (HEAVY,)


def _heavy_modules(*argv) -> tuple[int, set[str], str]:
    r = subprocess.run([sys.executable, "-c", _PROBE, *map(str, argv)], capture_output=True, text=True, timeout=120)
    last = json.loads(r.stdout.strip().splitlines()[-1])
    return last["code"], set(last["heavy"]), r.stdout + r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["-h"], ["valdate"]], ids=str)
def test_help_version_and_a_typo_import_no_command(argv):
    code, heavy, out = _heavy_modules(*argv)
    assert code in (0, 2), out
    assert heavy == set(), f"{argv} imported {sorted(heavy)}"


@pytest.mark.slow
def test_help_lists_every_command_with_its_summary():
    code, _, out = _heavy_modules("--help")
    for name, summary in commands.SUMMARIES:
        assert name in out and summary.split()[0] in out, (name, out)
    code, _, out = _heavy_modules("valdate")
    assert code == 2 and "Did you mean 'validate'?" in out


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["inspect", "{src}"], ["inspect", "{src}", "--json"], ["plan", "{src}"],
                                  ["plan", "{src}", "--json"], ["inspect", "--help"], ["plan", "--help"]], ids=str)
def test_inspect_and_plan_import_no_torch_numba_or_hub(synth_source, argv):
    src = synth_source("nvfp4-modelopt-dsv4")
    code, heavy, out = _heavy_modules(*(a.format(src=src) for a in argv))
    assert code in (0, 1), out  # plan: 1 = findings (no split fits the default GPUs), not a crash
    assert not heavy & {"torch", "numba", "huggingface_hub"}, f"{argv} imported {sorted(heavy)}"


@pytest.mark.slow
def test_the_converters_help_imports_no_torch():
    code, heavy, out = _heavy_modules("nvfp4-to-marlin", "--help")
    assert code == 0, out
    assert "torch" not in heavy


def test_every_command_gets_its_summary_from_the_list():
    """commands.ALL is the summaries' one home: load() gives each command its line."""
    for name, summary in commands.SUMMARIES:
        assert commands.load(name).short_help == summary
    assert commands.load("no-such-command") is None
