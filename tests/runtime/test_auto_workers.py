"""The automatic worker count (runtime/executors.py auto_workers): one worker per physical core, a
core's hyper-threads counted once, no more than one per 128 MiB of work and no more than the jobs; an
explicit --workers always wins. The core count is checked against lscpu's own topology (an
independent reading of the same machine); no substitutions."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from dsv4_convert.runtime.executors import auto_workers, physical_cores

MIB = 1 << 20


def test_physical_cores_agree_with_lscpu():
    if shutil.which("lscpu") is None or os.sched_getaffinity(0) != set(range(os.cpu_count() or 1)):
        pytest.skip("needs lscpu and the whole machine in this process's affinity")
    rows = [line.split(",") for line in subprocess.run(["lscpu", "-p=CORE,SOCKET,ONLINE"], capture_output=True,
                                                        text=True, check=True).stdout.splitlines()
            if not line.startswith("#")]
    assert physical_cores() == len({(core, socket) for core, socket, online in rows if online in ("Y", "")})


def test_auto_is_one_worker_per_core_capped_by_the_work_and_the_jobs():
    cores = physical_cores()
    assert auto_workers(None, 2 * MIB, None) == 1  # a small input: one process, no fork
    assert auto_workers(None, 10**13, None) == cores
    assert auto_workers(None, 3 * 128 * MIB, None) == min(cores, 4)
    assert auto_workers(None, 10**13, 2) == min(cores, 2)
    assert auto_workers(7, 2 * MIB, None) == 7 and auto_workers(7, 10**13, 3) == 3  # --workers wins, jobs cap
