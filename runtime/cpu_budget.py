"""The CPUs this process may use, and how a job's size shares them out: the one home of every worker and
thread count (the converter's and reverse's process pools, the repack's threads per job, numba's thread
pool, validate's torch threads).

The machine's CPU count is not the budget. A process pinned with taskset or a container's cpuset sees fewer
CPUs in its affinity mask; a cgroup quota (cgroup v2 `cpu.max` "200000 100000" = 2 CPUs' time, v1
`cpu.cfs_quota_us` / `cpu.cfs_period_us`) throttles it below that; and a small job gains nothing from many
processes or threads, each of which costs a start-up (docs/PERFORMANCE.md): a 2 MB conversion runs one
process on one thread. When a test suite runs twelve conversions side by side, each sized this way, their
threads add up to the CPUs they were given, not twelve times the machine.
"""

from __future__ import annotations

import math
import os
from contextlib import contextmanager
from pathlib import Path

__all__ = ["BYTES_PER_THREAD", "BYTES_PER_WORKER", "LIBRARY_THREAD_VARS", "auto_workers", "bound_library_threads",
           "cgroup_cpu_quota", "job_threads", "parse_cpu_max", "physical_cores", "torch_threads", "usable_cpus"]

# the thread pools of the libraries a command may import (torch's OpenMP pool, MKL, numba) size themselves
# from these, read once at their import; unset, each takes the machine's cores, not the budget (OpenBLAS:
# one thread, cli/main.py)
LIBRARY_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")

BYTES_PER_WORKER = 128 << 20  # below this much work per worker, another process is not worth starting
BYTES_PER_THREAD = 32 << 20  # below this much work per thread, another repack thread is not worth waking
_CGROUP = Path("/sys/fs/cgroup")


def parse_cpu_max(text: str) -> float | None:
    """cgroup v2 `cpu.max` ("QUOTA PERIOD", QUOTA "max" = no limit) -> CPUs' worth of time, or None."""
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        return _cpus(int(parts[0]), int(parts[1]))
    except ValueError:
        return None


def _cpus(quota: int, period: int) -> float | None:
    """A quota of `quota` microseconds per `period` in CPUs; None for no limit (v1 writes -1)."""
    return quota / period if quota > 0 and period > 0 else None


def cgroup_cpu_quota(root: Path = _CGROUP) -> float | None:
    """The CPU quota of this process's cgroup (v2, else v1), in CPUs; None where there is none or it is unreadable."""
    try:
        return parse_cpu_max((root / "cpu.max").read_text())
    except OSError:
        pass
    try:
        return _cpus(int((root / "cpu" / "cpu.cfs_quota_us").read_text()),
                     int((root / "cpu" / "cpu.cfs_period_us").read_text()))
    except (OSError, ValueError):
        return None


def _affinity() -> set[int] | None:
    try:
        return os.sched_getaffinity(0)
    except AttributeError:  # not Linux
        return None


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask), at most its cgroup quota rounded up."""
    cpus = _affinity()
    n = len(cpus) if cpus else (os.cpu_count() or 1)
    quota = cgroup_cpu_quota()
    return max(1, min(n, math.ceil(quota)) if quota else n)


def physical_cores() -> int:
    """The usable CPUs with a core's hyper-threads counted once (Linux's topology; each CPU where it is not
    readable): the conversion streams bytes through memory, and a core's second hardware thread adds
    contention, not speed."""
    cpus = _affinity()
    if cpus is None:
        return usable_cpus()
    cores = set()
    for cpu in cpus:
        try:
            cores.add(Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip())
        except OSError:
            cores.add(str(cpu))
    return max(1, min(len(cores), usable_cpus()))


def auto_workers(workers: int | None, total_bytes: int, jobs: int | None) -> int:
    """`workers` if given, else one per physical core, but no more than the jobs (None: not known yet), and in
    auto mode one process per BYTES_PER_WORKER of work at most."""
    n = workers or min(physical_cores(), 1 + total_bytes // BYTES_PER_WORKER)
    return max(1, n if jobs is None else min(n, jobs))


def job_threads(workers: int, job_bytes: int | None) -> int:
    """Threads one job's repack uses: 1 where the pool shares the cores out among several workers, else the
    usable CPUs, but one thread per BYTES_PER_THREAD of the job's work at most (None: not known, all of them)."""
    if workers > 1:
        return 1
    cap = usable_cpus()
    return cap if job_bytes is None else max(1, min(cap, 1 + job_bytes // BYTES_PER_THREAD))


def bound_library_threads() -> None:
    """At CLI start, before any of those libraries is imported: their pools get the usable CPUs, not every
    core of the machine (torch under `taskset -c 0` would otherwise start a thread per physical core). A value
    the user set wins."""
    n = str(usable_cpus())
    for var in LIBRARY_THREAD_VARS:
        os.environ.setdefault(var, n)


@contextmanager
def torch_threads(n: int):
    """torch's intra-op pool at `n` threads inside the block, as it was after. A command whose CPU work is many
    small ops (validate's per-block checks, the kernel pre-flight's decodes, a small synth) runs them on one
    thread: more only wake OpenMP threads that spin, and twelve such commands side by side on a 16-core box each
    took the machine's 16 (issue 36: a load of 350-400)."""
    import torch  # the commands that call this have imported it already

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
