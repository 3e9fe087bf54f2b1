"""Where per-shard jobs run: `local` (a process pool on this machine, the default) or `ray` (Ray tasks
across a cluster). Both take the same jobs and give the same bytes; the driver plans, publishes and
finalizes the same way whichever runs them.

Workers write only into this run's scratch directory (`RunDir`) inside the staging directory; the
driver moves each finished shard out of it. A resumed run first moves every older run's scratch
directory out of the staging directory (`RunDir.fence`), so a task that outlived its driver can no
longer create a file where the new run looks. Ray is imported only when `--executor ray` is chosen."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import UsageError
from ..core.version import install_command
from .cpu_budget import auto_workers, job_threads, physical_cores
from .jobs import RunDir, one_thread_per_job, stop_with_parent

__all__ = ["ExecutorSpec", "LocalExecutor", "auto_workers", "make_executor", "physical_cores", "refuse_device"]

EXECUTORS = ("local", "ray")


@dataclass(frozen=True)
class ExecutorSpec:
    """What --executor / --ray-address asked for."""
    name: str = "local"
    address: str | None = None  # ray only: None = $RAY_ADDRESS, else a local cluster started for this run


def refuse_device(spec: ExecutorSpec, device: str | None) -> None:
    """The Ray executor runs CPU tasks only: refuse `validate --kernel --device cuda` with it."""
    if spec.name == "ray" and device not in (None, "cpu"):
        raise UsageError(f"--executor ray runs on CPUs only; it cannot be combined with --device {device}",
                         error_id="usage.flags", hint="drop --device, or run with --executor local")


# -- local: a process pool ------------------------------------------------------------------------
_progress_queue = None


def _init_worker(q, parent: int) -> None:
    global _progress_queue
    stop_with_parent(parent)  # a SIGKILLed run leaves no worker behind (nor the locks it inherited)
    _progress_queue = q
    one_thread_per_job()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and cleans up


class _Batched:
    """A worker's progress, sent to the parent at most every 0.1 s and at the end: one message per
    tensor was 30,000 messages for 8 DeepSeek-V4 layers, seconds of the parent's CPU spent draining."""

    def __init__(self, put):
        self.put, self.pending, self.sent = put, 0, time.monotonic()

    def __call__(self, nbytes: int) -> None:
        self.pending += nbytes
        if time.monotonic() - self.sent >= 0.1:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.put(self.pending)
            self.pending, self.sent = 0, time.monotonic()


def _call_with_queue(fn, args, reports_progress: bool):
    if not reports_progress:
        return fn(*args)
    callback = _Batched(_progress_queue.put)
    try:
        return fn(*args, callback=callback)
    finally:
        callback.flush()


class LocalExecutor:
    """A process pool, or inline execution for workers == 1 (simpler to debug and to crash-test)."""

    def __init__(self, workers: int, bar=None):
        self.workers, self.bar = workers, bar
        self.executor = None
        if workers > 1:
            # fork where there is one: a spawned worker spends seconds re-importing torch. The parent
            # runs no torch compute before this, and workers run single-threaded.
            ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
            self.queue = ctx.Queue()
            self.executor = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                                                initargs=(self.queue, os.getpid()))

    def threads_for(self, job_bytes: int) -> int:
        """The CPU threads one job of `job_bytes` may use (runtime/cpu_budget.py)."""
        return job_threads(self.workers, job_bytes)

    def map(self, fn, argsets, on_result, *, reports_progress: bool = False, job_bytes=None) -> None:
        """Run fn(*args) for each args; on_result(result) in the parent as each one finishes. A job that
        reports progress is called with callback=(nbytes -> None)."""
        if self.executor is None:
            for args in argsets:
                on_result(fn(*args, callback=self._tick) if reports_progress else fn(*args))
            return
        pending = {self.executor.submit(_call_with_queue, fn, args, reports_progress) for args in argsets}
        while pending:
            done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            self._drain()
            for fut in done:
                on_result(fut.result())
        self._drain()

    def _tick(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def _drain(self) -> None:
        while True:
            try:
                self._tick(self.queue.get_nowait())
            except queue.Empty:
                return

    def check_paths(self, run: RunDir, inputs: list[Path]) -> None:
        """One machine sees what it wrote: nothing to check."""

    def shutdown(self, cancel: bool = False) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=not cancel, cancel_futures=cancel)


def make_executor(spec: ExecutorSpec, workers: int, bar=None, *, max_in_flight: int | None = None):
    """The executor `spec` names. `workers` sizes the local pool; with Ray, `max_in_flight` (the user's
    --workers) caps the tasks submitted at once (default: as many as the cluster allows)."""
    if spec.name == "local":
        return LocalExecutor(workers, bar)
    try:
        import ray  # noqa: F401
    except ImportError:
        raise UsageError("--executor ray needs Ray, which is not installed", error_id="usage.ray_missing",
                         hint=f"{install_command('ray')} (on every node of the cluster)") from None
    from .ray_executor import RayExecutor
    return RayExecutor(spec.address, bar, max_in_flight=max_in_flight)
