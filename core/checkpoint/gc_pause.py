"""Building a checkpoint's tables without the cyclic garbage collector.

A real checkpoint's tables are 10^5-10^6 small objects (a TensorRef and its name and shape per tensor,
the projections, the grouping's dicts): none is in a reference cycle, yet while they are built the
collector traverses all of them again and again and frees nothing (0.28 of `inspect`'s 1.85 CPU s on
the 132,097 tensors of DeepSeek-V4-Flash). `builds_tables` pauses it for the call and gives it back as
it found it. It does not freeze what was built (gc.freeze is process-wide: a library has no business
deciding it for the program that imports it; measured, it gained nothing beyond the pause within the
noise: docs/PERFORMANCE.md).
"""

from __future__ import annotations

import functools
import gc

__all__ = ["builds_tables"]


def builds_tables(open_checkpoint):
    """Decorate a function returning a Checkpoint: the collector is paused while it runs, and its state
    restored after, also on an error."""
    @functools.wraps(open_checkpoint)
    def paused(*args, **kwargs):
        enabled = gc.isenabled()
        gc.disable()
        try:
            return open_checkpoint(*args, **kwargs)
        finally:
            if enabled:
                gc.enable()
    return paused
