"""`marlin-to-source`: give back the original checkpoint, byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

import click

from dsv4_convert.cli.options import executor_options
from dsv4_convert.reverse import reverse_checkpoint

__all__ = ["marlin_to_source"]


@click.command("marlin-to-source", help="""Rebuild the original checkpoint from a converted one, byte for byte.

IN is a directory written by nvfp4-to-marlin / mxfp4-to-marlin. Every shard, config file and index
comes back identical to the input of that conversion (the converter kept what it replaced in
IN/dsv4-convert-source/, including any scale bytes the target had to clamp). OUT is written atomically.

\b
Example:
  dsv4-convert marlin-to-source ./dsv4-marlin ./DeepSeek-V4-Flash-NVFP4-again
""")
@click.argument("src", metavar="IN")
@click.argument("out", metavar="OUT")
@click.option("--workers", type=click.IntRange(1), default=None, show_default="number of cores",
              help="Processes rebuilding shards in parallel (small inputs run in one process).")
@click.option("--force", is_flag=True, help="Replace an existing OUT (published only when complete).")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary on stdout.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar, only errors.")
@executor_options
def marlin_to_source(src, out, workers, force, as_json, quiet, executor):
    result = reverse_checkpoint(src, Path(out), workers=workers, force=force, progress=not quiet, executor=executor)
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
    elif not quiet:
        extra = (f"; {result.restored_scales} scale bytes the target had clamped were restored from the record"
                 if result.restored_scales else "")
        click.echo(f"restored {result.shards} shards ({result.projections} projections) in {result.seconds:.1f} s "
                   f"-> {result.out}{extra}")
