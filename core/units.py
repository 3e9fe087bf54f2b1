"""Sizes, rates and counts as a person reads them: the one formatter every command's text output uses."""

from __future__ import annotations

__all__ = ["human_rate", "human_size", "plural"]

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def human_size(nbytes: float) -> str:
    """`nbytes` in the largest binary unit that keeps the number >= 1, with three significant digits:
    "512 B", "7.50 KiB", "12.3 MiB", "1.50 GiB" (never "0.00 GiB" for a small file)."""
    value, unit = float(nbytes), 0
    while abs(value) >= 1024 and unit < len(_UNITS) - 1:
        value, unit = value / 1024, unit + 1
    if unit == 0:
        return f"{int(value)} B"
    digits = 2 if abs(value) < 10 else 1 if abs(value) < 100 else 0
    return f"{value:.{digits}f} {_UNITS[unit]}"


def plural(n: int, noun: str) -> str:
    """"1 shard", "2 shards", "0 errors": `noun` is the singular and takes an "s" (every noun counted in
    the tool's messages does)."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def human_rate(nbytes: float, seconds: float) -> str:
    """Throughput in the same units per second; a run too short to time says so instead of dividing by ~0."""
    if seconds <= 0:
        return "too fast to time"
    return f"{human_size(nbytes / seconds)}/s"
