"""The shard writer's O_DIRECT path (runtime/direct_io.py) against its buffered path and against
independent references: safetensors' own `safe_open` reads every tensor back, and the returned hash
is xxhash's xxh3_128 of the file's bytes. Both paths must write the same bytes for files that end
on, just before and just after the bounce-buffer and block boundaries.

Substitutions, each real, none a mock of the writer:
- small bounce buffers (64 KiB, `direct_io.BUFFER_BYTES` set by monkeypatch) for the boundary cases,
  so "many buffers" stays a few MiB; two cases use the real 16 MiB buffers too.
- a full disk is a 1 MiB or 20 MiB tmpfs mounted in a user + mount namespace (`unshare`), so no root
  and no loop device are needed; the kernel here (>= 6.6) accepts O_DIRECT on tmpfs, so it is the
  direct path that meets ENOSPC. Skipped where user namespaces are not allowed.
- a filesystem without O_DIRECT is a ramfs in such a namespace (open with O_DIRECT: EINVAL).
- "file too large" is RLIMIT_FSIZE in a subprocess (SIGXFSZ ignored): EFBIG, as the fault tests use.
  A limit that is not a multiple of 4096 makes the kernel cut a direct write to an unaligned length,
  which it refuses with EINVAL: that is the real case of a direct write refused after the open."""

from __future__ import annotations

import errno
import faulthandler
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import xxhash
from safetensors import safe_open

from dsv4_convert.convert.safetensors_writer import ShardWriter, TensorSpec, header_bytes
from dsv4_convert.core.checkpoint.tensor_io import safetensors_dtype
from dsv4_convert.runtime import direct_io, settings
from tests.helpers.compare import assert_bytes_equal

SMALL = 64 << 10
REAL = direct_io.BUFFER_BYTES
BLOCK = direct_io.BLOCK


def _accepts_o_direct(d: Path) -> bool:
    try:
        fd = os.open(d / ".probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT)
    except OSError as e:
        if e.errno == errno.EINVAL:
            return False
        raise
    os.close(fd)
    os.unlink(d / ".probe")
    return True


def _sized(total: int) -> list[tuple[str, torch.Tensor]]:
    """One U8 tensor sized so that the whole file is exactly `total` bytes."""
    n = total
    for _ in range(5):
        n2 = total - len(header_bytes([TensorSpec("x", "U8", (n,))]))
        if n2 == n:
            break
        n = n2
    assert n >= 0 and len(header_bytes([TensorSpec("x", "U8", (n,))])) + n == total
    return [("x", torch.from_numpy(np.random.default_rng(total).integers(0, 256, n, dtype=np.uint8)))]


def _tiny() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    out = [(f"b{i}", torch.randint(0, 256, (i % 7 + 1,), generator=g, dtype=torch.uint8)) for i in range(300)]
    out.append(("scalar", torch.tensor(2.5, dtype=torch.float32)))  # 0-d
    out.append(("empty", torch.empty(0, 3, dtype=torch.bfloat16)))
    out.append(("i32", torch.randint(-9, 9, (5, 3), generator=g, dtype=torch.int32)))
    return out


CASES = {  # name -> (buffer size, tensors)
    "header_only": (SMALL, []),
    "one_buffer": (SMALL, _sized(SMALL)),
    "one_buffer_less_one": (SMALL, _sized(SMALL - 1)),
    "one_buffer_plus_one": (SMALL, _sized(SMALL + 1)),
    "one_block_past_all_buffers": (SMALL, _sized(direct_io.BUFFERS * SMALL + BLOCK)),
    "many_buffers": (SMALL, _sized(11 * SMALL + BLOCK - 1)),
    "tiny_tensors": (SMALL, _tiny()),
    "real_one_buffer_plus_one": (REAL, _sized(REAL + 1)),
    "real_many_buffers": (REAL, _sized((direct_io.BUFFERS + 1) * REAL + 12345)),
}


def _write(path: Path, tensors, *, chunks: int = 1) -> ShardWriter:
    """Write `tensors` in order, each fed in `chunks` uneven pieces; returns the closed writer."""
    w = ShardWriter(path, [TensorSpec(n, safetensors_dtype(t), tuple(t.shape)) for n, t in tensors],
                    {"format": "pt"} if tensors else None, fsync=False)
    for name, t in tensors:
        raw = t.contiguous().reshape(-1).view(torch.uint8).numpy()
        w.begin(name)
        for piece in np.array_split(raw, chunks):
            w.feed(piece)
    w.result = w.close()
    return w


@pytest.mark.parametrize("case", CASES)
def test_direct_and_buffered_write_the_same_bytes(case, tmp_path, monkeypatch):
    buf, tensors = CASES[case]
    monkeypatch.setattr(direct_io, "BUFFER_BYTES", buf)
    d = _write(tmp_path / "d.safetensors", tensors, chunks=3)
    monkeypatch.setenv(direct_io.DIRECT_IO_ENV, "0")
    monkeypatch.setattr(settings, "_current", None)  # parsed again at the next read (then restored)
    b = _write(tmp_path / "b.safetensors", tensors)
    raw = (tmp_path / "d.safetensors").read_bytes()
    assert raw == (tmp_path / "b.safetensors").read_bytes()
    digest = xxhash.xxh3_128(raw).hexdigest()
    assert d.result == b.result == (digest, len(raw))
    with safe_open(tmp_path / "d.safetensors", "pt") as f:
        assert list(f.keys()) == sorted(n for n, _ in tensors)
        for name, t in tensors:
            assert_bytes_equal(f.get_tensor(name), t, name)
    assert not b.direct_io, f"{direct_io.DIRECT_IO_ENV}=0 forces the page cache"
    if not _accepts_o_direct(tmp_path):
        pytest.skip(f"{tmp_path} refuses O_DIRECT (e.g. tmpfs before Linux 6.6): only the fallback ran")
    assert d.direct_io, "the filesystem accepts O_DIRECT: the writer must have used it"


def test_random_feed_sizes_across_buffer_boundaries(tmp_path, monkeypatch):
    monkeypatch.setattr(direct_io, "BUFFER_BYTES", SMALL)
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, 9 * SMALL + 333, dtype=np.uint8)
    w = ShardWriter(tmp_path / "s", [TensorSpec("x", "U8", (data.size,))], fsync=True)
    w.begin("x")
    at = 0
    while at < data.size:  # pieces of 1 byte to 2.5 buffers
        k = int(min(data.size - at, rng.choice([1, 7, BLOCK - 1, BLOCK, SMALL, SMALL + 1, 5 * SMALL // 2])))
        w.feed(data[at:at + k])
        at += k
    digest, size = w.close()
    raw = (tmp_path / "s").read_bytes()
    assert (digest, size) == (xxhash.xxh3_128(raw).hexdigest(), len(raw))
    assert raw[-data.size:] == data.tobytes()


def test_no_thread_or_fd_outlives_close_or_abort(tmp_path):
    fds = len(os.listdir("/proc/self/fd"))
    before = threading.active_count()
    faulthandler.dump_traceback_later(60, exit=True)  # a hang fails the run instead of stalling it
    try:
        data = np.zeros(REAL, dtype=np.uint8)
        w = ShardWriter(tmp_path / "a", [TensorSpec("x", "U8", (20 * REAL,))], fsync=False)
        w.begin("x")
        for _ in range(2 * direct_io.BUFFERS):  # every buffer in flight or queued
            w.feed(data)
        assert threading.active_count() == before + int(w.direct_io)
        w.abort()
        w.abort()  # twice is harmless
        assert threading.active_count() == before and len(os.listdir("/proc/self/fd")) == fds
        w = ShardWriter(tmp_path / "c", [TensorSpec("x", "U8", (3,))], fsync=True)
        w.write("x", b"abc")
        w.close()
        assert threading.active_count() == before and len(os.listdir("/proc/self/fd")) == fds
    finally:
        faulthandler.cancel_dump_traceback_later()


# -- real errors, in a subprocess ---------------------------------------------------------------
# When direct write k (k <= 2 below) fails, the caller can have filled up to BUFFERS more before it
# waits for a buffer and sees the error: shards of BUFFERS + 4 buffers make "raised in a feed" certain.
BIG = (direct_io.BUFFERS + 4) * REAL
_CHILD = r"""
import json, os, resource, shutil, signal, sys, threading
cfg = json.loads(sys.argv[1])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
if cfg.get("fsize"):
    resource.setrlimit(resource.RLIMIT_FSIZE, (cfg["fsize"], cfg["fsize"]))
from dsv4_convert.convert.safetensors_writer import ShardWriter, TensorSpec
n, chunk = cfg["nbytes"], 1 << 20
before = threading.active_count()
w = ShardWriter(cfg["path"], [TensorSpec("x", "U8", (n,))], fsync=True)
where, err, at = None, None, 0
try:
    w.begin("x")
    piece = memoryview(bytes(range(256)) * (chunk // 256))
    while at < n:
        w.feed(piece[:min(chunk, n - at)])
        at += chunk
    where = "close"
    digest, size = w.close()
    where = None
    if cfg.get("copy_to"):
        shutil.copyfile(cfg["path"], cfg["copy_to"])
except OSError as e:
    where, err = where or "feed", e.errno
finally:
    w.abort()
print(json.dumps({"errno": err, "where": where, "direct": w.direct_io, "fed": at,
                  "threads_left": threading.active_count() - before}))
"""


def _child(cfg: dict, mount: str | None = None) -> dict:
    """Run _CHILD; with `mount` ("tmpfs:size=1m" or "ramfs"), in a user + mount namespace where that
    filesystem is mounted on cfg["mnt"]."""
    cmd = [sys.executable, "-c", _CHILD, json.dumps(cfg)]
    if mount:
        fs, _, opts = mount.partition(":")
        mnt = shlex.join(["mount", "-t", fs, *(["-o", opts] if opts else []), "none", cfg["mnt"]])
        cmd = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", mnt + ' && exec "$0" "$@"', *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def namespace_mounts(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "--user", "--map-root-user", "--mount", "mount", "-t", "tmpfs", "none", str(mnt)],
            capture_output=True).returncode:
        pytest.skip("no user + mount namespaces here (unshare refused): no unprivileged small filesystem")
    return mnt


@pytest.mark.parametrize("direct", ["1", "0"])
@pytest.mark.parametrize(("size", "nbytes", "where"), [("1m", BIG, "feed"), ("20m", BIG, "feed"),
                                                       ("1m", 2 << 20, "close")])
def test_disk_full_is_enospc_in_the_caller(namespace_mounts, monkeypatch, direct, size, nbytes, where):
    monkeypatch.setenv(direct_io.DIRECT_IO_ENV, direct)
    out = _child({"path": str(namespace_mounts / "s"), "mnt": str(namespace_mounts), "nbytes": nbytes},
                 mount=f"tmpfs:size={size}")
    assert out["errno"] == errno.ENOSPC, out
    assert out["threads_left"] == 0, "abort() ended the writer thread"
    if direct == "1":
        assert out["where"] == where and out["direct"], out  # tmpfs takes O_DIRECT on this kernel
    else:
        assert out["where"] == "feed" and not out["direct"], out  # buffered: the write itself fails


def test_a_filesystem_without_o_direct_gets_the_buffered_path(namespace_mounts, tmp_path, monkeypatch):
    out = _child({"path": str(namespace_mounts / "s"), "mnt": str(namespace_mounts), "nbytes": 3 * REAL + 5,
                  "copy_to": str(tmp_path / "copy")}, mount="ramfs")
    assert out == {"errno": None, "where": None, "direct": False, "fed": out["fed"], "threads_left": 0}
    _child({"path": str(tmp_path / "ref"), "nbytes": 3 * REAL + 5})
    assert (tmp_path / "copy").read_bytes() == (tmp_path / "ref").read_bytes()


@pytest.mark.parametrize(("fsize", "env", "direct_after"), [
    (3 << 20, "1", True),  # aligned limit: a short direct write, then EFBIG
    ((3 << 20) + 100, "1", False),  # unaligned: the first direct write is refused (EINVAL), buffered from there
    (2 * REAL + 100, "1", False),  # the same after two direct writes went through
    ((3 << 20) + 100, "0", False),  # the buffered path
])
def test_file_too_large_is_efbig_in_the_caller(tmp_path, monkeypatch, fsize, env, direct_after):
    if not _accepts_o_direct(tmp_path):
        pytest.skip(f"{tmp_path} refuses O_DIRECT: the buffered path's EFBIG is covered by the fault tests")
    monkeypatch.setenv(direct_io.DIRECT_IO_ENV, env)
    out = _child({"path": str(tmp_path / "s"), "nbytes": BIG, "fsize": fsize})
    assert out["errno"] == errno.EFBIG and out["where"] == "feed" and out["threads_left"] == 0, out
    assert out["direct"] is direct_after, out
    assert (tmp_path / "s").stat().st_size == fsize, "every byte up to the limit was written"
