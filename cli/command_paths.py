"""The paths a command line names, taken from click's own parse of it (never by matching argv strings,
which `--report=FILE` escapes): the checkpoints the command reads or writes, and the side files
it will write beside them, which runtime/side_files.py keeps off those checkpoints."""

from __future__ import annotations

import click

from ..runtime.output import output_paths
from ..runtime.side_files import guard, protect, reset

__all__ = ["parsed_params", "guard_command_line"]

INPUT_PARAMS = ("src", "path", "against")  # the parameter names every command uses for them
SIDE_FILE_PARAMS = {"report_file": "report", "plot_file": "plot"}


def parsed_params(group: click.Group, args: list[str]) -> dict:
    """The subcommand's parameters as click parses them; {} when there is no such command. Resilient:
    a command line click will refuse still yields the values it holds (the error path writes the
    report too, and must guard it just the same)."""
    name = next((a for a in args if not a.startswith("-")), None)
    command = group.commands.get(name) if name else None
    if command is None:
        return {}
    try:
        ctx = command.make_context(name, args[args.index(name) + 1:], resilient_parsing=True,
                                   ignore_unknown_options=True)
    except (click.exceptions.ClickException, click.exceptions.Exit):
        return {}
    return dict(ctx.params)


def guard_command_line(params: dict) -> None:
    """Protect every checkpoint named (and OUT's staging directory), then check each side file, before
    any work: a refusal here costs nothing."""
    reset()
    out = params.get("out")
    protect([params.get(p) for p in INPUT_PARAMS], outputs=output_paths(out) if out else ())
    for param, kind in SIDE_FILE_PARAMS.items():
        if params.get(param):
            guard(params[param], kind)
