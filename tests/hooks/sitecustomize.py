"""Test-only crash hook, never shipped: on the PYTHONPATH of a converter subprocess (tests/helpers/cli.py (run_cli)
puts it there when the test sets DSV4_CONVERT_KILL_AT), it makes the run kill itself at a chosen step.

    DSV4_CONVERT_KILL_AT=n      SIGKILL at the n-th step (a tensor written, a finalize stage)
    DSV4_CONVERT_KILL_AT=n:INT  SIGINT there instead (Ctrl-C)
    DSV4_CONVERT_RUN_AT=n:CMD   run the shell command CMD at the n-th step, wait for it, go on
                                (an input edited "during the run", at a known point)

The converter calls `dsv4_convert.convert.pipeline._step()` at each step and does nothing there; this
module replaces that function when the pipeline module is imported (in the CLI process; the forked
pool workers inherit it). A value that is not `n` or `n:INT` stops the test process at start-up."""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import re
import signal
import subprocess
import sys

_ENV = "DSV4_CONVERT_KILL_AT"
_RUN_ENV = "DSV4_CONVERT_RUN_AT"
_TARGET = "dsv4_convert.convert.pipeline"


def _parse(raw: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)(:INT)?", raw)
    if not m or int(m.group(1)) < 1:
        raise SystemExit(f"tests/hooks: {_ENV}={raw!r}: use n or n:INT with n >= 1")
    return int(m.group(1)), signal.SIGINT if m.group(2) else signal.SIGKILL


def _install(module, at: int | None, sig: int, run_at: int | None, command: str) -> None:
    steps = 0

    def step() -> None:
        nonlocal steps
        steps += 1
        if steps == run_at:
            subprocess.run(command, shell=True, check=True)
        if steps == at:
            os.kill(os.getpid(), sig)

    module._step = step


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, *hook):
        self.hook = hook

    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            _install(module, *self.hook)

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get(_ENV) or os.environ.get(_RUN_ENV):
    _at, _sig = _parse(os.environ[_ENV]) if os.environ.get(_ENV) else (None, signal.SIGKILL)
    _run_at, _, _command = os.environ.get(_RUN_ENV, "").partition(":")
    if _run_at and not _run_at.isdigit():
        raise SystemExit(f"tests/hooks: {_RUN_ENV}: use n:COMMAND")
    sys.meta_path.insert(0, _Finder(_at, _sig, int(_run_at) if _run_at else None, _command))
