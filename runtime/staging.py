"""Atomic output: everything is built in `<out>.partial/`, shard by shard, each shard recorded with
its hash; everything is fsync'd and the directory renamed to `<out>` only when complete. A lock in the
staging directory keeps two runs apart; `--resume` keeps shards whose recorded hash still verifies,
and only when no source file changed (size, mtime_ns, ctime_ns and inode of every file: `touch -r` can
set an mtime back, nobody but the clock sets a ctime, and a file replaced by another has a new inode).
The published manifest names its hash algorithm and lists every file written (runtime/manifest.py
verifies it)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from ..core.errors import InputError, OutputError
from ..core.files import LOCK, LOST_SUFFIX, MANIFEST, PROGRESS, REPLACED, staging_entry_ok
from .digest import HASH_ALGORITHM, file_digest
from .paths import (
    check_aliasing,
    check_replaceable,
    is_disk_full,
    out_path,
    partial_not_ours_error,
    plain_file,
    replaced_leftovers,
    staging_path,
    unlisted_entries,
)
from .signals import signals_deferred
from .stage_files import (
    KeptCheck,
    bad_record_entry,
    first_change,
    fsync_dir,
    hold,
    let_go,
    read_json,
    remove_entry,
    source_stamp,
    write_json_atomic,
)

__all__ = ["Staging"]

class Staging:
    """The one owner of OUT's life cycle: the CLI builds it and checks it before any work, the
    converter (or marlin-to-source) opens, fills, publishes or discards the same object."""

    def __init__(self, out: Path, *, force: bool = False, resume: bool = False, source: Path | None = None,
                 fence=None, resumable: bool = True):
        self.out, self.path = out_path(out), staging_path(out_path(out))
        self.fence = fence  # called with the lock held, before adopting: stops an older run's surviving workers
        self.force, self.resume, self.resumable = force, resume, resumable  # resumable: the command has --resume
        self.source = Path(source).resolve() if source is not None else None
        self.stamp: dict = {}
        self._lock_fd: int | None = None
        self._dir_fd: int | None = None  # the staging directory itself, flock'd: held through publish's rename
        self._owned = False  # from taking the lock in open() until the publishing rename: discard() may clean up
        self.published, self.done = False, {}  # done: shard name -> {"hash", "size"}
        self.leftovers: list[Path] = []  # holders of an output a killed --force run was replacing
        self._kept: KeptCheck | None = None  # the resumed shards' hashes, checked while the run converts the rest

    # -- lifecycle -------------------------------------------------------------------------------
    def check(self) -> None:
        """Every refusal that needs no writing: aliasing with IN, what OUT and OUT.partial are, and
        what a run killed inside publish left beside them."""
        if self.source is not None:
            check_aliasing(self.source, self.out, staging=self.path)
        self.leftovers = replaced_leftovers(self.out)
        if self.leftovers and not self.force:
            first = self.leftovers[0]
            raise OutputError(f"a run killed while replacing {self.out} left the previous output in {first}"
                              + ("" if self.out.exists() else f" ({self.out} is missing; {self.path} holds the new "
                                                                "one, unpublished)"),
                              error_id="output.replaced_leftover", file=str(first),
                              hint=f"pass --force to finish replacing it ({first.name} is then deleted), or move "
                                   f"{first / self.out.name if (first / self.out.name).is_dir() else first} back "
                                   f"to {self.out} yourself")
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
        existed = os.path.lexists(self.path)
        if existed:
            self._refuse_foreign()
        made = False
        try:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            with signals_deferred():  # the mkdir and `made` together: a signal never orphans the directory
                if not existed:
                    self.path.mkdir()  # a directory that appears meanwhile is not ours: FileExistsError
                    made = True
                self._take_lock()
                self._owned = True
            if existed:
                self._adopt(fingerprint)
            self.fingerprint = fingerprint
            self._save_progress()
        except BaseException as e:  # a signal too: it can land between the lock and the first record
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
        """OUT.partial is adopted (and what it holds deleted) only when this tool's own records prove
        it wrote it: its lock and progress record, and nothing but names a run writes there; or, killed
        inside publish, our manifest and nothing it does not list (the unlisted-files rule)."""
        names = {e.name for e in self.path.iterdir()}
        not_ours = partial_not_ours_error(self.path)
        lock = self.path / LOCK
        if LOCK in names and not plain_file(lock):
            raise not_ours(f"its lock {lock} is not a plain file this tool made (a link, a hard link or a special file)")
        if LOCK in names and (names <= {LOCK} or read_json(self.path / PROGRESS).get("fingerprint")):
            extra = sorted(n for n in names if not staging_entry_ok(n, self._source_names()))
            if extra:
                raise not_ours(f"it holds {extra[0]!r}, which no run of this tool writes there", file=self.path / extra[0])
            return
        if read_json(self.path / MANIFEST).get("producer", {}).get("name") == "dsv4-convert":
            extra = unlisted_entries(self.path)  # killed inside publish: lock and progress gone, manifest written last
            if not extra:
                return
            raise not_ours(f"it holds {extra[0]!r}, which its dsv4-convert manifest does not list",
                           file=self.path / extra[0])
        raise not_ours("it holds no dsv4-convert lock and progress record; it is not an interrupted run of this tool")

    def _source_names(self) -> set[str]:
        """The top-level names of the input: a run copies these into its staging directory."""
        try:
            return {e.name for e in self.source.iterdir()} if self.source is not None else set()
        except OSError:
            return set()

    def _take_lock(self) -> None:
        """flock the staging directory (held until publish's rename is done) and its lock file, which
        is created here (O_EXCL) or, adopted, proven a plain file of its own (one link, no symlink)
        before it is written: a hard link to a user's file is never truncated."""
        locked = OutputError(f"another dsv4-convert run is writing {self.out} (lock held on {self.path})",
                             error_id="output.locked",
                             hint="wait for it to finish, or stop it; two runs never share one output")
        self._dir_fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        hold(self._dir_fd)
        try:
            fcntl.flock(self._dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise locked from None
        except OSError:  # NFS emulates flock with POSIX locks, which need a writable fd: the lock file still guards
            pass
        path = self.path / LOCK
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                fd = os.open(path, flags)
            except OSError as e:  # ELOOP: a symlink
                raise partial_not_ours_error(self.path)(f"its lock {path} is a link ({e.strerror})") from None
            if not plain_file(fd):
                os.close(fd)
                raise partial_not_ours_error(self.path)(
                    f"its lock {path} is not a plain file this tool made (a hard link or a special file)")
        self._lock_fd = fd
        hold(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise locked from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())

    def _adopt(self, fingerprint: str) -> None:
        if not (self.resume or self.force):
            self._release()
            raise OutputError(f"an interrupted run left {self.path}", error_id="output.interrupted_run",
                              hint="pass --resume to continue it, or --force to start over" if self.resumable
                              else "pass --force to start over (it is deleted then)")
        state = read_json(self.path / PROGRESS)
        same = state.get("fingerprint") == fingerprint
        if self.resume and not self.force and state and not same:
            self._release()
            changed = first_change(state.get("sources") or {}, self.stamp) if self.source else None
            why = (f"the input changed since the interrupted run ({changed}: its size, mtime, ctime or inode differs)" if changed
                   else "it was staged from a different input or different options")
            raise OutputError(f"cannot resume {self.path}: {why}", error_id="output.resume_mismatch",
                              file=str(self.source / changed) if changed else None,
                              hint="rerun with the same input and options, or --force to start over "
                                   "(shards made from the old input are never mixed with new ones)")
        keep = state.get("shards", {}) if (self.resume and same) else {}
        self._refuse_bad_record(keep)
        if self.fence is not None:
            self.fence(self.path)
        for entry in self.path.iterdir():
            shard = entry.name.removesuffix(LOST_SUFFIX)  # a kept shard keeps its lost-scale record
            if entry.name not in (LOCK, PROGRESS) and entry.name not in keep and shard not in keep:
                remove_entry(entry)
        self.done, self._kept = KeptCheck.start(self.path, keep, state.get("hash_algorithm", "sha256"))

    def verify_kept(self) -> list[str]:
        """The shards kept by --resume whose hash (checked since open()) no longer matches: deleted,
        forgotten, returned for the caller to convert again. write_manifest refuses to run before it."""
        bad, self._kept = self._kept.failed() if self._kept else [], None
        for name in bad:
            (self.path / name).unlink(missing_ok=True)
            del self.done[name]
        if bad:
            self._save_progress()
        return bad

    def _refuse_bad_record(self, keep) -> None:
        """A progress record listing anything but shards of this tool's making refuses the directory."""
        bad = bad_record_entry(keep)
        if bad is not None:
            self._release()
            raise OutputError(f"the progress record {self.path / PROGRESS} lists {bad[:200]}, which is not a shard "
                              "this tool writes; the staging directory is not used", error_id="paths.partial_bad_record",
                              file=str(self.path / PROGRESS),
                              hint="check that directory and remove it yourself, or choose another OUT; "
                                   "it is never deleted for you")

    def shard_tmp(self, name: str) -> Path:
        return self.path / (name + ".tmp")

    def finish_shard(self, name: str, digest: str, size: int) -> None:
        os.replace(self.shard_tmp(name), self.path / name)
        self.done[name] = {"hash": digest, "size": size}
        self._save_progress()

    def write_manifest(self, manifest: dict, name: str = MANIFEST) -> None:
        """The record, written last: every file in staging with its hash (shards from their record)."""
        assert self._kept is None, "verify_kept() first: a kept shard's recorded hash is not proven yet"
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

    def publish(self, step=lambda: None) -> None:
        """fsync everything, then rename `<out>.partial` to `<out>` (replacing `<out>` under --force).
        The staging directory stays flock'd until the rename is done: no other run adopts it meanwhile."""
        if self.source is not None and self.stamp:
            changed = first_change(self.stamp, source_stamp(self.source))
            if changed:
                raise InputError(f"{changed} changed while it was being converted; nothing was published",
                                 error_id="input.changed_during_run", file=str(self.source / changed),
                                 hint="leave the input alone while a run reads it, then run again")
        for f in self.path.rglob("*"):
            if f.is_file() and not f.is_symlink():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        if (self.path / PROGRESS).exists():
            (self.path / PROGRESS).unlink()
        fsync_dir(self.path)
        check_replaceable(self.out, force=self.force, allow_empty=True)  # again: it may have changed since
        self._drop_lock_file()
        step()  # (the crash tests' step points: each state a kill can leave here is recovered or explained)
        self._refuse_replaced()
        old = None
        if self.out.exists():  # a fresh holder each time: a leftover (or pid 1 in a container) never collides
            old = Path(tempfile.mkdtemp(prefix=f"{self.out.name}{REPLACED}", dir=self.out.parent))
            os.rename(self.out, old / self.out.name)
            step()
        with signals_deferred():  # published and `published` together: an interrupt after it says so
            os.rename(self.path, self.out)
            self._owned = False
            self.published = True
        self._release()
        step()
        fsync_dir(self.out.parent)
        for holder in ([old] if old is not None else []) + self.leftovers:  # --force asked to replace them
            shutil.rmtree(holder)

    def _refuse_replaced(self) -> None:
        """The directory at self.path must still be the one this run locked (another run, or a user,
        may have moved or replaced it): never publish someone else's directory."""
        try:
            same = os.stat(self.path, follow_symlinks=False).st_ino == os.fstat(self._dir_fd).st_ino
        except OSError:
            same = False
        if not same:
            raise OutputError(f"{self.path} was replaced or removed by another run (or by hand) while this run "
                              "wrote it; nothing was published", error_id="output.staging_replaced",
                              file=str(self.path), hint=f"check {self.out}: the other run's output may be there; "
                                                        "run again if it is not")

    def discard(self, keep_verified: bool = False) -> None:
        """Remove the staging directory (after an error or Ctrl-C): nothing that looks complete remains.
        With keep_verified (Ctrl-C during --resume) the finished, recorded shards stay for the next
        --resume; only unfinished temporaries go. A no-op unless this run took the directory in open()
        (another run's lock, or a directory open() refused, is never removed here)."""
        if self._kept is not None:
            self._kept.cancel()
            self._kept = None
        if not self._owned:
            self._release()
            return
        if keep_verified and self._lock_fd is not None and self.path.exists():
            for f in self.path.glob("*.tmp"):
                f.unlink(missing_ok=True)
            self._release()
            self._owned = False
            return
        if self.path.exists() and self._dir_fd is not None:  # still the directory this run locked
            shutil.rmtree(self.path, ignore_errors=True)
        self._release()
        self._owned = False

    def _drop_lock_file(self) -> None:
        """Before publishing: the lock file must not be in the output (the directory lock stays)."""
        if self._lock_fd is not None:
            os.unlink(self.path / LOCK)
            let_go(self._lock_fd)
            self._lock_fd = None

    def _release(self) -> None:
        for attr in ("_lock_fd", "_dir_fd"):
            fd = getattr(self, attr)
            if fd is not None:
                let_go(fd)
                setattr(self, attr, None)
