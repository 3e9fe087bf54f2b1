"""Path safety for every command that writes (converters, marlin-to-source, synth).

The input is sacred, through every alias: both paths are resolved (symlinks, `..`) and also compared
by (device, inode), so a bind mount or a second symlink to the same directory is caught too. A
directory is only ever replaced or deleted when this tool can show it wrote it: it is empty, or it
holds one of our records (converter manifest, marker, synth.json) and nothing the record does not
list."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

from dsv4_convert.core.errors import OutputError, UsageError
from dsv4_convert.core.files import RECORDS, STAGING_SUFFIX, SYNTH_MANIFEST

__all__ = ["out_path", "staging_path", "check_aliasing", "check_replaceable", "check_report_file"]

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


def _listed(out: Path) -> set[str] | None:
    """The files our record in `out` says we wrote (itself included), or None if no record is ours."""
    for name in RECORDS:
        rec = out / name
        if not rec.is_file() or rec.is_symlink():
            continue
        try:
            obj = json.loads(rec.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(obj, dict):
            continue
        if name == SYNTH_MANIFEST:
            if obj.get("generator") != "dsv4-convert synth":
                continue
            return None  # synth's record lists only shards: recognised, its other files are its own
        producer = obj.get("producer") or {}
        if isinstance(producer, dict) and producer.get("name") == "dsv4-convert" and isinstance(obj.get("files"), dict):
            return set(obj["files"]) | {name}
        if isinstance(producer, dict) and producer.get("name") == "dsv4-convert" and "shards" in obj:
            return set()  # a manifest from before files were listed: recognised, not itemised
    return {"<none>"}


def check_report_file(report: str, named: list[str]) -> None:
    """Before any work: `--report FILE` must be writable (its directory exists) and must not lie inside,
    or be, a checkpoint path named on the command line (`named`: the command's arguments), since the
    report would then add to or overwrite the input, or land in OUT as a file the manifest does not list."""
    path = Path(os.path.abspath(report))
    if path.is_dir() or not path.parent.is_dir() or not os.access(path.parent, os.W_OK):
        why = "is a directory" if path.is_dir() else "its directory does not exist or is not writable"
        raise OutputError(f"cannot write the report {report}: {why}", error_id="report.not_writable", file=report,
                          hint="choose a --report FILE in an existing, writable directory")
    for arg in named:
        given = Path(arg)
        if not arg or not given.exists() or (given.is_file() and _ident(given) != _ident(path)):
            continue
        if _within(path, Path(os.path.abspath(given)).resolve()) or _within(path.resolve(), given.resolve()):
            raise UsageError(f"--report {report} lies inside {arg}, a path this command reads or writes",
                             error_id="report.inside_checkpoint", file=report,
                             hint="write the report outside the checkpoint directories (e.g. next to them)")


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
    listed = _listed(out)
    if listed is None:
        return
    if listed == {"<none>"}:
        raise OutputError(f"OUT {out} is not empty and was not written by dsv4-convert (no manifest or marker); "
                          "--force replaces only this tool's outputs", error_id="paths.not_our_output",
                          file=str(out), hint="choose another OUT, or empty or remove that directory yourself")
    if listed:
        extra = [e for e in _walk(out) if e not in listed]
        if extra:
            raise OutputError(f"OUT {out} holds {len(extra)} files its dsv4-convert record does not list, e.g. "
                              f"{extra[0]}; --force would delete them", error_id="paths.unlisted_files",
                              file=str(out / extra[0]), hint="move those files out of OUT, or choose another OUT")


def _walk(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if not p.is_dir() or p.is_symlink())


def is_disk_full(e: OSError) -> bool:
    return e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
