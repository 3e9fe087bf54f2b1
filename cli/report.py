"""The reporting vocabulary every command shares (docs/ERRORS.md, "JSON on every exit path"):

    --json         exactly one JSON object on stdout (the report, or the error); human text on stderr
    --report FILE  the same object written to FILE
    -q / --quiet   no progress bar and no status lines; errors, and the findings of a report command
                   (validate, plan, inspect, doctor: they are its result), still print
    --progress     the progress bar even when stderr is not a terminal (CI logs stay clean without it)
"""

from __future__ import annotations

import json
import math
import sys

import click

from ..runtime.side_files import write_side_file

__all__ = ["report_options", "progress_option", "show_progress", "emit", "write_report", "dumps"]


def _strict(obj):
    """RFC 8259 JSON has no NaN or Infinity (jq and most parsers refuse Python's literals): a
    non-finite value (a NaN global a finding names) is written as its name, a string."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "NaN" if math.isnan(obj) else ("Infinity" if obj > 0 else "-Infinity")
    if isinstance(obj, dict):
        return {k: _strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_strict(v) for v in obj]
    return obj


def dumps(doc: dict) -> str:
    return json.dumps(_strict(doc), indent=2, allow_nan=False)


def report_options(fn):
    for opt in reversed([
        click.option("--json", "as_json", is_flag=True,
                     help="Print exactly one JSON object on stdout (the report, or the error); text goes to stderr."),
        click.option("--report", "report_file", metavar="FILE", default=None,
                     help="Also write that JSON object to FILE (failures included)."),
        click.option("--quiet", "-q", is_flag=True, help="No progress bar and no status lines (findings and errors still print)."),
    ]):
        fn = opt(fn)
    return fn


def progress_option(fn):
    return click.option("--progress", "force_progress", is_flag=True,
                        help="Show the progress bar even when stderr is not a terminal.")(fn)


def show_progress(quiet: bool, force_progress: bool) -> bool:
    return force_progress or (not quiet and sys.stderr.isatty())


def write_report(path: str, doc: dict) -> None:
    """Write `doc` to `path` whole (runtime/side_files.py: never onto or into an input or OUT, never in
    place), or raise `report.not_writable` / `report.inside_checkpoint`."""
    data = (dumps(doc) + "\n").encode()
    write_side_file(path, "report", lambda f: f.write(data))


def emit(doc: dict, text: str | None, *, as_json: bool, report_file: str | None, quiet: bool,
         exit_code: int = 0) -> None:
    """The one way a command reports: the file first (so its failure is the one JSON object on stdout),
    then the JSON object, then the human text (stderr under --json; nothing under --quiet). Every object
    carries the command's `exit_code`, as the error objects do (cli/main.py)."""
    doc = {**doc, "exit_code": exit_code}
    if report_file:
        write_report(report_file, doc)
    if as_json:
        click.echo(dumps(doc))
    if text and not quiet:
        click.echo(text, err=as_json)
