"""The `dsv4-convert` command tree: wiring only. Each command lives in its own module."""

from __future__ import annotations

import os
import sys

import click

from dsv4_convert import __version__
from dsv4_convert.core.errors import DsvError

__all__ = ["cli", "main"]

HELP = """Get 4-bit MoE checkpoints (MXFP4 / NVFP4) ready to serve on Blackwell workstation GPUs (sm_120).

It repacks the expert weights offline into the Marlin W4A16 tile order that SGLang and vLLM would
otherwise build at every start-up, byte for byte, and checks the result before you launch.

\b
Typical session:
  dsv4-convert inspect ./DeepSeek-V4-Flash-NVFP4
  dsv4-convert nvfp4-to-marlin ./DeepSeek-V4-Flash-NVFP4 ./dsv4-marlin --target sglang
  dsv4-convert validate ./dsv4-marlin --against ./DeepSeek-V4-Flash-NVFP4

Set DSV4_DEBUG=1 to see tracebacks.
"""


class _OrderedGroup(click.Group):
    """List commands in workflow order (commands.ALL), not alphabetically."""

    def list_commands(self, ctx):
        return list(self.commands)


@click.group(cls=_OrderedGroup, help=HELP, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="dsv4-convert")
def cli():
    pass


def _register():
    # Explicit list: one import per command module, nothing registers itself.
    from dsv4_convert.cli import commands

    for command in commands.ALL:
        cli.add_command(command)


def main(argv=None):
    _register()
    try:
        cli.main(args=argv, prog_name="dsv4-convert", standalone_mode=False)
    except DsvError as e:
        if os.environ.get("DSV4_DEBUG"):
            raise
        click.echo(e.render(), err=True)
        click.echo("  (set DSV4_DEBUG=1 for the traceback)", err=True)
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
