"""Shared by the benchmarks: time a command plus `sync`, and sample the peak RSS of its process
tree (the sum over the command and its children) and of its largest single process."""

from __future__ import annotations

import os
import resource
import subprocess
import threading
import time
from dataclasses import dataclass


@dataclass
class Run:
    seconds: float
    tree_mib: float  # peak of the summed RSS of the process and its descendants
    largest_mib: float  # peak RSS of the largest single process of the tree
    started: float = 0.0  # time.perf_counter() when the command was started (after the first sync)
    cpu_seconds: float = 0.0  # user + sys of the command and its children (the final sync excluded)


def _tree_rss_kib(root_pid: int) -> tuple[int, int]:
    parents, rss = {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            parents[int(pid)] = int(fields["PPid"])
            rss[int(pid)] = int(fields.get("VmRSS", "0 kB").split()[0])
        except (OSError, KeyError, ValueError):
            continue
    total = largest = 0
    for pid, kib in rss.items():
        p = pid
        while p and p != root_pid:
            p = parents.get(p, 0)
        if p == root_pid:
            total += kib
            largest = max(largest, kib)
    return total, largest


def measured(cmd: list[str], *, env: dict | None = None) -> Run:
    """Run `cmd` then `sync` (after a `sync` first, so earlier writes are not charged to it)."""
    subprocess.run(["sync"], check=True)
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
    tree = largest = 0
    stop = threading.Event()

    def sample():
        nonlocal tree, largest
        while not stop.is_set():
            t, big = _tree_rss_kib(proc.pid)
            tree, largest = max(tree, t), max(largest, big)
            time.sleep(0.05)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    rc = proc.wait()
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    stop.set()
    t.join()
    subprocess.run(["sync"], check=True)
    if rc:
        raise SystemExit(f"{' '.join(cmd)} failed with exit code {rc}")
    cpu = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
    return Run(time.perf_counter() - start, tree / 1024, largest / 1024, start, cpu)


def timed(cmd: list[str], *, env: dict | None = None) -> tuple[float, float]:
    """(seconds, peak tree RSS in MiB) of `cmd` + `sync`."""
    r = measured(cmd, env=env)
    return r.seconds, r.tree_mib
