"""The reporting vocabulary every command shares (docs/ERRORS.md, "JSON on every exit path"):

    --json         exactly one JSON object on stdout (the report, or the error); human text on stderr
    --report FILE  the same object written to FILE
    -q / --quiet   no progress bar and no status lines; errors, and the findings of a report command
                   (validate, plan, inspect, doctor: they are its result), still print
    --progress     the progress bar even when stderr is not a terminal (CI logs stay clean without it)
"""

from __future__ import annotations

import json
import sys

import click

from dsv4_convert.core.errors import OutputError

__all__ = ["report_options", "progress_option", "show_progress", "emit", "write_report", "report_path"]


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
    """Write `doc` to `path` whole, or raise `report.not_writable` (the input and OUT are never touched)."""
    try:
        with open(path, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
    except OSError as e:
        raise OutputError(f"cannot write the report {path}: {e.strerror or e}", error_id="report.not_writable",
                          file=path, hint="choose a --report FILE on a writable disk with free space") from None


def emit(doc: dict, text: str | None, *, as_json: bool, report_file: str | None, quiet: bool) -> None:
    """The one way a command reports: the file first (so its failure is the one JSON object on stdout),
    then the JSON object, then the human text (stderr under --json; nothing under --quiet)."""
    if report_file:
        write_report(report_file, doc)
    if as_json:
        click.echo(json.dumps(doc, indent=2))
    if text and not quiet:
        click.echo(text, err=as_json)


def report_path(argv: list[str]) -> str | None:
    """--report FILE as given on the command line (main() writes the error object there too)."""
    for i, arg in enumerate(argv):
        if arg == "--report" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--report="):
            return arg.split("=", 1)[1]
    return None
