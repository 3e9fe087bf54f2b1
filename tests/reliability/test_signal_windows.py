"""Issue 28, "a flaky test": the SIGINT case of test_clear_errors.py left an `out.partial` under load.
Cause, a real race in the clean-up: a signal handler runs between any two bytecodes, so a Ctrl-C that
landed after `os.mkdir` returned but before OutputTree.open recorded that it made the directory left a
directory nobody owned (discard() then removed nothing). The test waits for `out.partial` to appear
and signals at once, which is exactly that window. Fixed by claiming (mkdir + lock) and publishing
(rename + bookkeeping) with the signals deferred to the end of the block.

These tests put the signal in those two windows exactly, in this process (no CLI: the windows are a
few bytecodes wide, and a subprocess cannot be signalled that precisely).

Substitutions: `os.mkdir` / `os.rename` are wrapped to send this process SIGINT right after the real
call returns, standing in for a Ctrl-C that arrives at that moment; the handler is Python's own
SIGINT handler (KeyboardInterrupt), as in the CLI."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from dsv4_convert.runtime.output import OutputTree


@pytest.fixture(autouse=True)
def _sigint_raises():
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def _signal_after(monkeypatch, name: str, when):
    real = getattr(os, name)

    def wrapped(*args, **kwargs):
        result = real(*args, **kwargs)
        if when(*args):
            os.kill(os.getpid(), signal.SIGINT)  # handled at the next bytecode: inside the caller's window
        return result
    monkeypatch.setattr(os, name, wrapped)


def test_ctrl_c_right_after_the_staging_mkdir_leaves_nothing(tmp_path, monkeypatch):
    staging = OutputTree(tmp_path / "out")
    _signal_after(monkeypatch, "mkdir", lambda path, *a: Path(path) == staging.path)
    with pytest.raises(KeyboardInterrupt):
        staging.open("fingerprint")
    assert not staging.path.exists(), "the directory this run made was removed"
    assert os.listdir(tmp_path) == []


def test_ctrl_c_right_after_the_publishing_rename_is_known_as_published(tmp_path, monkeypatch):
    staging = OutputTree(tmp_path / "out")
    staging.open("fingerprint")
    (staging.path / "a.safetensors").write_bytes(b"x")
    staging.write_manifest({"producer": {"name": "dsv4-convert"}})
    _signal_after(monkeypatch, "rename", lambda a, b, *rest: Path(b) == staging.out)
    with pytest.raises(KeyboardInterrupt):
        staging.publish()
    assert staging.published and staging.out.is_dir() and not staging.path.exists()
    staging.discard()  # what the converter's clean-up then calls: the published output stays
    assert (staging.out / "a.safetensors").read_bytes() == b"x"
