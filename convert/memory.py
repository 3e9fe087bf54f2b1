"""Keep freed tensor buffers for reuse instead of handing them back to the kernel.

glibc serves every allocation above 128 KiB-32 MiB (its adaptive mmap threshold) with a fresh
mmap and unmaps it on free, so each projection's input and output buffers (tens of MiB) were
page-faulted and zero-filled by the kernel again, once per projection: about 1 s of CPU per
3.6 GB converted. Raising the mmap and trim thresholds makes freed buffers go back to the heap and
the next projection reuse them; the heap stays at the few buffers in flight (RSS unchanged in
practice). A no-op where mallopt is not glibc's."""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["keep_buffers"]

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
