"""Issue 23 items 5 and 12: what the tool takes from the environment is parsed strictly (a typed
`env.bad_value` naming the variable, one JSON object, never a traceback, never exit 0), the crash
test switch is not read by shipped code, and OUT = `/` is a typed refusal for every writing command.
Real CLI runs in subprocesses (the environment is read at a process's start); the refusals of OUT = `/`, which read
no environment, run their command lines in one CLI process (run_cli_batch: `main(argv)` each, as the console script
runs it, its exit code, stdout and stderr): a process start costs more than these commands.

Substitutions: none besides that batch (the crash hook itself is exercised by tests/convert/test_convert_faults.py and
tests/reliability/test_integrity.py through tests/hooks/sitecustomize.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from dsv4_convert.synth import write_synthetic_checkpoint
from tests.helpers.cli import CLI, HOOK_VARS, run_cli, run_cli_batch

pytestmark = pytest.mark.slow  # every test here starts the CLI

REPO = Path(__file__).resolve().parents[2]
SHIPPED = ("cli", "convert", "core", "formats", "runtime", "serving", "synth", "validate")


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    return write_synthetic_checkpoint(tmp_path_factory.mktemp("env") / "src", format="nvfp4-modelopt-dsv4",
                                      layers=1, experts=4)


def _typed(proc, code: int, error_id: str) -> dict:
    assert "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)
    assert (proc.returncode, doc["exit_code"], doc["error"]["id"]) == (code, code, error_id), proc.stderr
    return doc


@pytest.mark.parametrize(("name", "value"), [
    ("NUMBA_NUM_THREADS", "0"), ("NUMBA_NUM_THREADS", "abc"), ("NUMBA_NUM_THREADS", "-2"),
    ("DSV4_CONVERT_DIRECT_IO", "maybe"), ("DSV4_CONVERT_TORCH_ROUTE", "2"), ("DSV4_DEBUG", "verbose"),
    ("DSV4_CONVERT_ALLOW_UNSERVABLE", "please"),
])
def test_a_bad_setting_is_a_usage_error_that_names_it(src, tmp_path, name, value):
    out = tmp_path / "out"
    doc = _typed(run_cli("nvfp4-to-marlin", src, out, "--json", env={name: value}, check=False), 2, "env.bad_value")
    assert doc["error"]["file"] == name and repr(value) in doc["error"]["message"]
    assert not out.exists() and not Path(f"{out}.partial").exists()
    _typed(run_cli("validate", src, "--json", env={name: value}, check=False), 2, "env.bad_value")


def test_good_settings_still_work(src, tmp_path):
    env = {"NUMBA_NUM_THREADS": "1", "DSV4_CONVERT_DIRECT_IO": "0", "DSV4_CONVERT_TORCH_ROUTE": "no"}
    run_cli("nvfp4-to-marlin", src, tmp_path / "out", "-q", "--workers", "1", env=env)


# an environment read, as code spells it (a write such as os.environ.setdefault is not one)
_READS = re.compile(r"os\.environ(?!\.setdefault\()|getenv\(|envvar=")


def test_shipped_code_reads_no_test_switch_and_the_environment_in_one_place():
    """The test hooks live in tests/hooks; no shipped module names them, and every environment read of
    the package is in runtime/settings.py (parsed once, env.bad_value for a bad value)."""
    seen = []
    for folder in SHIPPED:
        for path in (REPO / folder).rglob("*.py"):
            text = path.read_text()
            assert not [v for v in HOOK_VARS if v in text], path
            if _READS.search(text):
                seen.append(path.relative_to(REPO).as_posix())
    assert seen == ["runtime/settings.py"]
    assert _READS.search('x = os.environ.get("A")') and not _READS.search('os.environ.setdefault("A", "0")')


def test_a_test_hook_variable_is_no_setting_of_the_tool(src, tmp_path):
    """#28 item 13: DSV4_CONVERT_PIECE_BYTES=abc was a ValueError traceback. Shipped code no longer reads
    any hook variable, so a user's stray value changes nothing (a plain subprocess: no tests/hooks)."""
    env = dict(os.environ, **{v: "abc" for v in HOOK_VARS})
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([*CLI, "nvfp4-to-marlin", str(src), str(tmp_path / "out"), "-q", "--workers", "1"],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr


ROOTS = ["/", "/..", "//"]


@pytest.fixture(scope="module")
def at_root(src, tmp_path_factory) -> dict:
    """root -> the answers of every writing command given OUT = root, all roots' in one CLI process."""
    steps = {root: [[*args, "--json"] for args in (
        ["nvfp4-to-marlin", src, root], ["nvfp4-to-marlin", src, root, "--force"], ["marlin-to-source", src, root],
        ["synth", root], ["synth", root, "--force"])] for root in ROOTS}
    answers = iter(run_cli_batch([argv for lines in steps.values() for argv in lines], tmp_path_factory.mktemp("root")))
    return {root: [next(answers) for _ in lines] for root, lines in steps.items()}


@pytest.mark.parametrize("root", ROOTS)
def test_out_at_the_filesystem_root_is_a_typed_refusal(at_root, root):
    assert len(at_root[root]) == 5
    for proc in at_root[root]:
        doc = _typed(proc, 2, "paths.out_is_root")
        assert re.search("filesystem root", doc["error"]["message"])


@pytest.mark.skipif(importlib.util.find_spec("ray") is None,  # the address is checked once Ray is known present;
                    reason="Ray is not installed ('.[ray]'); tests/runtime/test_executor_seam.py checks usage.ray_missing")
@pytest.mark.parametrize(("address", "said"), [("127.0.0.1:1", "nothing answers"), ("ray://127.0.0.1:1", "nothing answers"),
                                               ("no-port-here", "not HOST:PORT")])
def test_an_unusable_ray_address_is_refused_naming_what_was_typed(src, tmp_path, address, said):
    """Item 12 of the attack: nothing listening took 824 s and named another address. The refusal now
    comes from a plain TCP connect (a closed local port answers at once); no Ray cluster is started."""
    out = tmp_path / "out"
    proc = run_cli("nvfp4-to-marlin", src, out, "--executor", "ray", "--ray-address", address, "--json",
                   check=False)
    doc = _typed(proc, 2, "usage.ray_address")
    assert address in doc["error"]["message"] and said in doc["error"]["message"] and doc["error"]["file"] == address
    assert not out.exists() and not Path(f"{out}.partial").exists()
