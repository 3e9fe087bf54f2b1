"""The output tree's small files and facts (runtime/output/tree.py): JSON records written atomically,
the input's stamp that `--resume` and publish compare, removing what a run left, and the check of the
shards an interrupted run kept."""

from __future__ import annotations

import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ...core.checkpoint.source_location import is_download_metadata
from ..digest import HASH_ALGORITHM, file_digest
from .names import record_name_ok
from .rules import plain_file

__all__ = ["fsync_dir", "write_json_atomic", "source_stamp", "first_change", "remove_entry",
           "KeptCheck", "bad_record_entry"]


def fsync_dir(path: Path) -> None:
    """fsync a directory: the renames and creations in it are on disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, obj, *, sync: bool = True) -> None:
    """Through a fresh temporary file (O_EXCL, never through a link a stale one may be) and a rename."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)  # a name, never what it links to
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        if sync:
            os.fsync(f.fileno())
    os.replace(tmp, path)


def source_stamp(root: Path) -> dict[str, list[int]]:
    """{relative path: [size, mtime_ns, ctime_ns, inode]} of every file of the input (not the downloader's bookkeeping,
    which is not copied): any edit since changes it."""
    root = Path(root)
    stamp = {}
    for p in sorted(root.rglob("*")):
        if is_download_metadata(p.relative_to(root)):
            continue
        try:
            st = p.stat()
        except OSError:
            continue
        if not p.is_dir():
            stamp[p.relative_to(root).as_posix()] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
    return stamp


def first_change(old: dict, new: dict) -> str | None:
    """The first path (in sorted order) whose stamp differs between two source stamps, or None."""
    return next((k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)), None)


def remove_entry(p: Path) -> None:
    """A file, a link (the link itself) or a whole directory."""
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    else:
        p.unlink()


def bad_record_entry(keep) -> str | None:
    """Each shard a progress record lists becomes a path to verify or delete: only a plain shard name of
    this tool's making with its hash and size passes. The first entry that does not (`../IN/...`, an
    absolute path, a record edited by hand: the whole directory is then refused and left alone), shown."""
    if not isinstance(keep, dict):
        return repr(keep)
    return next((repr(n) for n, rec in keep.items() if not (record_name_ok(n) and n.endswith(".safetensors"))
                 or not isinstance(rec, dict) or type(rec.get("size")) is not int), None)


class KeptCheck:
    """The shards an interrupted run finished, each re-hashed in a background thread while `--resume`
    converts the others (the hash releases the GIL). Issue 37: hashed first and one after the other,
    they were read back from disk (written with O_DIRECT, never in the page cache) before any work
    began, and a resume that reused 2 of 4 shards took longer than starting over."""

    @classmethod
    def start(cls, root: Path, keep: dict, algorithm: str) -> tuple[dict[str, dict], KeptCheck | None]:
        """The progress record's shards `keep` that are still plain files of their recorded size (the
        others are deleted), as staging's `done`, and their hashes' check, started."""
        done = {}
        for name, rec in keep.items():
            f = Path(root) / name
            if not plain_file(f):  # a link (or a hard link: not a file a run wrote alone) is dropped, by name
                if os.path.lexists(f):
                    remove_entry(f)
                continue
            if algorithm == HASH_ALGORITHM and f.stat().st_size == rec["size"]:
                done[name] = {"hash": rec.get("hash", rec.get("sha256")), "size": rec["size"]}
            else:
                f.unlink()
        return done, (cls(root, {n: r["hash"] for n, r in done.items()}, algorithm) if done else None)

    def __init__(self, root: Path, expected: dict[str, str], algorithm: str):
        self.expected = expected
        self._pool = ThreadPoolExecutor(max(1, min(len(expected), os.cpu_count() or 1)),
                                        thread_name_prefix="dsv4-kept-check")
        self._digests = {name: self._pool.submit(_digest_or_none, Path(root) / name, algorithm) for name in expected}

    def failed(self) -> list[str]:
        """Wait for every hash; the kept shards whose bytes no longer match their record, sorted."""
        bad = sorted(n for n, digest in self._digests.items() if digest.result() != self.expected[n])
        self._pool.shutdown()
        return bad

    def cancel(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)  # no thread reads the directory once this returns


def _digest_or_none(path: Path, algorithm: str) -> str | None:
    try:
        return file_digest(path, algorithm)
    except OSError:  # gone or unreadable: it does not verify
        return None
