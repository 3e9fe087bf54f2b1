"""OUT's one owner, from the command line to publish: every command that writes a checkpoint (the
converters, marlin-to-source, synth) builds one OutputTree, checks it before any work, writes through
it and publishes or discards it; no other module names the staging directory, its lock or its
progress record.

Atomic output: everything is built in `<out>.partial/`, shard by shard, each shard recorded with
its hash; everything is fsync'd and the directory renamed to `<out>` only when complete. A lock in the
staging directory keeps two runs apart; `--resume` keeps shards whose recorded hash still verifies,
and only when no source file changed (size, mtime_ns, ctime_ns and inode of every file: `touch -r` can
set an mtime back, nobody but the clock sets a ctime, and a file replaced by another has a new inode).
The published manifest names its hash algorithm and lists every file written (runtime/manifest.py
verifies it)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from ...core.errors import InputError, OutputError
from ...core.files import LOCK, LOST_SUFFIX, MANIFEST, PROGRESS, REPLACED
from ..digest import HASH_ALGORITHM, file_digest
from ..jobs import RunDir
from ..signals import signals_deferred
from .claim import Locks
from .records import (
    KeptCheck,
    bad_record_entry,
    first_change,
    fsync_dir,
    remove_entry,
    source_stamp,
    write_json_atomic,
)
from .rules import (
    check_aliasing,
    check_replaceable,
    mark_restored,
    out_path,
    read_json,
    refuse_foreign,
    replaced_leftovers,
    staging_path,
)

__all__ = ["OutputTree", "output_paths"]


def output_paths(out) -> tuple[Path, Path]:
    """(OUT as it is published, its staging directory): what side files are kept off (cli/command_paths.py)."""
    out = out_path(out)
    return out, staging_path(out)


class OutputTree:
    """The one owner of OUT's life cycle: the command builds it and checks it before any work, then
    opens, fills (shards from the workers' scratch directory, files, records), publishes or discards
    the same object. `resumable`: the command has --resume; `allow_empty`: an empty OUT is written
    into without --force; `durable=False`: nothing is fsync'd, the rename stays atomic (synth: a synthetic
    checkpoint is made again in seconds, and the tests make hundreds)."""

    def __init__(self, out, *, force: bool = False, resume: bool = False, source: Path | None = None,
                 resumable: bool = True, allow_empty: bool = False, durable: bool = True, writes: set[str] = frozenset()):
        self.out, self.path = output_paths(out)  # path: the staging directory, named in messages only
        self.force, self.resume, self.resumable, self.allow_empty = force, resume, resumable, allow_empty
        self.durable = durable
        self.source = Path(source).resolve() if source is not None else None
        self.writes = frozenset(writes)  # top-level names the command writes besides the input's (synth's configs)
        self.stamp: dict = {}
        self._locks = Locks()  # the staging directory's flock (held through publish's rename) and lock file
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
        check_replaceable(self.out, force=self.force, allow_empty=self.allow_empty)
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
            refuse_foreign(self.path, self._source_names())
        made = False
        try:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            with signals_deferred():  # the mkdir and `made` together: a signal never orphans the directory
                if not existed:
                    self.path.mkdir()  # a directory that appears meanwhile is not ours: FileExistsError
                    made = True
                self._locks.take(self.path, self.out)
                self._owned = True
            if existed:
                self._adopt(fingerprint)
            self.fingerprint = fingerprint
            self._save_progress()
        except BaseException as e:  # a signal too: it can land between the lock and the first record
            self._locks.release()
            if made:  # leave nothing behind that a later run would take for an interrupted one
                shutil.rmtree(self.path, ignore_errors=True)
            self._owned = False
            if not isinstance(e, OSError):
                raise
            if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):  # disk full, or over a quota
                raise OutputError(f"no space left to start writing {self.path} ({e.strerror})",
                                  error_id="output.disk_full", file=str(self.path),
                                  hint="free some space on that filesystem, or choose another OUT") from None
            raise OutputError(f"cannot create {self.path}: {e.strerror}", error_id="output.not_writable",
                              file=str(self.path),
                              hint="choose a writable OUT location (its parent must be a directory you can write)") from None
        return dict(self.done)

    def _save_progress(self) -> None:
        write_json_atomic(self.path / PROGRESS, {"fingerprint": self.fingerprint, "sources": self.stamp,
                                                  "hash_algorithm": HASH_ALGORITHM, "shards": self.done},
                          sync=self.durable)

    def _source_names(self) -> set[str]:
        """The top-level names of the input (a run copies these into its staging directory) and the command's own."""
        try:
            return {e.name for e in self.source.iterdir()} | self.writes if self.source is not None else set(self.writes)
        except OSError:
            return set(self.writes)

    def _adopt(self, fingerprint: str) -> None:
        if not (self.resume or self.force):
            self._locks.release()
            raise OutputError(f"an interrupted run left {self.path}", error_id="output.interrupted_run",
                              hint="pass --resume to continue it, or --force to start over" if self.resumable
                              else "pass --force to start over (it is deleted then)")
        state = read_json(self.path / PROGRESS)
        same = state.get("fingerprint") == fingerprint
        if self.resume and not self.force and state and not same:
            self._locks.release()
            changed = first_change(state.get("sources") or {}, self.stamp) if self.source else None
            why = (f"the input changed since the interrupted run ({changed}: its size, mtime, ctime or inode differs)" if changed
                   else "it was staged from a different input or different options")
            raise OutputError(f"cannot resume {self.path}: {why}", error_id="output.resume_mismatch",
                              file=str(self.source / changed) if changed else None,
                              hint="rerun with the same input and options, or --force to start over "
                                   "(shards made from the old input are never mixed with new ones)")
        keep = state.get("shards", {}) if (self.resume and same) else {}
        self._refuse_bad_record(keep)
        RunDir.fence(self.path)  # with the lock held: an older run's surviving workers can write no more
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
            self._locks.release()
            raise OutputError(f"the progress record {self.path / PROGRESS} lists {bad[:200]}, which is not a shard "
                              "this tool writes; the staging directory is not used", error_id="paths.partial_bad_record",
                              file=str(self.path / PROGRESS),
                              hint="check that directory and remove it yourself, or choose another OUT; "
                                   "it is never deleted for you")

    # -- filling: what the command writes goes through these ---------------------------------------
    def scratch(self) -> RunDir:
        """The workers' scratch directory for this run, made (after open()): the only place they write."""
        run = RunDir(self.path)
        run.create()
        return run

    def take_shard(self, run: RunDir, name: str, size: int, digest: str | None = None,
                   sidecars: tuple[str, ...] = ()) -> None:
        """A finished job's file `name` (and its sidecars) from the scratch directory into the tree; with
        `digest`, recorded as finished in the progress record (what --resume keeps)."""
        run.hand_over(name, size, self.path, sidecars=sidecars)
        os.replace(self.path / (name + ".tmp"), self.path / name)
        if digest is not None:
            self.done[name] = {"hash": digest, "size": size}
            self._save_progress()

    def file(self, rel: str) -> Path:
        """Where the file `rel` (a relative path) of the output is written now, its folder made: for
        writers that need a path (safetensors' save_file, a defect edited into a written file)."""
        path = self.path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def folder(self, rel: str) -> None:
        (self.path / rel).mkdir(parents=True, exist_ok=True)

    def write_text(self, rel: str, text: str) -> None:
        self.file(rel).write_text(text)

    def write_json(self, rel: str, obj) -> None:
        write_json_atomic(self.file(rel), obj, sync=self.durable)

    def copy_in(self, source_file: Path, rel: str) -> None:
        """A byte-identical copy of `source_file` (a file of the input) as `rel`."""
        shutil.copyfile(source_file, self.file(rel))

    def glob(self, pattern: str) -> list[Path]:
        """The files at the top of the tree whose name matches `pattern`, sorted."""
        return sorted(self.path.glob(pattern))

    def remove(self, rel: str) -> None:
        (self.path / rel).unlink()

    def written(self) -> list[str]:
        """Every file (or link) written so far, relative and sorted: the run's lock and progress record left out."""
        return sorted(rel for p in self.path.rglob("*") if (not p.is_dir() or p.is_symlink())
                      and (rel := p.relative_to(self.path).as_posix()) not in (LOCK, PROGRESS))

    def mark_restored(self) -> None:
        """marlin-to-source's record that this tool wrote the tree (runtime/output/rules.py mark_restored)."""
        mark_restored(self.path)

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
        write_json_atomic(self.path / name, manifest, sync=self.durable)

    def publish(self, step=lambda: None) -> None:
        """fsync everything (when durable), then rename `<out>.partial` to `<out>` (replacing `<out>` under --force).
        The staging directory stays flock'd until the rename is done: no other run adopts it meanwhile."""
        if self.source is not None and self.stamp:
            changed = first_change(self.stamp, source_stamp(self.source))
            if changed:
                raise InputError(f"{changed} changed while it was being converted; nothing was published",
                                 error_id="input.changed_during_run", file=str(self.source / changed),
                                 hint="leave the input alone while a run reads it, then run again")
        for f in self.path.rglob("*") if self.durable else ():
            if f.is_file() and not f.is_symlink():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        if (self.path / PROGRESS).exists():
            (self.path / PROGRESS).unlink()
        if self.durable:
            fsync_dir(self.path)
        check_replaceable(self.out, force=self.force, allow_empty=True)  # again: it may have changed since
        self._locks.drop_file(self.path)
        step()  # (the crash tests' step points: each state a kill can leave here is recovered or explained)
        if not self._locks.same_directory(self.path):  # moved or replaced by another run, or by hand
            raise OutputError(f"{self.path} was replaced or removed by another run (or by hand) while this run "
                              "wrote it; nothing was published", error_id="output.staging_replaced",
                              file=str(self.path), hint=f"check {self.out}: the other run's output may be there; "
                                                        "run again if it is not")
        old = None
        if self.out.exists():  # a fresh holder each time: a leftover (or pid 1 in a container) never collides
            old = Path(tempfile.mkdtemp(prefix=f"{self.out.name}{REPLACED}", dir=self.out.parent))
            os.rename(self.out, old / self.out.name)
            step()
        with signals_deferred():  # published and `published` together: an interrupt after it says so
            os.rename(self.path, self.out)
            self._owned = False
            self.published = True
        self._locks.release()
        step()
        if self.durable:
            fsync_dir(self.out.parent)
        for holder in ([old] if old is not None else []) + self.leftovers:  # --force asked to replace them
            shutil.rmtree(holder)

    def discard(self, keep_verified: bool = False) -> None:
        """Remove the staging directory (after an error or Ctrl-C): nothing that looks complete remains.
        With keep_verified (Ctrl-C during --resume) the finished, recorded shards stay for the next
        --resume; only unfinished temporaries go. A no-op unless this run took the directory in open()
        (another run's lock, or a directory open() refused, is never removed here)."""
        if self._kept is not None:
            self._kept.cancel()
            self._kept = None
        if not self._owned:
            self._locks.release()
            return
        if keep_verified and self._locks.held and self.path.exists():
            for f in self.path.glob("*.tmp"):
                f.unlink(missing_ok=True)
            self._locks.release()
            self._owned = False
            return
        if self.path.exists() and self._locks.dir_fd is not None:  # still the directory this run locked
            shutil.rmtree(self.path, ignore_errors=True)
        self._locks.release()
        self._owned = False

