"""Shared by the benchmarks: time a command plus `sync`, its CPU seconds, and sample the memory of its
process tree every 20 ms: the peak of VmRSS and of RssAnon, summed over the command and its children
and of the largest single process.

Why both: VmRSS counts the pages of mapped files a process touched (RssFile: the page cache, which the
kernel can drop or write back at any time) and shared memory (RssShmem: a mapped file on tmpfs, e.g.
/dev/shm); RssAnon is the memory only the process holds, what an out-of-memory kill counts."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass

FIELDS = ("VmRSS", "RssAnon", "RssFile", "RssShmem")


@dataclass
class Run:
    seconds: float
    tree_mib: float  # peak of the summed VmRSS of the process and its descendants
    largest_mib: float  # peak VmRSS of the largest single process of the tree
    started: float = 0.0  # time.perf_counter() when the command was started (after the first sync)
    cpu_seconds: float = 0.0  # user + sys of the command and its children (the final sync excluded)
    anon_tree_mib: float = 0.0  # peak of the summed RssAnon
    anon_largest_mib: float = 0.0  # peak RssAnon of the largest single process
    file_largest_mib: float = 0.0  # peak RssFile + RssShmem of one process (mapped file pages)
    hwm_largest_mib: float = 0.0  # exact: the largest VmHWM of any one process of the tree (wait4's ru_maxrss)


def _status(pid: str) -> tuple[int, dict[str, int]] | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return int(fields["PPid"]), {k: int(fields.get(k, "0 kB").split()[0]) for k in FIELDS}
    except (OSError, KeyError, ValueError):
        return None


class TreeMemory:
    """Reads the memory of `root_pid` and its descendants, again and again. A process seen once outside
    the tree stays outside (no process moves into another's subtree, short of pid reuse), so each read
    opens the status files of new processes and of the tree's only: reading every process's status
    every 20 ms took a good part of a core on a busy 2-core machine, and the measured command paid for it."""

    def __init__(self, root_pid: int):
        self.root, self.outside, self.parents = root_pid, set(), {}

    def read(self) -> dict[str, dict[str, int]]:
        """{field: {pid: KiB}} for the root and its descendants."""
        mem = {}
        for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
            if pid in self.outside:
                continue
            got = _status(str(pid))
            if got is not None:
                self.parents[pid], mem[pid] = got
        out: dict[str, dict[str, int]] = {k: {} for k in FIELDS}
        for pid, fields in mem.items():
            p = pid
            while p and p != self.root and p not in self.outside:
                p = self.parents.get(p, 0)
            if p == self.root:
                for k in FIELDS:
                    out[k][pid] = fields[k]
            else:
                self.outside.add(pid)
        return out


def tree_memory(root_pid: int) -> dict[str, dict[str, int]]:
    """{field: {pid: KiB}} for `root_pid` and its descendants, read once."""
    return TreeMemory(root_pid).read()


def measured(cmd: list[str], *, env: dict | None = None, sync: bool = True) -> Run:
    """Run `cmd` then `sync` (after a `sync` first, so earlier writes are not charged to it)."""
    if sync:
        subprocess.run(["sync"], check=True)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
    peak = {"tree": 0, "largest": 0, "anon_tree": 0, "anon_largest": 0, "file_largest": 0}
    stop = threading.Event()

    tree = TreeMemory(proc.pid)

    def sample():
        while not stop.is_set():
            m = tree.read()
            files = [m["RssFile"][p] + m["RssShmem"][p] for p in m["RssFile"]]
            for key, values in (("tree", [sum(m["VmRSS"].values())]), ("largest", m["VmRSS"].values()),
                                ("anon_tree", [sum(m["RssAnon"].values())]), ("anon_largest", m["RssAnon"].values()),
                                ("file_largest", files)):
                peak[key] = max(peak[key], max(values, default=0))
            time.sleep(0.02)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    _, status, usage = os.wait4(proc.pid, 0)  # the command and every descendant it waited for
    rc = proc.returncode = os.waitstatus_to_exitcode(status)
    stop.set()
    t.join()
    if sync:
        subprocess.run(["sync"], check=True)
    if rc:
        raise SystemExit(f"{' '.join(cmd)} failed with exit code {rc}")
    mib = {k: v / 1024 for k, v in peak.items()}
    return Run(time.perf_counter() - start, mib["tree"], mib["largest"], start, usage.ru_utime + usage.ru_stime,
               mib["anon_tree"], mib["anon_largest"], mib["file_largest"], usage.ru_maxrss / 1024)


def timed(cmd: list[str], *, env: dict | None = None) -> tuple[float, float]:
    """(seconds, peak tree RSS in MiB) of `cmd` + `sync`."""
    r = measured(cmd, env=env)
    return r.seconds, r.tree_mib
