"""Issue 10, "clear errors instead of tracebacks" and "machine-readable on every path": each case
exits with its class's code, names its error id, prints no traceback, and with --json prints one
JSON object on stdout. Real CLI runs in subprocesses.

Substitutions: a full disk is a 1 MiB (or full) tmpfs where mount(8) works (CI runs as root); else
RLIMIT_FSIZE with SIGXFSZ ignored (writes fail with EFBIG, which the tool treats as a full disk).
A read-only filesystem is a tmpfs mounted `ro` where mount works; else `chmod a-w` (which root
ignores, so that case is skipped for root without mount). A report file on a full disk is /dev/full."""

from __future__ import annotations

import json
import resource
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from dsv4_convert.synth import write_synthetic_checkpoint
from tests.helpers.cli import CLI, run_cli, tree_hashes


def _mount(path: Path, opts: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True).returncode == 0


@pytest.fixture
def mounts():
    made = []

    def mount(path: Path, opts: str) -> bool:
        ok = _mount(path, opts)
        if ok:
            made.append(path)
        return ok
    yield mount
    for p in reversed(made):
        subprocess.run(["umount", str(p)], check=True)


def _limit():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))


def _clean(proc, code: int, error_id: str):
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert f"error[{error_id}]" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_synth_onto_a_full_disk(tmp_path, mounts):
    disk = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    limit = None if mounts(disk, "size=256k") else _limit
    disk.mkdir(exist_ok=True)
    proc = subprocess.run([*CLI, "synth", str(disk / "s"), "--json"], capture_output=True, text=True,
                          preexec_fn=limit)
    _clean(proc, 5, "output.disk_full")
    doc = json.loads(proc.stdout)
    assert doc["exit_code"] == 5 and doc["error"]["id"] == "output.disk_full" and doc["error"]["fix"]
    assert list(disk.iterdir()) == [], "nothing left behind"


def test_synth_onto_a_read_only_filesystem(tmp_path, mounts):
    ro = tmp_path / "ro"
    if not mounts(ro, "ro,size=1m"):
        import os
        if os.geteuid() == 0:
            pytest.skip("root without mount: permission bits do not stop root")
        ro.mkdir(exist_ok=True)
        ro.chmod(0o555)
    _clean(run_cli("synth", ro / "s", check=False), 5, "output.not_writable")


def test_converter_onto_a_disk_full_at_start_leaves_no_lock(tmp_path, mounts):
    src = tmp_path / "src"
    write_synthetic_checkpoint(src, format="nvfp4-modelopt-dsv4", layers=1, experts=4)
    disk = tmp_path / "full"
    if not mounts(disk, "size=64k"):
        pytest.skip("needs a tmpfs (mount) to be full before the run starts")
    import os
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    before = sorted(p.name for p in disk.iterdir())
    for _ in range(2):  # the second run must not claim an interrupted run
        proc = run_cli("nvfp4-to-marlin", src, disk / "out", "-q", "--workers", "1", check=False)
        _clean(proc, 5, "output.disk_full")
        assert sorted(p.name for p in disk.iterdir()) == before


def test_validate_report_onto_a_full_disk_is_exit_2_not_a_traceback(tmp_path):
    src = tmp_path / "src"
    write_synthetic_checkpoint(src, format="nvfp4-modelopt-dsv4", layers=1, experts=4)
    proc = run_cli("validate", src, "--quiet", "--report", "/dev/full", check=False)
    _clean(proc, 2, "report.not_writable")


def test_json_on_failure_is_one_object_on_stdout(tmp_path):
    proc = run_cli("nvfp4-to-marlin", tmp_path / "absent", tmp_path / "out", "--json", check=False)
    doc = json.loads(proc.stdout)
    assert doc["exit_code"] == proc.returncode == 3 and set(doc["error"]) == {"id", "message", "file", "tensor", "fix"}


def _caught(pid: int) -> int:
    """The signals process `pid` has handlers for (the kernel's SigCgt mask), 0 once it has exited."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return int(line.split()[1], 16)
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def _wait_for(ready, proc: subprocess.Popen, what: str, limit: float = 120.0) -> bool:
    """Poll until ready() or the process exits (False). No sleep stands in for readiness: the wait
    ends on an event the test can observe, however busy the machine is."""
    deadline = time.monotonic() + limit
    while proc.poll() is None:
        if ready():
            return True
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.005)
    return False


def _handlers_installed(proc: subprocess.Popen) -> bool:
    """The CLI installs its SIGTERM handler (with SIGINT's and SIGHUP's) as the first thing it does;
    Python itself never catches SIGTERM, so this bit is the CLI's readiness signal."""
    return bool(_caught(proc.pid) & (1 << (signal.SIGTERM - 1)))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_in_the_first_second_is_exit_130_without_a_traceback(tmp_path, sig):
    """Two moments, each waited for by observing it: the handlers are installed (the imports still
    run), and the conversion has begun (its staging directory exists)."""
    src = tmp_path / "src"
    write_synthetic_checkpoint(src, format="nvfp4-modelopt-dsv4", layers=1, experts=4)
    before = tree_hashes(src)
    for phase in ("imports", "conversion"):
        out = tmp_path / phase / "out"
        out.parent.mkdir()
        p = subprocess.Popen([*CLI, "nvfp4-to-marlin", str(src), str(out), "-q"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        partial = out.with_name("out.partial")
        ready = (lambda: _handlers_installed(p)) if phase == "imports" else partial.exists
        if not _wait_for(ready, p, phase):  # finished first: nothing to interrupt
            assert p.wait() == 0, p.communicate()[1]
            continue
        p.send_signal(sig)
        _, err = p.communicate(timeout=120)
        if p.returncode == 0:  # finished between the observation and the signal
            continue
        assert p.returncode == 130 and "Traceback" not in err, (phase, err)
        assert not partial.exists(), (phase, err)  # test_signal_windows.py: the race this once lost
        assert not out.exists() or "was published; that output is complete" in err, (phase, err)
    assert tree_hashes(src) == before


def test_a_signal_during_the_imports_still_answers_json(tmp_path):
    """Interrupted while torch / numba are still being imported: one JSON error object, exit 130.
    The run has a real source, so a signal that lands after the imports is still answered (as
    convert.interrupted): the test never depends on how fast the imports are."""
    src = tmp_path / "src"
    write_synthetic_checkpoint(src, format="nvfp4-modelopt-dsv4", layers=1, experts=4)
    p = subprocess.Popen([*CLI, "nvfp4-to-marlin", str(src), str(tmp_path / "out"), "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert _wait_for(lambda: _handlers_installed(p), p, "the handlers"), p.communicate()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    if p.returncode == 0:  # the whole conversion beat the signal: nothing was interrupted
        return
    assert p.returncode == 130 and "Traceback" not in err, err
    doc = json.loads(out)
    assert doc["exit_code"] == 130 and doc["error"]["id"] in ("cli.interrupted", "convert.interrupted")
    assert set(doc["error"]) == {"id", "message", "file", "tensor", "fix"}
