"""The explicit list of commands (one line each)."""

from .demo import demo

ALL = [demo]
