"""Issue 37 item 1: a conversion whose main process is SIGKILLed (as the OOM killer or a scheduler
would) leaves no worker behind, and no lock: `--resume` continues it to the bytes of a clean run. At
every worker count: 1 (the jobs run in the main process), 2 (a pool), and the default (auto).

The run is held at a known point with the crash tests' step hook (tests/hooks/sitecustomize.py,
DSV4_CONVERT_RUN_AT): at the 40th tensor a process writes, it waits while a file exists. Every shard
holds at most 30 tensors, so each process has handed over a finished shard before it waits, and the run
cannot finish while the file exists. The test waits for a finished shard in OUT.partial (an
observable, not a sleep), records the main process's workers from /proc, SIGKILLs the main process,
and polls /proc until the workers are gone (a generous hang guard, no speed claim).

Substitutions: the hold is the hook's shell command (`while [ -e FILE ]; do sleep 0.05; done`), a
stand-in for a slow shard; it is removed once the main process is dead. Linux only (/proc)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.cli import CLI, run_cli, tree_hashes, with_hooks

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")]

FMT = "nvfp4-modelopt-dsv4"
ARGS = ("--target", "vllm", "--max-shard-size", "120KB", "-q")  # 28 shards of at most 30 tensors
HOLD_AT = 40  # > the most tensors of one shard: every process finishes a shard first
GUARD_S = 120  # hang guard only


@pytest.fixture(scope="module")
def reference(tmp_path_factory, synth_source):
    src = synth_source(FMT, experts=8, mtp=True)
    out = tmp_path_factory.mktemp("clean") / "out"
    run_cli("nvfp4-to-marlin", src, out, *ARGS, "--workers", "1")
    return src, tree_hashes(out)


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, start time) of a live process, None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[19])


def _children(pid: int) -> dict[int, int]:
    """pid -> start time of the processes `pid` started that run the same command line as it (its
    pool workers; the hook's shell is not one)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return {}
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
            same = (entry / "cmdline").read_bytes() == cmdline
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        if int(fields[1]) == pid and same:
            found[int(entry.name)] = int(fields[19])
    return found


def _gone(pid: int, started: int) -> bool:
    st = _stat(pid)
    return st is None or st[1] != started or st[0] in ("Z", "X")  # a zombie holds no file


def _wait_for(what, proc=None, label=""):
    deadline = time.monotonic() + GUARD_S
    while time.monotonic() < deadline:
        if what():
            return True
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run ended ({proc.returncode}) before {label}: {proc.stderr.read()}")
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("workers", [("--workers", "1"), ("--workers", "2"), ()], ids=["1", "2", "auto"])
def test_sigkill_of_the_main_process_leaves_no_worker_and_resume_completes(tmp_path, reference, workers):
    src, expected = reference
    out, hold = tmp_path / "out", tmp_path / "hold"
    partial = out.with_name("out.partial")
    hold.write_text("")
    env = dict(os.environ, DSV4_CONVERT_RUN_AT=f"{HOLD_AT}:while [ -e {hold} ]; do sleep 0.05; done",
               PYTHONPATH=with_hooks(os.environ.get("PYTHONPATH")))
    proc = subprocess.Popen([*CLI, "nvfp4-to-marlin", str(src), str(out), *ARGS, *workers], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        finished = lambda: any(p.suffix == ".safetensors" for p in partial.glob("*.safetensors"))  # noqa: E731
        assert _wait_for(finished, proc, "a finished shard"), "no shard finished"
        pool = _children(proc.pid)
        if workers == ("--workers", "2"):
            assert len(pool) == 2, f"expected 2 pool workers, found {pool}"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
        hold.unlink(missing_ok=True)  # the hook's shell loops end
    assert _wait_for(lambda: all(_gone(p, t) for p, t in pool.items())), \
        f"workers outlived their run: {[p for p, t in pool.items() if not _gone(p, t)]}"
    assert not out.exists() and partial.is_dir()
    resumed = run_cli("nvfp4-to-marlin", src, out, *ARGS, *workers, "--resume", check=False)
    assert resumed.returncode == 0, resumed.stderr
    assert "Traceback" not in resumed.stderr
    assert tree_hashes(out) == expected
    assert not partial.exists()
