"""`nvfp4-to-marlin`, `mxfp4-to-marlin`: the main job. Thin: check flags, plan, run, report."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import click

from dsv4_convert.cli.options import (
    device_option,
    executor_options,
    parse_size,
    run_options,
    target_options,
    use_device,
)
from dsv4_convert.core.errors import ContentError, UsageError
from dsv4_convert.core.reader import open_checkpoint
from dsv4_convert.core.tensor_model import Quant
from dsv4_convert.executors import refuse_device
from dsv4_convert.formats.marlin import MarlinTarget
from dsv4_convert.pipeline import run_conversion
from dsv4_convert.plan import build_plan, refuse_converted
from dsv4_convert.staging import Staging

__all__ = ["nvfp4_to_marlin", "mxfp4_to_marlin"]

_COMMAND_FOR = {Quant.NVFP4: "nvfp4-to-marlin", Quant.MXFP4: "mxfp4-to-marlin"}

EXAMPLES = """

\b
Examples:
  dsv4-convert {cmd} ./DeepSeek-V4-Flash{suffix} ./dsv4-marlin
  dsv4-convert {cmd} {repo} ./dsv4-marlin --target vllm --workers 8
  dsv4-convert {cmd} IN OUT --dry-run          # what would be written, and how big
  dsv4-convert {cmd} IN OUT --resume           # after an interruption
"""


def _run(quant: Quant, src, out, target, act_dtype, w4a8, workers, max_shard_size, resume, force, dry_run,
         as_json, quiet, executor, device=None):
    refuse_device(executor, device)
    workers = use_device(device, workers)  # refuses (exit 2) before anything is read or written
    if (resume or force) and dry_run:
        raise UsageError("--dry-run writes nothing; it cannot be combined with --resume/--force",
                         error_id="usage.flags")
    try:
        tgt = MarlinTarget(engine=target, act_dtype=act_dtype, w4a8=w4a8)
    except ValueError as e:
        raise UsageError(str(e), error_id="usage.target") from None
    ckpt = open_checkpoint(src)
    refuse_converted(ckpt)
    found = ckpt.routed_quant
    if found is None:
        raise ContentError(f"no FP4 expert projections found in {ckpt.root} (detected {ckpt.format.value})",
                           error_id="convert.no_projections", hint="run `dsv4-convert inspect` on it")
    if found is not quant:
        raise ContentError(f"{ckpt.root} holds {found.value.upper()} experts ({ckpt.format.value})",
                           error_id="convert.wrong_command", hint=f"use `dsv4-convert {_COMMAND_FOR[found]}`")
    if out is not None and not dry_run:  # every path refusal before any work (convert/paths.py)
        Staging(Path(out), force=force, resume=resume, source=ckpt.root).check()
    plan = build_plan(ckpt, tgt, max_shard_size=parse_size(max_shard_size),
                      options={"command": _COMMAND_FOR[quant]})
    if dry_run:
        _print_plan(plan, as_json)
        return
    result = run_conversion(plan, Path(out), workers=workers, resume=resume, force=force, progress=not quiet,
                            executor=executor)
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
    elif not quiet:
        rate = result.bytes_out / max(result.seconds, 1e-9) / 2**20
        reused = f", {result.shards_reused} reused from the interrupted run" if result.shards_reused else ""
        click.echo(f"converted {result.projections} projections into {result.shards} shards{reused} "
                   f"({result.bytes_out / 2**30:.2f} GiB, {tgt.layout_tag}) in {result.seconds:.1f} s "
                   f"({rate:.0f} MiB/s) -> {result.out}")
        if result.lost_scales:
            click.echo(f"warning: {result.lost_scales} NVFP4 scale bytes are negative or too small for "
                       f"{tgt.layout_tag} and were zeroed/made positive as the engine would; the originals are "
                       "recorded for marlin-to-source. Run validate to see where.", err=True)
        click.echo(f"next: dsv4-convert validate {result.out} --against {src}")


def _print_plan(plan, as_json: bool) -> None:
    ckpt = plan.checkpoint
    by_quant = Counter(p.quant.value for p in plan.projections)
    summary = {
        "source": str(ckpt.root), "source_format": ckpt.format.value, "marlin_layout": plan.target.layout_tag,
        "act_dtype": plan.target.act_dtype, "w4a8": plan.target.w4a8, "projections": dict(by_quant),
        "tensors_in": len(ckpt.tensors), "tensors_out": sum(len(s.tensors) for s in plan.shards),
        "shards": [{"file": s.file, "tensors": len(s.tensors), "bytes": s.nbytes} for s in plan.shards],
        "bytes_in": sum(t.nbytes for t in ckpt.tensors.values()), "bytes_out": plan.output_bytes,
        "rescale_pass": plan.needs_rescale,
    }
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo(f"source      {summary['source']} ({summary['source_format']})")
    click.echo(f"target      {summary['marlin_layout']}, {summary['act_dtype']}{' W4A8' if plan.target.w4a8 else ''}")
    click.echo(f"projections {', '.join(f'{n} {q}' for q, n in by_quant.items())}")
    click.echo(f"tensors     {summary['tensors_in']} in -> {summary['tensors_out']} out, "
               f"{len(plan.shards)} shards")
    click.echo(f"bytes       {summary['bytes_in'] / 2**30:.3f} GiB in -> {summary['bytes_out'] / 2**30:.3f} GiB out")
    if plan.needs_rescale:
        click.echo("rescale     a planning pass reads the NVFP4 scales to pick vLLM's factor per layer stack")
    click.echo("(dry run: nothing written)")


def _command(quant: Quant, name: str, suffix: str, repo: str, doc: str):
    @click.command(name, help=doc + EXAMPLES.format(cmd=name, suffix=suffix, repo=repo))
    @click.argument("src", metavar="IN")
    @click.argument("out", metavar="OUT", required=False)
    @target_options
    @run_options
    @device_option
    @executor_options
    def command(src, out, target, act_dtype, workers, max_shard_size, resume, force, dry_run, as_json, quiet,
                device, executor, w4a8=False):
        if out is None and not dry_run:
            raise click.UsageError("missing argument OUT (only --dry-run can do without it)")
        _run(quant, src, out, target, act_dtype, w4a8, workers, max_shard_size, resume, force, dry_run,
             as_json, quiet, executor, device)
    return command


nvfp4_to_marlin = _command(Quant.NVFP4, "nvfp4-to-marlin", "-NVFP4", "nvidia/DeepSeek-V4-Flash-NVFP4", """Repack NVFP4 experts into Marlin tile order.

IN is a checkpoint directory (or a Hugging Face repo id) in ModelOpt NVFP4 (DeepSeek-V4 or generic
names) or compressed-tensors nvfp4-pack-quantized form. OUT is written atomically: it appears only
when complete. Everything that is not an FP4 expert is copied byte for byte. MXFP4 MTP experts of a
DeepSeek-V4 NVFP4 checkpoint are packed as MXFP4.""")

mxfp4_to_marlin = click.option(
    "--w4a8", is_flag=True, help="vLLM's W4A8 layout (MXFP4 weights, FP8 activations; needs --target vllm).",
)(_command(Quant.MXFP4, "mxfp4-to-marlin", "", "deepseek-ai/DeepSeek-V4-Flash", """Repack MXFP4 experts into Marlin tile order.

IN is a DeepSeek-V4 native checkpoint (MXFP4 experts, FP8 elsewhere) or compressed-tensors
mxfp4-pack-quantized. MXFP4 Marlin runs with bfloat16 activations only. OUT is written atomically.
Everything that is not an FP4 expert is copied byte for byte."""))
