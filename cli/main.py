"""The `dsv4-convert` command tree, and the one place that turns every error into its exit code, its
text on stderr and, with `--json`, its JSON object on stdout (schema in docs/ERRORS.md)."""

from __future__ import annotations

import signal
import sys

# The error object of docs/ERRORS.md, spelled out: this handler may run in the middle of an import,
# where importing json could block on the import lock.
_EARLY_JSON = (b'{"error": {"id": "cli.interrupted", "message": "interrupted", "file": null, "tensor": null, '
               b'"fix": null}, "exit_code": 130}\n')


def _early_interrupt(signum, frame):
    """Ctrl-C / SIGTERM / SIGHUP while the imports still run (main() keeps this handler until the
    command modules, torch and numba included, are imported): nothing is written yet, so leave at
    once. Raising KeyboardInterrupt there instead can land inside torch's C++ start-up, which then
    aborts (`terminate called after throwing pybind11::error_already_set`)."""
    import os
    os.write(2, b"interrupted\n")
    if "--json" in sys.argv[1:]:
        os.write(1, _EARLY_JSON)
    os._exit(130)


for _sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(_sig, _early_interrupt)

import errno  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402

# numpy's OpenBLAS starts a thread per core when numpy is imported, and each spins before it sleeps: on
# the 16-core GPU box `inspect` took 3.5 CPU seconds for 1.6 s of wall (docs/PERFORMANCE.md). No command
# multiplies matrices with numpy (torch has its own threads), so one BLAS thread, unless the user says.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import click  # noqa: E402

from ..core.errors import DsvError, Interrupted, OutputError, UsageError  # noqa: E402
from ..core.version import __version__  # noqa: E402
from ..runtime import settings  # noqa: E402
from ..runtime.cpu_budget import bound_library_threads  # noqa: E402
from . import commands  # noqa: E402
from .command_paths import guard_command_line, parsed_params  # noqa: E402
from .report import write_report  # noqa: E402

__all__ = ["cli", "main", "error_object"]

HELP = """Get 4-bit MoE checkpoints (MXFP4 / NVFP4) ready to serve on Blackwell workstation GPUs (sm_120).

It repacks the expert weights offline into the Marlin W4A16 tile order that SGLang and vLLM would
otherwise build at every start-up, byte for byte, and checks the result before you launch.

\b
Typical session:
  dsv4-convert inspect ./DeepSeek-V4-Flash-NVFP4
  dsv4-convert nvfp4-to-marlin ./DeepSeek-V4-Flash-NVFP4 ./dsv4-marlin --target sglang
  dsv4-convert validate ./dsv4-marlin --against ./DeepSeek-V4-Flash-NVFP4

Exit codes: 0 ok, 2 usage, 3 input, 4 content, 5 output, 130 interrupted (Ctrl-C, SIGTERM, SIGHUP);
validate and plan: 0 clean, 1 findings, 2 unusable. `--json` prints one JSON object on every exit.
Set DSV4_DEBUG=1 to see tracebacks.
"""


class _LazyGroup(click.Group):
    """The commands of commands.ALL, in workflow order; a command's module is imported only when that
    command is asked for, so `--help`, `--version` and a mistyped name import none of them."""

    def list_commands(self, ctx):
        return list(commands.NAMES)

    def get_command(self, ctx, name):
        if name not in self.commands and name in commands.NAMES:
            self.add_command(commands.load(name))
        return self.commands.get(name)

    def format_commands(self, ctx, formatter):
        with formatter.section("Commands"):
            formatter.write_dl(commands.SUMMARIES)

    def resolve_command(self, ctx, args):
        name = click.utils.make_str(args[0])
        if name not in commands.NAMES and not ctx.resilient_parsing and not name.startswith("-"):
            raise click.exceptions.NoSuchCommand(name, possibilities=commands.NAMES, ctx=ctx)
        return super().resolve_command(ctx, args)


@click.group(cls=_LazyGroup, help=HELP, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="dsv4-convert")
def cli():
    pass


def _register(args: list[str]):
    """Import the module of the command being run (only that one: cli/commands.py)."""
    name = next((a for a in args if not a.startswith("-")), None)
    if name is not None:
        cli.get_command(None, name)


_RUN_AGAIN = "run the same command again (an interrupted run leaves no partial output)"
_params: dict = {}  # the command's parsed parameters (cli/command_paths.py), for the error path
_signalled: list[int] = []  # signals received: whatever an interrupted import then raises is the interrupt


def _interrupt(signum, frame):
    _signalled.append(signum)
    raise KeyboardInterrupt


def from_os_error(e: OSError) -> DsvError:
    """An OSError nothing else mapped (a report file, synth's output, ...) as a typed error."""
    where = e.filename if isinstance(e.filename, str) else None
    if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return OutputError(f"no space left writing {where or 'the output'} ({e.strerror})",
                           error_id="output.disk_full", file=where, hint="free some space, or write elsewhere")
    if e.errno == errno.ENAMETOOLONG:
        return UsageError(f"a path is too long for the filesystem: {(where or '')[:120]}...",
                          error_id="paths.name_too_long", file=where, hint="choose a shorter path")
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return OutputError(f"cannot write {where or 'the output'}: {e.strerror}", error_id="output.not_writable",
                           file=where, hint="choose a location you can write (not a read-only filesystem)")
    return OutputError(f"I/O error on {where or 'a file'}: {e.strerror or e}", error_id="output.io_error",
                       file=where, hint="check the path, the disk and the permissions")


def error_object(e: DsvError, exit_code: int) -> dict:
    """The JSON form of a failure (docs/ERRORS.md, "JSON on every exit path")."""
    return {"error": {"id": e.error_id, "message": e.message, "file": e.file, "tensor": e.tensor, "fix": e.hint},
            "exit_code": exit_code}


def _fail(e: DsvError, argv: list[str], exit_code: int | None = None, *, unexpected: bool = False):
    """Print `e`, answer --json / --report, exit. `unexpected`: an error nothing in the tool foresaw
    (an OSError no layer mapped), the only kind whose traceback (DSV4_DEBUG=1) can tell more; a typed
    refusal says all it knows."""
    if isinstance(e, Interrupted):  # answered: a later signal must not turn exit 130 into death by signal
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
    code = e.exit_code if exit_code is None else exit_code
    if argv[:1] in (["validate"], ["plan"], ["doctor"]) and code not in (1, 2, 130):
        code = 2  # the report commands' documented classes: 0 clean, 1 findings, 2 unusable
    click.echo(e.render(), err=True)
    if unexpected:
        click.echo("  (set DSV4_DEBUG=1 for the traceback)", err=True)
    _answer(error_object(e, code), argv, to_report=not e.error_id.startswith("report."))
    sys.exit(code)


def _answer(doc: dict, argv: list[str], to_report: bool = True) -> None:
    """An error object to --report FILE and, with --json, to stdout (one object, always)."""
    report = _params.get("report_file")
    if report and to_report:
        try:
            write_report(report, doc)
        except DsvError as report_error:  # the run's own error stays the answer; say the file is missing
            click.echo(report_error.render(), err=True)
    if "--json" in argv:
        click.echo(json.dumps(doc, indent=2))


def _debug() -> bool:
    """DSV4_DEBUG as parsed at start-up (off when the environment itself was the error)."""
    try:
        return settings.settings().debug
    except DsvError:
        return False


def main(argv=None):
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        bound_library_threads()  # the CPUs given, before torch / numba read their thread counts (cpu_budget.py)
        settings.load()  # every variable, once; before numba's import reads NUMBA_NUM_THREADS
        _register(args)  # the heavy imports, under _early_interrupt
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, _interrupt)
        _params.clear()
        _params.update(parsed_params(cli, args))
        if not {"--help", "-h"} & set(args):
            guard_command_line(_params)
        cli.main(args=args, prog_name="dsv4-convert", standalone_mode=False)
    except DsvError as e:
        if _debug():
            raise
        _fail(e, args)
    except (click.exceptions.Abort, KeyboardInterrupt):
        _fail(Interrupted("interrupted", error_id="cli.interrupted", hint=_RUN_AGAIN), args)
    except click.ClickException as e:
        e.show()
        _answer(error_object(UsageError(e.format_message(), error_id="usage.flags"), e.exit_code), args)
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except OSError as e:
        if _debug():
            raise
        _fail(from_os_error(e), args, unexpected=True)
    except SystemExit:
        raise
    except BaseException:
        # an interrupt that lands inside an import (numba, numpy) can surface as another exception
        # (a half-initialised module, a RecursionError): it is still the interrupt, not a bug
        if not _signalled or _debug():
            raise
        _fail(Interrupted("interrupted", error_id="cli.interrupted", hint=_RUN_AGAIN), args)
