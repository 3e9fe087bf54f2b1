"""The staging directory's locks (runtime/output/tree.py): the two that keep runs apart (the directory's
flock, held through publish's rename, and its lock file), and the lock descriptors a forked worker must
not keep."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from ...core.errors import OutputError
from ...core.files import LOCK
from .rules import partial_not_ours_error, plain_file

__all__ = ["Locks"]

_HELD: set[int] = set()  # this process's lock descriptors (the staging directory's and its lock file's)


def _drop_inherited_locks() -> None:
    """In a forked child (a pool worker): close its copies of the lock descriptors. A flock belongs to
    the open file description, so a copy kept by a worker would hold the lock after the run died (its
    O_CLOEXEC acts on exec only); closing a copy leaves the parent's lock as it was."""
    for fd in _HELD:
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_inherited_locks)


def _let_go(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)
    _HELD.discard(fd)
    os.close(fd)


class Locks:
    """The staging directory's two locks, taken by `take` and held until `release` (or, for the lock
    file alone, `drop_file` before publishing: the directory's flock stays through the rename)."""

    def __init__(self):
        self.lock_fd: int | None = None
        self.dir_fd: int | None = None  # the staging directory itself, flock'd

    def take(self, path: Path, out: Path) -> None:
        """flock the staging directory `path` and its lock file, which is created here (O_EXCL) or,
        adopted, proven a plain file of its own (one link, no symlink) before it is written: a hard
        link to a user's file is never truncated."""
        locked = OutputError(f"another dsv4-convert run is writing {out} (lock held on {path})",
                             error_id="output.locked",
                             hint="wait for it to finish, or stop it; two runs never share one output")
        self.dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        _HELD.add(self.dir_fd)
        try:
            fcntl.flock(self.dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise locked from None
        except OSError:  # NFS emulates flock with POSIX locks, which need a writable fd: the lock file still guards
            pass
        lock = path / LOCK
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(lock, flags | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                fd = os.open(lock, flags)
            except OSError as e:  # ELOOP: a symlink
                raise partial_not_ours_error(path)(f"its lock {lock} is a link ({e.strerror})") from None
            if not plain_file(fd):
                os.close(fd)
                raise partial_not_ours_error(path)(
                    f"its lock {lock} is not a plain file this tool made (a hard link or a special file)")
        self.lock_fd = fd
        _HELD.add(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise locked from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())

    @property
    def held(self) -> bool:
        return self.lock_fd is not None

    def same_directory(self, path: Path) -> bool:
        """Whether `path` is still the directory whose flock this run holds (not moved or replaced)."""
        try:
            return os.stat(path, follow_symlinks=False).st_ino == os.fstat(self.dir_fd).st_ino
        except (OSError, TypeError):
            return False

    def drop_file(self, path: Path) -> None:
        """Before publishing: the lock file must not be in the output (the directory lock stays)."""
        if self.lock_fd is not None:
            os.unlink(path / LOCK)
            _let_go(self.lock_fd)
            self.lock_fd = None

    def release(self) -> None:
        for attr in ("lock_fd", "dir_fd"):
            fd = getattr(self, attr)
            if fd is not None:
                _let_go(fd)
                setattr(self, attr, None)
