"""Test-only hooks, never shipped: on the PYTHONPATH of a converter subprocess (tests/helpers/cli.py (run_cli)
puts it there when the test sets one of HOOK_VARS; the Ray test cluster's nodes have it too), they change
a run at points the package exposes as plain values or no-op functions, so no shipped module reads a
test switch.

    DSV4_CONVERT_KILL_AT=n      SIGKILL at the n-th step (a tensor written, a finalize stage)
    DSV4_CONVERT_KILL_AT=n:INT  SIGINT there instead (Ctrl-C)
    DSV4_CONVERT_RUN_AT=n:CMD   run the shell command CMD at the n-th step, wait for it, go on
                                (an input edited "during the run", at a known point)
    DSV4_CONVERT_PIECE_BYTES=n  the piece size floor (convert/pieces.py PIECE_MIN_BYTES, 64 MiB) lowered
                                to n bytes, so that checkpoints of a few MiB split as a real layer does
    DSV4_CONVERT_PAUSE_TASK=ARM a Ray job that reports progress, while the file ARM exists and names a
                                pid file that does not exist yet, creates that pid file (O_EXCL: the first
                                job cluster-wide), writes its pid and sleeps up to 60 s, so that a test can
                                SIGKILL that worker by pid mid-shard

Each hook replaces a name in its module when that module is imported (the CLI process; forked pool
workers inherit it; a Ray worker imports it itself): `_step` in convert/pipeline.py (a no-op),
`PIECE_MIN_BYTES` in convert/pieces.py, `_run_job` in runtime/ray_executor.py (its progress callback
wrapped). A bad value stops the process at start-up."""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import re
import signal
import subprocess
import sys
import time

HOOK_VARS = ("DSV4_CONVERT_KILL_AT", "DSV4_CONVERT_RUN_AT", "DSV4_CONVERT_PIECE_BYTES", "DSV4_CONVERT_PAUSE_TASK")
_KILL, _RUN, _PIECES, _PAUSE = HOOK_VARS


def _parse_kill(raw: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)(:INT)?", raw)
    if not m or int(m.group(1)) < 1:
        raise SystemExit(f"tests/hooks: {_KILL}={raw!r}: use n or n:INT with n >= 1")
    return int(m.group(1)), signal.SIGINT if m.group(2) else signal.SIGKILL


def _steps(at: int | None, sig: int, run_at: int | None, command: str):
    def install(module) -> None:
        steps = 0

        def step() -> None:
            nonlocal steps
            steps += 1
            if steps == run_at:
                subprocess.run(command, shell=True, check=True)
            if steps == at:
                os.kill(os.getpid(), sig)

        module._step = step
    return install


def _pieces(raw: str):
    if not raw.isdigit() or int(raw) < 1:
        raise SystemExit(f"tests/hooks: {_PIECES}={raw!r}: use a whole number of bytes >= 1")

    def install(module) -> None:
        module.PIECE_MIN_BYTES = int(raw)
    return install


def _pause(arm: str) -> None:
    try:
        pid_file = open(arm).read().strip()
        fd = os.open(pid_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError:  # not armed, or another job paused first
        return
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.1)


def _pausing(arm: str):
    def install(module) -> None:
        run_job = module._run_job

        def _run_job(fn, args, *rest, **kwargs):
            def job(*a, callback=None):
                if callback is None:
                    return fn(*a)

                def tick(n: int) -> None:
                    _pause(arm)
                    callback(n)
                return fn(*a, callback=tick)
            return run_job(job, args, *rest, **kwargs)
        module._run_job = _run_job
    return install


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, hooks: dict):
        self.hooks = hooks  # module name -> [install(module)]

    def find_spec(self, name, path, target=None):
        installs = self.hooks.pop(name, None)
        if installs is None:
            return None
        spec = importlib.util.find_spec(name)  # popped above: this finder now answers None for it
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            for install in installs:
                install(module)

        spec.loader.exec_module = exec_module
        return spec


def _hooks() -> dict:
    env, hooks = os.environ, {}
    if env.get(_KILL) or env.get(_RUN):
        at, sig = _parse_kill(env[_KILL]) if env.get(_KILL) else (None, signal.SIGKILL)
        run_at, _, command = env.get(_RUN, "").partition(":")
        if run_at and not run_at.isdigit():
            raise SystemExit(f"tests/hooks: {_RUN}: use n:COMMAND")
        hooks.setdefault("dsv4_convert.convert.pipeline", []).append(
            _steps(at, sig, int(run_at) if run_at else None, command))
    if env.get(_PIECES):
        hooks.setdefault("dsv4_convert.convert.pieces", []).append(_pieces(env[_PIECES]))
    if env.get(_PAUSE):
        hooks.setdefault("dsv4_convert.runtime.ray_executor", []).append(_pausing(env[_PAUSE]))
    return hooks


_wanted = _hooks()
if _wanted:
    sys.meta_path.insert(0, _Finder(_wanted))
