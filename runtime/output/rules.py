"""Path safety for every command that writes (converters, marlin-to-source, synth), asked by the output
tree (runtime/output/tree.py) before any work and again before publishing.

The input is sacred, through every alias: both paths are resolved (symlinks, `..`) and also compared
by (device, inode), so a bind mount or a second symlink to the same directory is caught too. A
directory is only ever replaced or deleted when this tool can show it wrote it: it is empty, or it
holds one of our records (converter manifest, marker, synth.json) and nothing the record does not
list."""

from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import stat
from pathlib import Path, PurePosixPath

from ...core.checkpoint.small_files import read_small
from ...core.errors import InputError, OutputError, UsageError
from ...core.files import (
    LOCK,
    MANIFEST,
    PROGRESS,
    RECORDS,
    REPLACED,
    RESTORED_XATTR,
    STAGING_SUFFIX,
    SYNTH_MANIFEST,
    reserved_input_names,
    staging_entry_ok,
)

__all__ = ["out_path", "staging_path", "check_aliasing", "check_replaceable", "mark_restored", "recorded_files",
           "unlisted_entries", "refuse_reserved_names", "partial_not_ours_error", "plain_file", "replaced_leftovers",
           "refuse_foreign", "read_json"]


def out_path(out) -> Path:
    """OUT with its parent resolved and its own name kept: OUT itself must not be a symlink (checked
    in check_replaceable), so the path we publish to is the path the user named. Undecodable bytes
    in the name are refused here, before any work."""
    raw = os.fsencode(str(out))
    try:
        raw.decode("utf-8")
        text = str(out)
        text.encode("utf-8")
    except UnicodeError:
        raise UsageError(f"OUT {os.fsdecode(raw)!r} is not valid UTF-8", error_id="paths.not_utf8",
                         file=repr(out), hint="choose an OUT whose name is plain UTF-8 text") from None
    p = Path(out).expanduser()
    if p.name in ("", ".", ".."):
        p = p.resolve()
    if p.name == "":  # "/", "/..": no parent to stage beside, nothing a run may replace
        raise UsageError(f"OUT {out} is the filesystem root; a checkpoint is written into a new directory",
                         error_id="paths.out_is_root", file=str(out),
                         hint="name a new directory, e.g. /models/dsv4-marlin")
    name_max = _name_max(p.parent)
    if len(os.fsencode(p.name)) + len(STAGING_SUFFIX) > name_max:
        raise UsageError(f"OUT's name is {len(os.fsencode(p.name))} bytes; with the staging suffix "
                         f"'{STAGING_SUFFIX}' it passes this filesystem's limit of {name_max}",
                         error_id="paths.name_too_long", file=str(p)[:200],
                         hint=f"choose an OUT name of at most {name_max - len(STAGING_SUFFIX)} bytes")
    return p.parent.resolve() / p.name


def staging_path(out: Path, suffix: str = STAGING_SUFFIX) -> Path:
    return out.with_name(out.name + suffix)


def _name_max(d: Path) -> int:
    while not d.exists() and d != d.parent:
        d = d.parent
    try:
        return os.pathconf(d, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def _ident(p: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(p)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _within(inner: Path, outer: Path) -> bool:
    """`inner` is `outer` or lies below it, by resolved name or by (device, inode) of an ancestor."""
    if inner == outer or inner.is_relative_to(outer):
        return True
    target = _ident(outer)
    if target is None:
        return False
    return any(_ident(a) == target for a in (inner, *inner.parents) if a.exists())


def check_aliasing(src: Path, out: Path, *, staging: Path | None = None) -> None:
    """Refuse every OUT whose writing could touch IN. `out` from out_path(); `src` any spelling."""
    src = Path(src).resolve()
    staging = staging or staging_path(out)
    fix = "choose an OUT outside IN (and IN outside OUT), e.g. a sibling directory"
    if src == out or _ident(src) is not None and _ident(src) == _ident(out):
        raise UsageError(f"OUT {out} is IN {src}: the input is never modified", error_id="usage.same_path",
                         file=str(src), hint=fix)
    if _within(src, out):
        raise UsageError(f"IN {src} lies inside OUT {out}: replacing OUT would delete the input",
                         error_id="paths.input_inside_output", file=str(src), hint=fix)
    if _within(src, staging):
        raise UsageError(f"IN {src} lies inside the staging directory {staging}: a new run would delete it",
                         error_id="paths.input_inside_staging", file=str(src),
                         hint=f"move IN out of {staging} first; it is this tool's scratch space")
    if _within(out, src) or _within(staging, src):
        raise UsageError(f"OUT {out} lies inside IN {src}: writing there would modify the input",
                         error_id="paths.output_inside_input", file=str(out), hint=fix)


def _listing(root: Path) -> tuple[list[str], str]:
    """Every entry under `root` (relative, sorted; the run's lock and progress record left out) and a
    digest of the entries with each file's size."""
    entries = sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                     if p.relative_to(root).as_posix() not in (LOCK, PROGRESS))
    h = hashlib.sha256()
    for e in entries:
        p = root / e
        size = p.stat(follow_symlinks=False).st_size if p.is_file() and not p.is_symlink() else -1
        h.update(f"{e}\0{size}\0".encode())
    return entries, h.hexdigest()


def mark_restored(root: Path) -> None:
    """marlin-to-source's "dsv4-convert wrote this directory", so that a later --force may replace it: an
    extended attribute of the directory holding a digest of its listing, never a file in it (the rebuilt
    checkpoint holds exactly the source's files). A file system without user attributes keeps no mark:
    --force then refuses the directory as any other it cannot recognise."""
    try:
        os.setxattr(root, RESTORED_XATTR, json.dumps({"producer": "dsv4-convert", "command": "marlin-to-source",
                                                      "listing": _listing(root)[1]}).encode())
    except (OSError, AttributeError):  # ENOTSUP, or a platform without os.setxattr
        pass


def _restored_files(out: Path) -> set[str] | None:
    """The entries of a marlin-to-source output whose listing is unchanged since it was written; a set that
    lists none of them when files were added, removed or resized; None without our mark."""
    try:
        mark = json.loads(os.getxattr(out, RESTORED_XATTR, follow_symlinks=False))
    except (OSError, AttributeError, ValueError, RecursionError):
        return None
    if not isinstance(mark, dict) or mark.get("producer") != "dsv4-convert":
        return None
    entries, digest = _listing(out)
    return set(entries) if mark.get("listing") == digest else {RESTORED_XATTR}


def recorded_files(out: Path) -> set[str]:
    """The files our record in `out` says we wrote (itself included); {"<none>"} when no record is ours."""
    if (restored := _restored_files(out)) is not None:
        return restored
    for name in RECORDS:
        rec = out / name
        if not rec.is_file() or rec.is_symlink():
            continue
        try:
            obj = json.loads(read_small(rec))
        except (OSError, ValueError, RecursionError):
            continue
        if not isinstance(obj, dict):
            continue
        if name == SYNTH_MANIFEST:
            if obj.get("generator") != "dsv4-convert synth":
                continue
            written = obj.get("written")  # every file synth wrote; a record without it itemises nothing
            return {name, *(w for w in written if isinstance(w, str))} if isinstance(written, list) else {name}
        producer = obj.get("producer") or {}
        if isinstance(producer, dict) and producer.get("name") == "dsv4-convert" and isinstance(obj.get("files"), dict):
            return set(obj["files"]) | {name}
        if isinstance(producer, dict) and producer.get("name") == "dsv4-convert" and "shards" in obj:
            return set()  # a manifest from before files were listed: recognised, not itemised
    return {"<none>"}


def check_replaceable(out: Path, *, force: bool, allow_empty: bool = False) -> None:
    """Before any work: may we publish to `out`? Refuses files, symlinks and directories we did not
    write; `--force` replaces only an empty directory or one of our outputs."""
    if not os.path.lexists(out):
        return
    if out.is_symlink():
        raise OutputError(f"OUT {out} is a symlink (to {os.readlink(out)}); it is never followed or replaced",
                          error_id="paths.out_symlink", file=str(out),
                          hint="give the real directory, or remove the link yourself")
    if not out.is_dir():
        raise OutputError(f"OUT {out} exists and is not a directory", error_id="paths.out_not_directory",
                          file=str(out), hint="choose another OUT, or remove that file yourself")
    try:
        entries = sorted(p.name for p in out.iterdir())
    except OSError as e:
        raise OutputError(f"cannot list OUT {out}: {e.strerror}", error_id="output.not_writable", file=str(out),
                          hint="choose a directory you can read and write") from None
    if not entries and (allow_empty or force):
        return
    if not force:
        raise OutputError(f"output {out} already exists", error_id="output.exists", file=str(out),
                          hint="choose another OUT, or pass --force to replace it (only after a complete run)")
    _refuse_locked(out)
    listed = recorded_files(out)
    if listed == {"<none>"}:
        raise OutputError(f"OUT {out} is not empty and was not written by dsv4-convert (no manifest or marker); "
                          "--force replaces only this tool's outputs", error_id="paths.not_our_output",
                          file=str(out), hint="choose another OUT, or empty or remove that directory yourself")
    if listed == {RESTORED_XATTR}:  # a marlin-to-source output whose files changed since: which, no record says
        raise OutputError(f"OUT {out} was written by marlin-to-source, but files were added, removed or resized in it "
                          "since; --force would delete them", error_id="paths.unlisted_files", file=str(out),
                          hint="move the files you added out of OUT, or choose another OUT")
    if listed:
        extra = unlisted_entries(out)
        if extra:
            raise OutputError(f"OUT {out} holds {len(extra)} files its dsv4-convert record does not list, e.g. "
                              f"{extra[0]}; --force would delete them", error_id="paths.unlisted_files",
                              file=str(out / extra[0]), hint="move those files out of OUT, or choose another OUT")


def _refuse_locked(d: Path) -> None:
    """A directory whose lock a run holds (a live run's OUT.partial) is never replaced, whatever it holds."""
    try:
        fd = os.open(d / LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return  # no lock file (or not a plain one): nothing holds this directory
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise OutputError(f"another dsv4-convert run holds the lock {d / LOCK}: it is writing {d}",
                          error_id="output.locked", file=str(d),
                          hint="wait for it to finish, or stop it; a directory in use is never replaced") from None
    finally:
        os.close(fd)


def unlisted_entries(root: Path) -> list[str]:
    """What `root` holds beyond its dsv4-convert record's list (the unlisted-files rule): files, links,
    and folders no listed file lies in. Everything, when no record of ours itemises its files."""
    listed = recorded_files(root)
    folders = {parent.as_posix() for name in listed for parent in PurePosixPath(name).parents}
    entries = sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))
    if not listed or listed == {"<none>"}:
        return entries or ["(no record)"]
    return [e for e in entries if e not in listed and not (e in folders and (root / e).is_dir()
                                                           and not (root / e).is_symlink())]


def refuse_reserved_names(root: Path, *, converted: bool = False) -> None:
    """Before anything is written: an input file named like one the tool writes (its lock, progress
    record, manifest, SERVING.md, a `.tmp`, ... core/files.py) would be overwritten or deleted by the
    tool's own, and the output published without it."""
    try:
        names = os.listdir(root)
    except OSError:
        return  # the reader reports an unreadable input
    clash = reserved_input_names(names, converted=converted)
    if clash:
        raise InputError(f"the input holds {root / clash[0]}, a name dsv4-convert reserves for its own files"
                         + (f" (and {len(clash) - 1} more: {', '.join(clash[1:4])})" if len(clash) > 1 else ""),
                         error_id="input.reserved_name", file=str(root / clash[0]),
                         hint="rename or move that file out of the input (docs/ERRORS.md lists the reserved "
                              "names); the tool would overwrite or delete it in the output")


def partial_not_ours_error(path: Path):
    def error(why: str, file: Path | None = None) -> OutputError:
        return OutputError(f"{path} exists but is not an interrupted run of this tool: {why}",
                           error_id="paths.partial_not_ours", file=str(file or path),
                           hint="move or remove it yourself, or choose another OUT; it is never deleted for you")
    return error


def plain_file(p) -> bool:
    """A regular file with one link (a path, not followed, or an open descriptor)."""
    try:
        st = os.fstat(p) if isinstance(p, int) else os.stat(p, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1


def replaced_leftovers(out: Path) -> list[Path]:
    """`OUT.replaced-*` beside OUT that publish made and a kill left: the holder with exactly OUT
    inside (or, from older versions, OUT renamed), holding our record and nothing it does not list.
    Anything else of that name is the user's: never reported, never deleted."""
    found = []
    for holder in sorted(out.parent.glob(glob.escape(out.name + REPLACED) + "*")):
        if holder.is_symlink() or not holder.is_dir():
            continue
        inner = holder / out.name
        try:
            nested = os.listdir(holder) == [out.name] and inner.is_dir() and not inner.is_symlink()
        except OSError:
            continue
        if not unlisted_entries(inner if nested else holder):
            found.append(holder)
    return found


def refuse_foreign(path: Path, source_names: set[str]) -> None:
    """An existing `path` (OUT.partial) is adopted (and what it holds deleted) only when this tool's own
    records prove it wrote it: its lock and progress record, and nothing but names a run writes there
    (`source_names`: the input's top-level names, which a run copies); or, killed inside publish, our
    manifest and nothing it does not list (the unlisted-files rule)."""
    names = {e.name for e in path.iterdir()}
    not_ours = partial_not_ours_error(path)
    lock = path / LOCK
    if LOCK in names and not plain_file(lock):
        raise not_ours(f"its lock {lock} is not a plain file this tool made (a link, a hard link or a special file)")
    if LOCK in names and (names <= {LOCK} or read_json(path / PROGRESS).get("fingerprint")):
        extra = sorted(n for n in names if not staging_entry_ok(n, source_names))
        if extra:
            raise not_ours(f"it holds {extra[0]!r}, which no run of this tool writes there", file=path / extra[0])
        return
    if read_json(path / MANIFEST).get("producer", {}).get("name") == "dsv4-convert":
        extra = unlisted_entries(path)  # killed inside publish: lock and progress gone, manifest written last
        if not extra:
            return
        raise not_ours(f"it holds {extra[0]!r}, which its dsv4-convert manifest does not list", file=path / extra[0])
    raise not_ours("it holds no dsv4-convert lock and progress record; it is not an interrupted run of this tool")


def read_json(path: Path) -> dict:
    """A small JSON record as a dict; {} when it is missing, unreadable or not an object."""
    try:
        obj = json.loads(read_small(path))
    except (OSError, ValueError, RecursionError):
        return {}
    return obj if isinstance(obj, dict) else {}
