"""Building a checkpoint's tables without the cyclic garbage collector.

A real checkpoint's tables are 10^5-10^6 small objects (a TensorRef and its name and shape per tensor,
the projections, the grouping's dicts): none is in a reference cycle, yet while they are built the collector traverses all of
them again and again and frees nothing (0.28 of `inspect`'s 1.85 CPU s on the 132,097 tensors of
DeepSeek-V4-Flash). `builds_tables` pauses it for the call; when the tables are large it then freezes
what is alive (gc.freeze: moved out of every later collection, still freed by reference counting), so
the passes after it (inspect's summary, a conversion's plan) never walk them either. Small checkpoints
(tests, synth) are not frozen: a long-lived process that opens many keeps collecting as usual.
"""

from __future__ import annotations

import functools
import gc

__all__ = ["FREEZE_AT", "builds_tables"]

FREEZE_AT = 1 << 14  # tensors: from here on the tables are frozen once built


def builds_tables(open_checkpoint):
    """Decorate a function returning a Checkpoint: the collector is paused while it runs (its state is
    restored, also on an error), and the result is frozen when it holds FREEZE_AT tensors or more."""
    @functools.wraps(open_checkpoint)
    def paused(*args, **kwargs):
        enabled = gc.isenabled()
        gc.disable()
        try:
            ckpt = open_checkpoint(*args, **kwargs)
            if enabled and len(ckpt.tensors) >= FREEZE_AT:
                gc.freeze()
            return ckpt
        finally:
            if enabled:
                gc.enable()
    return paused
