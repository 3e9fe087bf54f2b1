"""Shared by the benchmarks: time a command plus `sync`, and sample the peak RSS of its process tree."""

from __future__ import annotations

import os
import subprocess
import threading
import time


def _tree_rss_kib(root_pid: int) -> int:
    parents, rss = {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            parents[int(pid)] = int(fields["PPid"])
            rss[int(pid)] = int(fields.get("VmRSS", "0 kB").split()[0])
        except (OSError, KeyError, ValueError):
            continue
    total = 0
    for pid, kib in rss.items():
        p = pid
        while p and p != root_pid:
            p = parents.get(p, 0)
        if p == root_pid:
            total += kib
    return total


def timed(cmd: list[str], *, env: dict | None = None) -> tuple[float, float]:
    """Run `cmd` then `sync`; returns (seconds, peak RSS of the whole process tree in MiB)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
    peak = 0
    stop = threading.Event()

    def sample():
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, _tree_rss_kib(proc.pid))
            time.sleep(0.05)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    rc = proc.wait()
    stop.set()
    t.join()
    subprocess.run(["sync"], check=True)
    if rc:
        raise SystemExit(f"{' '.join(cmd)} failed with exit code {rc}")
    return time.perf_counter() - start, peak / 1024
