"""The environment variables the tool reads, each named and parsed strictly here. A bad value is a
usage error that names the variable (`env.bad_value`), raised by check_environment() before any
import that would read it first (numba reads NUMBA_NUM_THREADS when it is imported) and before any
work. DSV4_CONVERT_PROFILE is a path: runtime/profiling.py guards it like every side file."""

from __future__ import annotations

import os

from dsv4_convert.core.errors import UsageError

__all__ = ["DIRECT_IO_ENV", "TORCH_ROUTE_ENV", "NUMBA_THREADS_ENV", "env_flag", "check_environment"]

DIRECT_IO_ENV = "DSV4_CONVERT_DIRECT_IO"  # 0: write through the page cache (default 1: O_DIRECT where it works)
TORCH_ROUTE_ENV = "DSV4_CONVERT_TORCH_ROUTE"  # 1: every projection takes the torch route (default 0)
NUMBA_THREADS_ENV = "NUMBA_NUM_THREADS"  # numba's own: the threads its kernels may use
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def env_flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    value = raw.strip().lower()
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    raise UsageError(f"{name}={raw!r} is not a switch", error_id="env.bad_value", file=name,
                     hint=f"set {name} to 1 or 0, or unset it")


def _positive_int(name: str) -> None:
    raw = os.environ.get(name)
    if raw is None:
        return
    try:
        ok = int(raw.strip()) >= 1
    except ValueError:
        ok = False
    if not ok:
        raise UsageError(f"{name}={raw!r} is not a thread count", error_id="env.bad_value", file=name,
                         hint=f"set {name} to a whole number of at least 1, or unset it")


def check_environment() -> None:
    """Every setting above, parsed once at start-up: a bad one fails here, typed, and not later."""
    env_flag(DIRECT_IO_ENV, True)
    env_flag(TORCH_ROUTE_ENV, False)
    _positive_int(NUMBA_THREADS_ENV)
