"""Typed errors. The library raises them with where/what/fix; only the CLI prints them and picks
the exit code. Exit codes are by class, so scripts can tell the cases apart:

    2  usage       bad flags or flag combinations (click also uses 2)
    3  input       the input cannot be read: missing files, corrupt headers, truncated shards
    4  content     the input reads fine but is not what the command needs (wrong format, bad values)
    5  output      the output cannot be written: exists, not writable, disk full, locked
    130 interrupted (Ctrl-C); nothing that looks complete is left behind
"""

from __future__ import annotations

__all__ = [
    "DsvError", "UsageError", "InputError", "ContentError", "OutputError", "Interrupted",
]


class DsvError(Exception):
    """Base error: `error_id` is stable (docs/ERRORS.md), `tensor`/`file` say where, `hint` says what to do."""

    exit_code = 1

    def __init__(self, message: str, *, error_id: str, tensor: str | None = None,
                 file: str | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.error_id = error_id
        self.tensor = tensor
        self.file = file
        self.hint = hint

    def __reduce__(self):  # survive the trip back from a worker process
        return (_rebuild, (type(self), self.message, self.error_id, self.tensor, self.file, self.hint))

    def render(self) -> str:
        where = " ".join(x for x in (self.tensor, f"({self.file})" if self.file else None) if x)
        lines = [f"error[{self.error_id}]" + (f" {where}" if where else "")]
        lines.append(f"  {self.message}")
        if self.hint:
            lines.append(f"  fix: {self.hint}")
        return "\n".join(lines)


class UsageError(DsvError):
    exit_code = 2


class InputError(DsvError):
    exit_code = 3


class ContentError(DsvError):
    exit_code = 4


class OutputError(DsvError):
    exit_code = 5


class Interrupted(DsvError):
    exit_code = 130


def _rebuild(cls, message, error_id, tensor, file, hint):
    return cls(message, error_id=error_id, tensor=tensor, file=file, hint=hint)
