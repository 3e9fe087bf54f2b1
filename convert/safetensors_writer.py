"""A streaming safetensors writer: the header is written first from a known plan, then tensor data
is appended one tensor at a time, so a shard never has to be held in memory. The file's hash
(runtime/digest.py) is computed while writing.

Where the filesystem allows it the bytes go to disk with O_DIRECT from aligned buffers, written and
hashed in a thread beside the conversion (runtime/direct_io.py says why: the page-cache copy and its
writeback cost more CPU than anything else the writer does). DSV4_CONVERT_DIRECT_IO=0 forces the
buffered path below, which is also the fallback where O_DIRECT is refused, and the converter's
choice on tmpfs (`direct_pays`).

Buffered, writeback starts as the data is written: every `_KICK` bytes the writer asks the kernel to
start writing that range to disk (Linux `sync_file_range(SYNC_FILE_RANGE_WRITE)`: it queues the I/O
and returns; it does not wait for it, and it is not a durability point). Without it the kernel lets
dirty pages pile up to its background threshold (10% of memory) before the disk does anything, so
on a fast converter most of the disk's work happened after the CPU's, in the final fsync. Durability
is the same on both paths: `close(fsync=True)` or publish's fsync still makes every byte durable
before a shard counts as done or the output is renamed into place."""

from __future__ import annotations

import ctypes
import errno
import json
import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.checkpoint.dtypes import DTYPE_SIZES
from ..runtime import direct_io
from ..runtime.digest import new_hash

__all__ = ["header_bytes", "ShardWriter", "TensorSpec"]

_ALIGN = 8
_KICK = 32 << 20  # start writeback of every this many bytes written
_SYNC_FILE_RANGE_WRITE = 2
_WINDOW = 64 << 20  # bytes of a shard part mapped at once (_MappedSink)


def _sync_file_range():
    """libc's sync_file_range (Linux), or None where there is none (then the kernel's own writeback).
    Looked up in the symbols already loaded (dlopen(NULL)): no `ldconfig` subprocess at import time."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_start_writeback = _sync_file_range()
_TMPFS_MAGIC = 0x01021994  # statfs f_type of tmpfs (linux/magic.h)


def direct_pays(folder: Path) -> bool:
    """Whether O_DIRECT saves anything for files in `folder`: not on tmpfs (/dev/shm), which since
    Linux 6.6 accepts O_DIRECT but still copies into its page cache, so the bounce buffers' copy and
    the direct-write path's extra kernel work are pure cost: 0.4-0.5 of 2.1-2.4 CPU s for one 1.36 GB
    layer (docs/PERFORMANCE.md). A filesystem type this cannot read counts as a disk (O_DIRECT)."""
    try:
        buf = ctypes.create_string_buffer(256)  # struct statfs, f_type first (a C long on Linux)
        if ctypes.CDLL(None, use_errno=True).statfs(os.fsencode(folder), buf) != 0:
            return True
        return ctypes.c_long.from_buffer(buf).value != _TMPFS_MAGIC
    except (OSError, AttributeError):
        return True


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """What the header promises for one tensor."""
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = DTYPE_SIZES[self.dtype]
        for d in self.shape:
            n *= d
        return n


def header_bytes(specs: list[TensorSpec], metadata: dict[str, str] | None = None) -> bytes:
    """The 8-byte length + JSON header for tensors laid out back to back in the given order,
    padded with spaces to a multiple of 8 like the reference writer."""
    header: dict = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for s in specs:
        if s.dtype not in DTYPE_SIZES:
            raise ValueError(f"{s.name}: dtype {s.dtype} is not writable")
        header[s.name] = {"dtype": s.dtype, "shape": list(s.shape), "data_offsets": [offset, offset + s.nbytes]}
        offset += s.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % _ALIGN)
    return len(raw).to_bytes(8, "little") + raw


class _BufferedSink:
    """Through the page cache: write straight from the caller's buffer (no copy in user space), hash
    (unless `hasher` is None), and start writeback every `_KICK` bytes. `offset`: where the first byte
    goes; `shared`: other jobs write other parts of the file (then it is never truncated)."""

    def __init__(self, path: Path, hasher, offset: int = 0, *, shared: bool = False):
        trunc = 0 if shared else os.O_TRUNC
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | trunc | os.O_CLOEXEC, 0o644)
        self._hash = hasher
        self._offset = offset
        self.direct = False
        self.size = 0
        self._kicked = 0  # bytes [offset, offset + _kicked) have had their writeback started

    def write(self, data) -> None:
        mv = memoryview(data).cast("B")
        if self._hash is not None:
            self._hash.update(mv)
        n, total = 0, len(mv)
        while n < total:
            n += os.pwrite(self._fd, mv[n:], self._offset + self.size + n)
        self.size += total
        if _start_writeback is not None and self.size - self._kicked >= _KICK:
            _start_writeback(self._fd, self._offset + self._kicked, self.size - self._kicked, _SYNC_FILE_RANGE_WRITE)
            self._kicked = self.size  # a failure here is harmless: the fsync later writes what is left

    def finish(self, *, fsync: bool) -> None:
        try:
            if fsync:
                os.fsync(self._fd)
        finally:
            self._close(kick=True)

    def abort(self) -> None:
        self._close(kick=False)

    def _close(self, *, kick: bool) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            if kick and _start_writeback is not None and self.size > self._kicked:  # the tail, too
                _start_writeback(fd, self._offset + self._kicked, self.size - self._kicked, _SYNC_FILE_RANGE_WRITE)
            os.close(fd)


class _MappedSink:
    """One part of a shard that other jobs write beside it: the part's range is allocated first
    (posix_fallocate: a full disk is ENOSPC here, never a SIGBUS later), then the writes are copied
    into a shared mapping of the range, `_WINDOW` bytes at a time. Why not pwrite: Linux serialises
    buffered writes to one file on its inode lock. Why a window: one mapping per write (thousands
    per layer) made every job of a process wait on the process's one memory-map lock and interrupt
    the other cores for each unmap; one window per 64 MiB keeps that rare and the mapped pages (RSS)
    bounded."""

    def __init__(self, fd: int, offset: int, length: int):
        self._fd, self._offset, self._end = fd, offset, offset + length
        self.direct = False
        self.size = 0
        self._mm, self._view, self._base = None, None, 0  # the window: file bytes [_base, _base + len(_view))

    @classmethod
    def open(cls, path: Path, offset: int, length: int):
        """The sink, or None where the filesystem cannot allocate ahead (then pwrite it is)."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            if length:
                os.posix_fallocate(fd, offset, length)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                return None
            raise
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, offset, length)

    def write(self, data) -> None:
        src = np.frombuffer(memoryview(data).cast("B"), np.uint8)
        if not src.size:
            return
        start = self._offset + self.size
        if self._view is None or start + src.size > self._base + self._view.size:
            self._map(start, src.size)
        self._view[start - self._base:start - self._base + src.size] = src  # numpy copies without the GIL
        self.size += src.size

    def _map(self, start: int, need: int) -> None:
        self._unmap()
        base = start - start % mmap.ALLOCATIONGRANULARITY
        length = min(max(start - base + need, _WINDOW), self._end - base)
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)  # one fault-in, not one fault per page
        self._mm = mmap.mmap(self._fd, length, flags=flags, offset=base)
        self._view, self._base = np.frombuffer(self._mm, np.uint8), base

    def _unmap(self) -> None:
        if self._mm is not None:
            self._view = None  # the mapping cannot close while a view of it exists
            self._mm.close()
            self._mm = None

    def finish(self, *, fsync: bool) -> None:
        try:
            self._unmap()
            if fsync:
                os.fsync(self._fd)
        finally:
            self.abort()

    def abort(self) -> None:
        self._unmap()
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


class ShardWriter:
    """Write one shard: `write(name, data)` in header order, then `close()` (flush + fsync).
    Every write is checked against the plan, so a shard can never silently disagree with its header.
    `direct_io` says whether the bytes went to disk with O_DIRECT (else through the page cache).

    `part=(start, stop)`: write only tensors specs[start:stop], at their place in the file, beside
    writers of the shard's other parts (several jobs per shard; the header goes with part 0). A part
    goes through the page cache (O_DIRECT needs block-aligned ranges, and parts meet at any byte):
    through a shared mapping of its range where the filesystem allocates ahead, else pwrite. It is
    not hashed: `close()` returns (None, bytes written); the whole file is hashed once every
    part is written (convert/pieces.py). `direct=False`: a whole shard goes through the page cache too."""

    def __init__(self, path: Path, specs: list[TensorSpec], metadata: dict[str, str] | None = None, *,
                 fsync: bool = True, part: tuple[int, int] | None = None, direct: bool = True):
        self.path = Path(path)
        header = header_bytes(list(specs), metadata)  # checks every spec before a file is created
        start, stop = part or (0, len(specs))
        self._whole = (start, stop) == (0, len(specs))
        self._specs = list(specs)[:stop]
        self._next = start
        self._hash = new_hash() if self._whole else None
        fd = direct_io.open_direct(self.path) if self._whole and direct else None
        offset = 0 if start == 0 else len(header) + sum(s.nbytes for s in self._specs[:start])
        length = sum(s.nbytes for s in self._specs[start:]) + (len(header) if start == 0 else 0)
        mapped = None if self._whole else _MappedSink.open(self.path, offset, length)
        if fd is not None:
            self._sink = direct_io.DirectSink(fd, self._hash)
        elif mapped is not None:
            self._sink = mapped
        else:
            self._sink = _BufferedSink(self.path, self._hash, offset, shared=not self._whole)
        self._pending = 0  # bytes still owed to the current tensor
        self._fsync = fsync
        try:
            if start == 0:
                self._sink.write(header)
        except BaseException:
            self._sink.abort()
            raise

    @property
    def direct_io(self) -> bool:
        return self._sink.direct

    def begin(self, name: str) -> int:
        """Start the next tensor; returns the number of bytes it must receive through `feed`."""
        if self._pending:
            raise RuntimeError(f"{self._specs[self._next - 1].name}: {self._pending} bytes were never written")
        if self._next >= len(self._specs):
            raise RuntimeError(f"{name}: not planned for {self.path.name}")
        spec = self._specs[self._next]
        if spec.name != name:
            raise RuntimeError(f"{self.path.name}: expected tensor {spec.name} next, got {name}")
        self._next += 1
        self._pending = spec.nbytes
        return spec.nbytes

    def feed(self, data) -> None:
        mv = memoryview(data).cast("B")
        if len(mv) > self._pending:
            raise RuntimeError(f"{self._specs[self._next - 1].name}: {len(mv)} bytes given, {self._pending} left")
        self._sink.write(mv)
        self._pending -= len(mv)

    def write(self, name: str, data) -> None:
        """Write one whole tensor (anything with the buffer protocol, e.g. a numpy array or bytes)."""
        expected = self.begin(name)
        if memoryview(data).nbytes != expected:
            raise RuntimeError(f"{name}: {memoryview(data).nbytes} bytes, header says {expected}")
        self.feed(data)

    def close(self) -> tuple[str | None, int]:
        """Finish the file (flush, and fsync unless disabled); returns (hash hex, size), or for a part
        (None, bytes written). Raises if a planned tensor is missing, or the error of a write that
        failed (errno kept)."""
        if self._pending or self._next != len(self._specs):
            missing = [s.name for s in self._specs[self._next:]]
            raise RuntimeError(f"{self.path.name}: tensors never written: {missing[:5]}")
        self._sink.finish(fsync=self._fsync)
        return (self._hash.hexdigest() if self._hash is not None else None), self._sink.size

    def abort(self) -> None:
        """Close without finishing (the file stays partial); stops the writer thread."""
        self._sink.abort()
