"""What a job needs wherever it runs (a local pool worker or a Ray task): its scratch directory
(`RunDir`), its thread count, its declared memory, the pause hook of the crash tests, and that a
pool worker never outlives its parent (`stop_with_parent`). Both executors import this module; neither
imports the other's."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import sys
import threading
import uuid
from pathlib import Path

from ..core.errors import OutputError

__all__ = ["RunDir", "one_thread_per_job", "stop_with_parent", "task_memory"]

_WORKER_BYTES = 768 << 20  # a worker process (torch imported if the torch route runs), plus one copy chunk
_STREAM_BOUND = 512 << 20  # a job streams: it never holds more than about this much of its shard at once
_RUN_PREFIX = ".run-"
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_PARENT_POLL_S = 0.5  # the portable watch: how often a worker asks whether its parent is still there


def task_memory(job_bytes: int) -> int:
    """Memory a Ray task declares for a job of `job_bytes` (a shard's bytes in the plan): the worker
    process, plus the part of the shard it can hold at once (the conversion streams)."""
    return _WORKER_BYTES + min(job_bytes, _STREAM_BOUND)


# -- the run's scratch directory, and the fence ---------------------------------------------------
class RunDir:
    """`<staging>/.run-<token>/`: the only place workers write. A token file in it lets every node
    prove it sees the same directory, and lets a task refuse to start once its run was fenced."""

    def __init__(self, staging_path: Path):
        self.token = uuid.uuid4().hex[:16]
        self.path = Path(staging_path) / f"{_RUN_PREFIX}{self.token}"
        self.token_file = self.path / "token"

    @staticmethod
    def fence(staging_path: Path) -> None:
        """Move every older run's scratch directory out of the staging directory (one atomic rename
        each: a surviving task's next open fails), then delete it. Call with the staging lock held."""
        staging_path = Path(staging_path)
        for old in sorted(staging_path.glob(_RUN_PREFIX + "*")):
            dead = staging_path.with_name(f"{staging_path.name}.fenced-{old.name[len(_RUN_PREFIX):]}")
            os.rename(old, dead)
            shutil.rmtree(dead, ignore_errors=True)  # a file a task still holds open may linger; never in OUT

    def create(self) -> None:
        self.path.mkdir()
        self.token_file.write_text(self.token)

    def tmp(self, name: str) -> Path:
        return self.path / (name + ".tmp")

    def hand_over(self, name: str, size: int, dest: Path, sidecars: tuple[str, ...] = ()) -> None:
        """Move a finished job's file (`name.tmp`) and its sidecars (`name + suffix`) to `dest`."""
        tmp = self.tmp(name)
        if tmp.stat().st_size != size:  # a second writer (a zombie retry) would show here first
            raise OutputError(f"{name}: the task reported {size} bytes, {tmp} has {tmp.stat().st_size}",
                              error_id="convert.worker_died",
                              hint="another process wrote this run's file: stop it, then run the same command again")
        for suffix in sidecars:
            side = self.path / (name + suffix)
            if side.exists():
                os.replace(side, Path(dest) / side.name)
        os.replace(tmp, Path(dest) / tmp.name)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def one_thread_per_job() -> None:
    """In a pool worker or a Ray task: the other cores run other jobs, so torch (where a job imports
    it) runs on one thread; more would only contend, and its small ops only woke OpenMP threads that
    then spun. The jobs' own kernels are told their thread count as a value (the executors'
    threads_per_job, a job argument)."""
    torch = sys.modules.get("torch")  # never imported for this: the CPU route does not need torch
    if torch is not None:
        torch.set_num_threads(1)


def stop_with_parent(parent: int | None = None) -> None:
    """In a pool worker's initializer: this process dies with its parent, whatever kills the parent
    (SIGKILL, the OOM killer), so that no worker goes on writing or holding files once its run is gone
    (issue 37: workers re-parented to init slept on for ever, and `--resume` found the output locked).
    `parent` is the pid the worker was started by (None: the parent it has now).

    Linux: the kernel sends SIGKILL the moment the parent exits (prctl PR_SET_PDEATHSIG; the pool must
    be fed from a thread that outlives it, the main thread here, as the signal follows the forking
    thread). Everywhere, and in case prctl is refused: a daemon thread that SIGKILLs this process once
    its parent pid changes (a re-parented process gets init's, or a subreaper's). A parent that died
    before either was set up is caught by the first check."""
    parent = os.getppid() if parent is None else parent
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # no libc symbol (a static or unusual build): the watch below covers it
            pass
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=_watch_parent, args=(parent,), name="dsv4-parent-watch", daemon=True).start()


def _watch_parent(parent: int) -> None:
    stop = threading.Event()  # never set: its wait() is the pause between two looks
    while os.getppid() == parent:
        stop.wait(_PARENT_POLL_S)
    os.kill(os.getpid(), signal.SIGKILL)
