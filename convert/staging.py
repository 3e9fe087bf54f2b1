"""Atomic output: everything is built in `<out>.partial/`, shard by shard, each shard recorded with
its sha256; everything is fsync'd and the directory renamed to `<out>` only when complete. A lock in the
staging directory keeps two runs apart; `--resume` keeps shards whose recorded hash still verifies."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path

from dsv4_convert.core.errors import OutputError
from dsv4_convert.digest import file_digest

__all__ = ["Staging", "MANIFEST", "PROGRESS"]

PROGRESS = "dsv4-convert.progress.json"  # staging only: fingerprint + finished shards
MANIFEST = "dsv4-convert.manifest.json"  # published: written last, lists every shard with its hash
_LOCK = "dsv4-convert.lock"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Staging:
    def __init__(self, out: Path, *, force: bool = False, resume: bool = False, fence=None):
        self.out = Path(out).absolute()
        self.fence = fence  # called with the lock held, before adopting: stops an older run's surviving workers
        self.path = self.out.with_name(self.out.name + ".partial")
        self.force, self.resume = force, resume
        self._lock_fd: int | None = None
        self.done: dict[str, dict] = {}

    # -- lifecycle -------------------------------------------------------------------------------
    def open(self, fingerprint: str) -> dict[str, dict]:
        """Create or take over the staging directory; returns the shards that are already finished."""
        if self.out.exists() and not self.force:
            raise OutputError(f"output {self.out} already exists", error_id="output.exists",
                              hint="choose another OUT, or pass --force to replace it (only after a complete run)")
        try:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            existed = self.path.exists()
            self.path.mkdir(exist_ok=True)
            self._take_lock()
        except OSError as e:
            raise OutputError(f"cannot create {self.path}: {e.strerror}", error_id="output.not_writable",
                              hint="choose a writable OUT location (its parent must be a directory you can write)") from e
        if existed:
            self._adopt(fingerprint)
        write_json_atomic(self.path / PROGRESS, {"fingerprint": fingerprint, "shards": self.done})
        self.fingerprint = fingerprint
        return dict(self.done)

    def _take_lock(self) -> None:
        fd = os.open(self.path / _LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise OutputError(f"another dsv4-convert run is writing {self.out} (lock held on {self.path / _LOCK})",
                              error_id="output.locked",
                              hint="wait for it to finish, or stop it; two runs never share one output") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd

    def _adopt(self, fingerprint: str) -> None:
        if not (self.resume or self.force):
            self._release()
            raise OutputError(f"an interrupted run left {self.path}", error_id="output.interrupted_run",
                              hint="pass --resume to continue it, or --force to start over")
        progress = self.path / PROGRESS
        state = json.loads(progress.read_text()) if progress.exists() else {}
        same = state.get("fingerprint") == fingerprint
        if self.resume and not self.force and state and not same:
            self._release()
            raise OutputError(f"{self.path} was staged from a different input or different options",
                              error_id="output.resume_mismatch",
                              hint="rerun with the same input and options, or --force to start over")
        keep = state.get("shards", {}) if (self.resume and same) else {}
        if self.fence is not None:
            self.fence(self.path)
        for entry in self.path.iterdir():
            shard = entry.name.removesuffix(".lost.safetensors")  # a kept shard keeps its lost-scale record
            if entry.name not in (_LOCK, PROGRESS) and entry.name not in keep and shard not in keep:
                _remove(entry)
        for name, rec in keep.items():
            f = self.path / name
            if f.exists() and f.stat().st_size == rec["size"] and file_digest(f) == rec["sha256"]:
                self.done[name] = rec
            elif f.exists():
                f.unlink()

    def shard_tmp(self, name: str) -> Path:
        return self.path / (name + ".tmp")

    def finish_shard(self, name: str, sha256: str, size: int) -> None:
        os.replace(self.shard_tmp(name), self.path / name)
        self.done[name] = {"sha256": sha256, "size": size}
        write_json_atomic(self.path / PROGRESS, {"fingerprint": self.fingerprint, "shards": self.done})

    def publish(self) -> None:
        """fsync everything, then rename `<out>.partial` to `<out>` (replacing `<out>` under --force)."""
        for f in self.path.rglob("*"):
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        (self.path / PROGRESS).unlink()
        _fsync_dir(self.path)
        self._release(remove_lock_file=True)
        old = None
        if self.out.exists():
            old = self.out.with_name(f"{self.out.name}.replaced-{os.getpid()}")
            os.rename(self.out, old)
        os.rename(self.path, self.out)
        _fsync_dir(self.out.parent)
        if old is not None:
            shutil.rmtree(old)

    def discard(self) -> None:
        """Remove the staging directory (after an error or Ctrl-C): nothing that looks complete remains."""
        self._release()
        if self.path.exists():
            shutil.rmtree(self.path, ignore_errors=True)

    def _release(self, remove_lock_file: bool = False) -> None:
        if self._lock_fd is not None:
            if remove_lock_file:
                os.unlink(self.path / _LOCK)
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None


def _remove(p: Path) -> None:
    if p.is_dir():
        shutil.rmtree(p)
    else:
        p.unlink()
