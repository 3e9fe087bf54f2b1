"""Signals deferred across a few statements that must happen together (runtime/output/tree.py: the claim
of the staging directory, the publishing rename)."""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager

__all__ = ["signals_deferred"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def signals_deferred():
    """A Ctrl-C, SIGTERM or SIGHUP that lands inside is answered when the block ends: a claim (the
    mkdir and the lock) or a publication (the rename and its bookkeeping) is never cut in half, so
    the clean-up always knows what this run made. (A handler runs between any two bytecodes: after
    os.mkdir returned but before the caller recorded it, the directory would be nobody's.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    old = {s: signal.signal(s, lambda n, f: caught.append(n)) for s in _SIGNALS}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        if caught:
            handler = old[caught[0]]
            if callable(handler):
                handler(caught[0], None)
            elif handler != signal.SIG_IGN:
                os.kill(os.getpid(), caught[0])
