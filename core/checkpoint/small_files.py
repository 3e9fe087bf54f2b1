"""Reading the small files around the weights (config.json, the index, this tool's own records): only
regular files, and at most MAX_SMALL_FILE bytes. A FIFO named config.json would otherwise block the
read for ever, and /dev/zero or /dev/urandom behind a symlink would fill the memory before json sees a
byte. Both come back as OSError subclasses, so every caller's existing `except OSError` names the file."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

__all__ = ["MAX_SMALL_FILE", "NotARegularFile", "TooLarge", "read_small", "read_small_text"]

# The largest real index we know (DeepSeek-V4, ~100k tensors) is ~10 MiB; configs are kilobytes.
MAX_SMALL_FILE = 256 << 20


class NotARegularFile(OSError):
    pass


class TooLarge(OSError):
    pass


def read_small(path: str | os.PathLike, limit: int = MAX_SMALL_FILE) -> bytes:
    """The whole file, opened without blocking (a FIFO) and refused unless it is a regular file of at
    most `limit` bytes; FileNotFoundError and the other OSErrors pass through unchanged."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO, device or socket"
            raise NotARegularFile(errno.EINVAL, f"not a regular file ({kind})", str(path))
        if st.st_size > limit:
            raise TooLarge(errno.EINVAL, f"{st.st_size} bytes, more than the {limit >> 20} MiB a JSON file "
                                        "of a checkpoint can hold", str(path))
        chunks, total = [], 0
        while chunk := os.read(fd, 1 << 20):  # a file that grows while read is still capped
            total += len(chunk)
            if total > limit:
                raise TooLarge(errno.EINVAL, f"more than {limit >> 20} MiB (it grows while read)", str(path))
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_small_text(path: str | os.PathLike | Path, limit: int = MAX_SMALL_FILE) -> str:
    return read_small(path, limit).decode("utf-8")
