"""The automatic worker and thread counts (runtime/cpu_budget.py): one worker per physical core, a
core's hyper-threads counted once, no more than one per 128 MiB of work and no more than the jobs; an
explicit --workers always wins; the cores are the ones this process is given (affinity, cgroup quota), and a
job's threads follow its size. The core count is checked against lscpu's own topology (an independent
reading of the same machine); the cgroup files of the quota test are made up (a real quota needs root)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from dsv4_convert.runtime.cpu_budget import (
    BYTES_PER_THREAD,
    LIBRARY_THREAD_VARS,
    cgroup_cpu_quota,
    job_threads,
    parse_cpu_max,
    torch_threads,
    usable_cpus,
)
from dsv4_convert.runtime.executors import auto_workers, physical_cores
from tests.helpers.cli import CLI, run_cli

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


# ------------------------------------------------------------------ the CPUs given, not the machine's
def test_a_cgroup_quota_is_read_from_cpu_max_or_cfs_files(tmp_path):
    """Made-up cgroup files (v2 cpu.max; v1 cpu.cfs_quota_us / cpu.cfs_period_us): the quota in CPUs."""
    assert parse_cpu_max("200000 100000\n") == 2.0 and parse_cpu_max("150000 100000") == 1.5
    assert parse_cpu_max("max 100000") is None and parse_cpu_max("junk") is None and parse_cpu_max("0 100000") is None
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("50000 100000\n")
    assert cgroup_cpu_quota(v2) == 0.5
    v1 = tmp_path / "v1" / "cpu"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("300000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_quota(tmp_path / "v1") == 3.0
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")  # v1's "no limit"
    assert cgroup_cpu_quota(tmp_path / "v1") is None and cgroup_cpu_quota(tmp_path / "none") is None


def test_a_small_job_runs_one_thread_and_a_big_one_the_cpus_given():
    cpus = usable_cpus()
    assert job_threads(1, 2 * MIB) == 1 and job_threads(4, 10**13) == 1  # pool workers share the cores out
    assert job_threads(1, 10**13) == cpus and job_threads(1, None) == cpus
    assert job_threads(1, 3 * BYTES_PER_THREAD) == min(cpus, 4)


def test_small_ops_commands_run_torch_on_one_thread_and_give_its_pool_back():
    """validate's checks, the kernel pre-flight and a small synth run torch on one thread (torch_threads, also as
    the kernel runner's decorator); the pool the process had comes back after, also when the block raises."""
    import torch

    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before

    @torch_threads(1)
    def fails():
        assert torch.get_num_threads() == 1
        raise KeyError("x")

    for _ in range(2):  # the decorator enters afresh on each call
        with pytest.raises(KeyError):
            fails()
        assert torch.get_num_threads() == before


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset")
def test_under_taskset_the_tool_sizes_itself_for_one_cpu(tmp_path):
    """The real CLI pinned to CPU 0: its budget is 1 CPU whatever the machine has, and a 2 MB conversion
    reports one worker on one thread in --json (a size rule: the same without taskset)."""
    probe = ("from dsv4_convert.runtime.cpu_budget import *; "
             "print(usable_cpus(), physical_cores(), job_threads(1, None), auto_workers(None, 10**13, None))")
    pinned = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", probe], capture_output=True, text=True,
                            check=True).stdout.split()
    assert pinned == ["1", "1", "1", "1"]
    env = {k: v for k, v in os.environ.items() if k not in LIBRARY_THREAD_VARS}
    doctor = subprocess.run(["taskset", "-c", "0", *CLI, "doctor", "--json"], capture_output=True, text=True, env=env)
    assert json.loads(doctor.stdout)["torch"]["threads"] == 1  # torch's pool: the one CPU given
    run_cli("synth", tmp_path / "src", "-q")
    for prefix in (["taskset", "-c", "0"], []):
        proc = subprocess.run([*prefix, *CLI, "nvfp4-to-marlin", str(tmp_path / "src"), str(tmp_path / "out"),
                               "--json", "-q", "--force"], capture_output=True, text=True, check=True)
        data = json.loads(proc.stdout)
        assert (data["workers"], data["threads"]) == (1, 1), data
