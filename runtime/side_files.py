"""Files the tool writes beside its checkpoints: `--report FILE`, `validate --plot FILE` and the
DSV4_CONVERT_PROFILE directory. One rule for all of them (docs/ERRORS.md, "Side files"):

- the path is resolved (symlinks, `..`) and refused when it is, or lies inside, a protected path:
  every input the command names (IN, `--against`, a Hub repo's cache folder, and the blob folders a
  snapshot's symlinks lead to) and its outputs (OUT, OUT.partial). "Is" and "inside" are decided by
  name and by (device, inode), so a hard link to an input shard, a bind mount or a second symlink
  are caught as well;
- only a regular file (or a new name) is written: a FIFO or a device is refused before it can block;
- the bytes go to a temporary file in the same directory that is then renamed over the name, never
  written in place, so a file sharing its inode with something else is never truncated.

The protected set is filled once per process from the parsed command line (cli/main.py) and by the
converter with the resolved IN; a forked worker inherits it."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

from ..core.errors import OutputError, UsageError
from .output.names import inside_staging

__all__ = ["protect", "reset", "guard", "write_side_file", "FLAGS"]

FLAGS = {"report": "--report", "plot": "--plot", "profile": "DSV4_CONVERT_PROFILE"}
_WALK_LIMIT = 100_000  # entries per protected tree; past it only name and ancestor checks apply

_FILE_SUFFIXES = (".safetensors", ".json")  # an input named so is a file of a checkpoint folder, there or not
_dirs: set[Path] = set()
_idents: set[tuple[int, int]] = set()


def _ident(p: str | Path) -> tuple[int, int] | None:
    try:
        st = os.stat(p)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def _add_dir(d: Path) -> None:
    for spelling in {d, Path(os.path.realpath(d))}:
        _dirs.add(spelling)
    if (i := _ident(d)) is not None:
        _idents.add(i)


def reset() -> None:
    """Forget the protected set (one process may run several command lines: tests/reliability/cli_batch.py)."""
    _dirs.clear()
    _idents.clear()


def protect(paths: Iterable[str | os.PathLike | None], *, outputs: Iterable[str | os.PathLike | None] = ()) -> None:
    """Add the inputs (a directory, a file in one, a Hub repo id) and the outputs (OUT, OUT.partial,
    as named: they may not exist yet). An input spelled as a file (`DIR/model.safetensors`) names its
    folder whether or not the file exists: the command may still read that folder, or fail on it."""
    for raw, output in [*((p, False) for p in paths), *((p, True) for p in outputs)]:
        if raw is None or str(raw) == "":
            continue
        # imported here: --help and --version protect nothing and import no numpy
        from ..core.checkpoint.source_location import hub_cache_dir

        hub = None if output else hub_cache_dir(raw)
        given = Path(os.path.abspath(os.path.expanduser(os.fspath(raw))))
        as_file = not output and not given.is_dir() and (os.path.lexists(given) or given.suffix in _FILE_SUFFIXES)
        root = hub or (given.parent if as_file else given)
        _add_dir(root)
        if root.is_dir():
            _walk(root)


def _walk(root: Path) -> None:
    seen = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            seen += 1
            if seen > _WALK_LIMIT:
                return
            full = os.path.join(dirpath, name)
            if (i := _ident(full)) is not None:
                _idents.add(i)
            if os.path.islink(full):  # a snapshot's symlink: the blob folder it leads to is an input too
                target = Path(os.path.realpath(full))
                _add_dir(target if target.is_dir() else target.parent)


def _inside_protected(p: Path) -> bool:
    if any(p == d or p.is_relative_to(d) for d in _dirs):
        return True
    return any(_ident(a) in _idents for a in (p, *p.parents) if os.path.lexists(a))


def guard(path: str | os.PathLike, kind: str, *, directory: bool = False) -> Path:
    """The real path to write `kind`'s file (or, with `directory`, folder) at, or a typed error."""
    flag = FLAGS[kind]
    given = Path(os.path.abspath(os.path.expanduser(os.fspath(path))))
    real = Path(os.path.realpath(given))
    if any(_inside_protected(p) or inside_staging(p) for p in (given, real)):
        raise UsageError(f"{flag} {path} is, or lies inside, a checkpoint this command reads or writes "
                         f"(resolved: {real}); writing there would change it",
                         error_id=f"{kind}.inside_checkpoint", file=str(path),
                         hint=f"write the {kind} outside the input and output directories (e.g. next to them)")
    why = None
    if directory:
        if os.path.lexists(real) and not real.is_dir():
            why = "it exists and is not a directory"
    elif real.is_dir():
        why = "it is a directory"
    elif os.path.lexists(real) and not real.is_file():
        why = "it is not a regular file (a FIFO, device or socket would block or be replaced)"
    elif not real.parent.is_dir() or not os.access(real.parent, os.W_OK):
        why = "its directory does not exist or is not writable"
    if why:
        raise OutputError(f"cannot write the {kind} {path}: {why}", error_id=f"{kind}.not_writable",
                          file=str(path), hint=f"choose a {flag} path in an existing, writable directory")
    return real


def write_side_file(path: str | os.PathLike, kind: str, write: Callable[[BinaryIO], None]) -> Path:
    """Guard `path`, then write it whole through a temporary file and a rename; `write(f)` fills it."""
    real = guard(path, kind)
    tmp = real.with_name(f".dsv4-convert-{kind}.{os.getpid()}.{secrets.token_hex(4)}.tmp")  # short: NAME_MAX
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, real)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"cannot write the {kind} {path}: {e.strerror or e}", error_id=f"{kind}.not_writable",
                          file=str(path), hint=f"choose a {FLAGS[kind]} path on a writable disk with free space") \
            from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return real
