"""Issue 37 item 1: a process forked while a run holds the staging locks (a pool worker) does not keep
them. A flock belongs to the open file description, so a child's copy of the descriptor would hold the
lock after the run itself is gone; runtime/output/claim.py closes the copies in every forked child.

Substitution: the run's death is its descriptors closed without unlocking (what the kernel does for
a SIGKILLed process), in this process; the worker is a real os.fork() child that waits on a pipe."""

from __future__ import annotations

import os

import pytest

from dsv4_convert.core.errors import OutputError
from dsv4_convert.runtime.output import OutputTree


def test_a_forked_child_does_not_hold_the_runs_locks(tmp_path):
    first = OutputTree(tmp_path / "out")
    first.open("fingerprint")
    read, write = os.pipe()
    ready_r, ready_w = os.pipe()
    child = os.fork()
    if child == 0:  # the worker: says it runs (the fork's hooks are done), then waits for the test
        try:
            os.close(write)
            os.write(ready_w, b"1")
            os.read(read, 1)
        finally:
            os._exit(0)
    os.close(read)
    os.close(ready_w)
    try:
        assert os.read(ready_r, 1) == b"1"
        locks = first._locks
        for fd in (locks.lock_fd, locks.dir_fd):  # the run dies: its descriptors close, nothing unlocks
            os.close(fd)
        locks.lock_fd = locks.dir_fd = None
        second = OutputTree(tmp_path / "out", resume=True)
        try:
            second.open("fingerprint")  # output.locked while the child held a copy
        except OutputError as e:
            pytest.fail(f"the forked child kept the lock: {e.error_id}")
        second.discard(keep_verified=True)
    finally:
        os.close(write)
        os.close(ready_r)
        os.waitpid(child, 0)
