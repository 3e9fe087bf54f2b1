"""Keep freed tensor buffers for reuse instead of handing them back to the kernel (`keep_buffers`),
and keep the garbage collector off the imports' objects (`freeze_imports`).

glibc serves every allocation above 128 KiB-32 MiB (its adaptive mmap threshold) with a fresh
mmap and unmaps it on free, so each projection's input and output buffers (tens of MiB) were
page-faulted and zero-filled by the kernel again, once per projection: about 1 s of CPU per
3.6 GB converted. Raising the mmap and trim thresholds makes freed buffers go back to the heap and
the next projection reuse them; the heap stays at the few buffers in flight (RSS unchanged in
practice). A no-op where mallopt is not glibc's."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc

__all__ = ["keep_buffers", "freeze_imports"]

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_MAX = 32 << 20  # glibc's ceiling for the mmap threshold (64-bit); projection buffers are 4-16 MiB
_TRIM = 256 << 20
_done = False


def keep_buffers() -> None:
    global _done
    if _done:
        return
    _done = True
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_MAX)
        libc.mallopt(_M_TRIM_THRESHOLD, _TRIM)
    except (OSError, AttributeError):
        pass


_frozen = False


def freeze_imports() -> None:
    """Once per process: the objects of the imports (torch's ~10^5) and of the plan are never garbage,
    so no garbage collection should walk them: not during the run, not in a forked worker (where the
    walk would touch their copy-on-write pages), and not at exit, where the interpreter's last
    collections over torch's objects took 1.1-1.4 s of every run here (0.25 s frozen)."""
    global _frozen
    if not _frozen:
        _frozen = True
        gc.freeze()
