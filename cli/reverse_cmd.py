"""`marlin-to-source`: give back the original checkpoint, byte for byte."""

from __future__ import annotations

from pathlib import Path

import click

from ..convert.reverse import reverse_checkpoint
from ..core.units import plural
from .options import executor_options
from .report import emit, progress_option, report_options, show_progress

__all__ = ["marlin_to_source"]


@click.command("marlin-to-source", help="""Rebuild the original checkpoint from a converted one, byte for byte.

IN is a directory written by nvfp4-to-marlin / mxfp4-to-marlin. Every shard, config file and index
comes back identical to the input of that conversion (the converter kept what it replaced in
IN/dsv4-convert-source/, including any scale bytes the target had to clamp). OUT is written atomically.

\b
Example:
  dsv4-convert marlin-to-source ./dsv4-marlin ./DeepSeek-V4-Flash-NVFP4-again

\b
Exit codes: 0 restored, 2 usage error, 3 unreadable input, 4 not a converted checkpoint or its
manifest does not verify, 5 output cannot be written, 130 interrupted (Ctrl-C, SIGTERM, SIGHUP).
""")
@click.argument("src", metavar="IN")
@click.argument("out", metavar="OUT")
@click.option("--workers", type=click.IntRange(1), default=None, show_default="number of cores",
              help="Processes rebuilding shards in parallel (small inputs run in one process).")
@click.option("--force", is_flag=True, help="Replace an existing OUT (published only when complete).")
@report_options
@progress_option
@executor_options
def marlin_to_source(src, out, workers, force, as_json, report_file, quiet, force_progress, executor):
    result = reverse_checkpoint(src, Path(out), workers=workers, force=force,
                                progress=show_progress(quiet, force_progress), executor=executor)
    extra = (f"; {result.restored_scales} scale bytes the target had clamped were restored from the record"
             if result.restored_scales else "")
    emit(result.as_dict(), f"restored {plural(result.shards, 'shard')} ({plural(result.projections, 'projection')}) in "
         f"{result.seconds:.1f} s -> {result.out}{extra}", as_json=as_json, report_file=report_file, quiet=quiet)
