"""Atomic output: everything is built in `<out>.partial/`, shard by shard, each shard recorded with
its hash; everything is fsync'd and the directory renamed to `<out>` only when complete. A lock in the
staging directory keeps two runs apart; `--resume` keeps shards whose recorded hash still verifies,
and only when no source file changed (size and mtime_ns of every file, as make and rsync compare).
The published manifest names its hash algorithm and lists every file written (runtime/manifest.py
verifies it)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path

from dsv4_convert.core.errors import InputError, OutputError
from dsv4_convert.core.files import LOCK, LOST_SUFFIX, MANIFEST, PROGRESS
from dsv4_convert.runtime.digest import HASH_ALGORITHM, file_digest
from dsv4_convert.runtime.paths import check_aliasing, check_replaceable, is_disk_full, out_path, staging_path

__all__ = ["Staging", "source_stamp", "write_json_atomic"]

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


def source_stamp(root: Path) -> dict[str, list[int]]:
    """{relative path: [size, mtime_ns]} of every file of the input: any edit since changes it."""
    root = Path(root)
    stamp = {}
    for p in sorted(root.rglob("*")):
        try:
            st = p.stat()
        except OSError:
            continue
        if not p.is_dir():
            stamp[p.relative_to(root).as_posix()] = [st.st_size, st.st_mtime_ns]
    return stamp


def _first_change(old: dict, new: dict) -> str | None:
    return next((k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)), None)


class Staging:
    def __init__(self, out: Path, *, force: bool = False, resume: bool = False, source: Path | None = None,
                 fence=None):
        self.out = out_path(out)
        self.path = staging_path(self.out)
        self.fence = fence  # called with the lock held, before adopting: stops an older run's surviving workers
        self.force, self.resume = force, resume
        self.source = Path(source).resolve() if source is not None else None
        self.stamp: dict = {}
        self._lock_fd: int | None = None
        self._owned = False  # from taking the lock in open() until the publishing rename: discard() may clean up
        self.done: dict[str, dict] = {}

    # -- lifecycle -------------------------------------------------------------------------------
    def check(self) -> None:
        """Every refusal that needs no writing: aliasing with IN, what OUT and OUT.partial are."""
        if self.source is not None:
            check_aliasing(self.source, self.out, staging=self.path)
        check_replaceable(self.out, force=self.force)
        if self.path.is_symlink() or (os.path.lexists(self.path) and not self.path.is_dir()):
            raise OutputError(f"{self.path} exists and is not a directory this tool made (a file or a symlink)",
                              error_id="paths.partial_not_ours", file=str(self.path),
                              hint="remove it yourself, or choose another OUT; it is never deleted for you")

    def open(self, fingerprint: str) -> dict[str, dict]:
        """Create or take over the staging directory; returns the shards that are already finished."""
        self.check()
        if self.source is not None:
            self.stamp = source_stamp(self.source)
            fingerprint = hashlib.sha256((fingerprint + json.dumps(self.stamp, sort_keys=True)).encode()).hexdigest()
        existed = self.path.exists()
        if existed:
            self._refuse_foreign()
        made = False
        try:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            self.path.mkdir(exist_ok=existed)  # not existed: a directory that appears meanwhile is not ours
            made = not existed
            self._take_lock()
            self._owned = True
            if existed:
                self._adopt(fingerprint)
            self.fingerprint = fingerprint
            self._save_progress()
        except BaseException as e:  # a signal too: it can land between the mkdir and the first record
            self._release()
            if made:  # leave nothing behind that a later run would take for an interrupted one
                shutil.rmtree(self.path, ignore_errors=True)
            self._owned = False
            if not isinstance(e, OSError):
                raise
            if is_disk_full(e):
                raise OutputError(f"no space left to start writing {self.path} ({e.strerror})",
                                  error_id="output.disk_full", file=str(self.path),
                                  hint="free some space on that filesystem, or choose another OUT") from None
            raise OutputError(f"cannot create {self.path}: {e.strerror}", error_id="output.not_writable",
                              file=str(self.path),
                              hint="choose a writable OUT location (its parent must be a directory you can write)") from None
        return dict(self.done)

    def _save_progress(self) -> None:
        write_json_atomic(self.path / PROGRESS, {"fingerprint": self.fingerprint, "sources": self.stamp,
                                                  "hash_algorithm": HASH_ALGORITHM, "shards": self.done})

    def _refuse_foreign(self) -> None:
        """OUT.partial is adopted only when it carries this tool's lock and progress record."""
        names = {e.name for e in self.path.iterdir()}
        ours = LOCK in names and (names <= {LOCK} or _read_json(self.path / PROGRESS).get("fingerprint"))
        if not ours:
            raise OutputError(f"{self.path} exists but holds no dsv4-convert lock and progress record; it is not "
                              "an interrupted run of this tool", error_id="paths.partial_not_ours",
                              file=str(self.path),
                              hint="move or remove it yourself, or choose another OUT; it is never deleted for you")

    def _take_lock(self) -> None:
        fd = os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise OutputError(f"another dsv4-convert run is writing {self.out} (lock held on {self.path / LOCK})",
                              error_id="output.locked",
                              hint="wait for it to finish, or stop it; two runs never share one output") from None
        self._lock_fd = fd
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())

    def _adopt(self, fingerprint: str) -> None:
        if not (self.resume or self.force):
            self._release()
            raise OutputError(f"an interrupted run left {self.path}", error_id="output.interrupted_run",
                              hint="pass --resume to continue it, or --force to start over")
        state = _read_json(self.path / PROGRESS)
        same = state.get("fingerprint") == fingerprint
        if self.resume and not self.force and state and not same:
            self._release()
            changed = _first_change(state.get("sources") or {}, self.stamp) if self.source else None
            why = (f"the input changed since the interrupted run ({changed}: size or mtime differs)" if changed
                   else "it was staged from a different input or different options")
            raise OutputError(f"cannot resume {self.path}: {why}", error_id="output.resume_mismatch",
                              file=str(self.source / changed) if changed else None,
                              hint="rerun with the same input and options, or --force to start over "
                                   "(shards made from the old input are never mixed with new ones)")
        keep = state.get("shards", {}) if (self.resume and same) else {}
        if self.fence is not None:
            self.fence(self.path)
        for entry in self.path.iterdir():
            shard = entry.name.removesuffix(LOST_SUFFIX)  # a kept shard keeps its lost-scale record
            if entry.name not in (LOCK, PROGRESS) and entry.name not in keep and shard not in keep:
                _remove(entry)
        algorithm = state.get("hash_algorithm", "sha256")
        for name, rec in keep.items():
            f = self.path / name
            if f.is_symlink():
                f.unlink()
                continue
            digest = rec.get("hash", rec.get("sha256"))
            if algorithm == HASH_ALGORITHM and f.exists() and f.stat().st_size == rec["size"] \
                    and file_digest(f, algorithm) == digest:
                self.done[name] = {"hash": digest, "size": rec["size"]}
            elif f.exists():
                f.unlink()

    def shard_tmp(self, name: str) -> Path:
        return self.path / (name + ".tmp")

    def finish_shard(self, name: str, digest: str, size: int) -> None:
        os.replace(self.shard_tmp(name), self.path / name)
        self.done[name] = {"hash": digest, "size": size}
        self._save_progress()

    def write_manifest(self, manifest: dict, name: str = MANIFEST) -> None:
        """The record, written last: every file in staging with its hash (shards from their record)."""
        files = {}
        for f in sorted(self.path.rglob("*")):
            rel = f.relative_to(self.path).as_posix()
            if f.is_dir() or rel in (LOCK, PROGRESS, name):
                continue
            rec = self.done.get(rel)
            files[rel] = rec if rec else {"hash": file_digest(f), "size": f.stat().st_size}
        manifest = dict(manifest, hash_algorithm=HASH_ALGORITHM, files=files)
        manifest.setdefault("producer", {"name": "dsv4-convert"})
        write_json_atomic(self.path / name, manifest)

    def publish(self) -> None:
        """fsync everything, then rename `<out>.partial` to `<out>` (replacing `<out>` under --force)."""
        if self.source is not None and self.stamp:
            changed = _first_change(self.stamp, source_stamp(self.source))
            if changed:
                raise InputError(f"{changed} changed while it was being converted; nothing was published",
                                 error_id="input.changed_during_run", file=str(self.source / changed),
                                 hint="leave the input alone while a run reads it, then run again")
        for f in self.path.rglob("*"):
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        if (self.path / PROGRESS).exists():
            (self.path / PROGRESS).unlink()
        _fsync_dir(self.path)
        check_replaceable(self.out, force=self.force, allow_empty=True)  # again: it may have changed since
        self._release(remove_lock_file=True)
        old = None
        if self.out.exists():
            old = self.out.with_name(f"{self.out.name}.replaced-{os.getpid()}")
            os.rename(self.out, old)
        os.rename(self.path, self.out)
        self._owned = False
        _fsync_dir(self.out.parent)
        if old is not None:
            shutil.rmtree(old)

    def discard(self, keep_verified: bool = False) -> None:
        """Remove the staging directory (after an error or Ctrl-C): nothing that looks complete remains.
        With keep_verified (Ctrl-C during --resume) the finished, recorded shards stay for the next
        --resume; only unfinished temporaries go. A no-op unless this run took the directory in open()
        (another run's lock, or a directory open() refused, is never removed here)."""
        if not self._owned:
            return
        if keep_verified and self._lock_fd is not None and self.path.exists():
            for f in self.path.glob("*.tmp"):
                f.unlink(missing_ok=True)
            self._release()
            self._owned = False
            return
        self._release()
        if self.path.exists():
            shutil.rmtree(self.path, ignore_errors=True)
        self._owned = False

    def _release(self, remove_lock_file: bool = False) -> None:
        if self._lock_fd is not None:
            if remove_lock_file:
                os.unlink(self.path / LOCK)
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None


def _read_json(path: Path) -> dict:
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return obj if isinstance(obj, dict) else {}


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    else:
        p.unlink()
