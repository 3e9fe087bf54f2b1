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
import shutil
import signal
import sys
import time
import uuid
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from dsv4_convert.core.errors import OutputError, UsageError

__all__ = ["ExecutorSpec", "LocalExecutor", "RunDir", "auto_workers", "job_threads", "make_executor",
           "one_thread_per_job", "refuse_device", "task_memory"]

EXECUTORS = ("local", "ray")
_BYTES_PER_WORKER = 256 << 20  # below this much work per worker, another process is not worth starting
_WORKER_BYTES = 768 << 20  # a worker process (torch imported if the torch route runs), plus one copy chunk
_STREAM_BOUND = 512 << 20  # a job streams: it never holds more than about this much of its shard at once
_PAUSE_ENV = "DSV4_CONVERT_PAUSE_TASK"  # test hook: the first job to report progress writes its pid there, sleeps
_RUN_PREFIX = ".run-"


@dataclass(frozen=True)
class ExecutorSpec:
    """What --executor / --ray-address asked for."""
    name: str = "local"
    address: str | None = None  # ray only: None = $RAY_ADDRESS, else a local cluster started for this run


def refuse_device(spec: ExecutorSpec, device: str | None) -> None:
    """The Ray executor runs CPU tasks only this round: refuse `--device cuda` with it."""
    if spec.name == "ray" and device not in (None, "cpu"):
        raise UsageError(f"--executor ray runs on CPUs only; it cannot be combined with --device {device}",
                         error_id="usage.flags", hint="drop --device, or run with --executor local")


def auto_workers(workers: int | None, total_bytes: int, jobs: int) -> int:
    """`workers` if given, else the cores, but no more than the jobs, and in auto mode one process per
    256 MiB of work at most: a worker costs a fork and its own start-up, not worth it for small inputs."""
    n = workers or min(os.cpu_count() or 1, 1 + total_bytes // _BYTES_PER_WORKER)
    return max(1, min(n, jobs))


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
                              error_id="convert.worker_died", hint="rerun with --resume")
        for suffix in sidecars:
            side = self.path / (name + suffix)
            if side.exists():
                os.replace(side, Path(dest) / side.name)
        os.replace(tmp, Path(dest) / tmp.name)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


# -- local: a process pool ------------------------------------------------------------------------
_progress_queue = None
_one_thread = False


def one_thread_per_job() -> None:
    """In a pool worker or a Ray task: the other cores run other jobs, so a job's kernels (and torch,
    where a job imports it) run on one thread; more would only contend. torch's small ops also only
    woke OpenMP threads that then spun."""
    global _one_thread
    _one_thread = True
    torch = sys.modules.get("torch")  # never imported for this: the CPU route does not need torch
    if torch is not None:
        torch.set_num_threads(1)


def job_threads() -> int:
    """Threads a job's kernels may use: 1 in a worker (one_thread_per_job), else the cores."""
    return 1 if _one_thread else (os.cpu_count() or 1)


def _init_worker(q) -> None:
    global _progress_queue
    _progress_queue = q
    one_thread_per_job()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and cleans up


def _call_with_queue(fn, args, reports_progress: bool):
    return fn(*args, callback=_progress_queue.put) if reports_progress else fn(*args)


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
                                                initargs=(self.queue,))

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
    --workers) caps the tasks submitted at once (default: as many as the cluster's resources allow)."""
    if spec.name == "local":
        return LocalExecutor(workers, bar)
    try:
        import ray  # noqa: F401
    except ImportError:
        raise UsageError("--executor ray needs Ray, which is not installed", error_id="usage.ray_missing",
                         hint="pip install 'dsv4-convert[ray]' (on every node of the cluster)") from None
    from dsv4_convert.ray_executor import RayExecutor
    return RayExecutor(spec.address, bar, max_in_flight=max_in_flight)


def pause_hook() -> None:
    """Test hook (DSV4_CONVERT_PAUSE_TASK=FILE): the first job to get here, cluster-wide, writes its pid
    to FILE and sleeps up to 60 s, so a test can SIGKILL that worker by pid mid-run."""
    path = os.environ.get(_PAUSE_ENV)
    if not path:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.1)
