"""The environment variables the tool reads: their one home. `load()` parses them all at start-up
(cli/main.py, before numba's import reads NUMBA_NUM_THREADS, and before any work); a bad value is a
usage error naming the variable (`env.bad_value`), never a ValueError later. Every reader asks
`settings()` (parsed on first use where no CLI started the process: the plugins, a Ray worker).
docs/ERRORS.md ("Environment") lists them. Test hooks are not read here nor anywhere in the
package: they live in tests/hooks/sitecustomize.py. Other projects' variables are theirs to parse
(HF_HUB_OFFLINE: core/checkpoint/source_location.py asks huggingface_hub's own reading of it)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..core.errors import UsageError

__all__ = ["Settings", "settings", "load", "DIRECT_IO_ENV", "TORCH_ROUTE_ENV", "NUMBA_THREADS_ENV", "DEBUG_ENV",
           "ALLOW_UNSERVABLE_ENV", "PROFILE_ENV", "MARKS_ENV", "MARLIN_MODULE_ENV", "RAY_ADDRESS_ENV"]

DIRECT_IO_ENV = "DSV4_CONVERT_DIRECT_IO"  # 0: write through the page cache (default 1: O_DIRECT where it works)
TORCH_ROUTE_ENV = "DSV4_CONVERT_TORCH_ROUTE"  # 1: every projection takes the torch route (default 0)
NUMBA_THREADS_ENV = "NUMBA_NUM_THREADS"  # numba's own: the threads its kernels may use
DEBUG_ENV = "DSV4_DEBUG"  # 1: an error ends in its traceback instead of the typed one-line answer
ALLOW_UNSERVABLE_ENV = "DSV4_CONVERT_ALLOW_UNSERVABLE"  # the converters' --allow-unservable
PROFILE_ENV = "DSV4_CONVERT_PROFILE"  # a directory: cProfile per job and the driver's phase marks
MARKS_ENV = "DSV4_CONVERT_MARKS"  # a directory: the driver's phase marks only (start-up, without cProfile's cost)
MARLIN_MODULE_ENV = "DSV4_MARLIN_MODULE"  # a built Marlin extension: validate's and doctor's kernel provider
RAY_ADDRESS_ENV = "RAY_ADDRESS"  # Ray's own: --executor ray's cluster when --ray-address is not given
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True)
class Settings:
    direct_io: bool = True
    torch_route: bool = False
    numba_threads: int | None = None
    debug: bool = False
    allow_unservable: bool = False
    profile: str | None = None
    marks: str | None = None
    marlin_module: str | None = None
    ray_address: str | None = None

    @classmethod
    def from_env(cls, env=None) -> Settings:
        env = os.environ if env is None else env
        return cls(direct_io=_switch(env, DIRECT_IO_ENV, True), torch_route=_switch(env, TORCH_ROUTE_ENV, False),
                   numba_threads=_count(env, NUMBA_THREADS_ENV), debug=_switch(env, DEBUG_ENV, False),
                   allow_unservable=_switch(env, ALLOW_UNSERVABLE_ENV, False),
                   profile=_text(env, PROFILE_ENV), marks=_text(env, MARKS_ENV),
                   marlin_module=_text(env, MARLIN_MODULE_ENV), ray_address=_text(env, RAY_ADDRESS_ENV))


_current: Settings | None = None


def load() -> Settings:
    """Parse every variable now (start-up) and keep the result for every later reader."""
    global _current
    _current = Settings.from_env()
    return _current


def settings() -> Settings:
    return _current if _current is not None else load()


def _bad(name: str, raw: str, what: str, values: str) -> UsageError:
    return UsageError(f"{name}={raw!r} is not {what}", error_id="env.bad_value", file=name,
                      hint=f"set {name} to {values}, or unset it")


def _switch(env, name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    value = raw.strip().lower()
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    raise _bad(name, raw, "a switch", "1 or 0")


def _count(env, name: str) -> int | None:
    raw = env.get(name)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = 0
    if value < 1:
        raise _bad(name, raw, "a thread count", "a whole number of at least 1")
    return value


def _text(env, name: str) -> str | None:
    return env.get(name) or None


def foreign(name: str) -> str | None:
    """Another program's variable (the CUDA toolkit's home, an engine's JIT cache) read as that program reads it,
    set and non-empty, else None: `doctor` reports what the engine will do with its own variables, which are
    none of the tool's settings (never parsed, never refused)."""
    return _text(os.environ, name)
