"""`nvfp4-to-marlin`, `mxfp4-to-marlin`: the main job. Thin: check flags, plan, run, report."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import click

from ..convert.pipeline import run_conversion
from ..convert.plan import CONVERT_COMMAND, build_plan, check_servable, check_source
from ..core.checkpoint.reader import open_checkpoint
from ..core.checkpoint.tensor_model import Quant
from ..core.errors import UsageError
from ..core.record.converted_config import TpLayout
from ..core.sources.input_scales import invalid_input_scales
from ..core.sources.mtp import copied_mtp_layers
from ..core.targets.engines import ENGINES, shell_quote
from ..core.targets.inner_methods import stale_block
from ..core.targets.parallel_rules import split_dims, split_refusals
from ..core.targets.target import MarlinTarget
from ..core.units import human_rate, human_size, plural
from ..formats.tiles import PAD
from ..runtime.output import OutputTree
from ..runtime.settings import ALLOW_UNSERVABLE_ENV, settings
from .options import (
    W4A8_ENGINE,
    device_option,
    executor_options,
    parse_size,
    refuse_gpu_device,
    run_options,
    target_options,
)
from .report import emit, show_progress

__all__ = ["nvfp4_to_marlin", "mxfp4_to_marlin"]

EXAMPLES = """

\b
Examples:
  dsv4-convert {cmd} ./DeepSeek-V4-Flash{suffix} ./dsv4-marlin
  dsv4-convert {cmd} {repo} ./dsv4-marlin --target vllm --workers 8
  dsv4-convert {cmd} IN OUT --dry-run          # what would be written, and how big
  dsv4-convert {cmd} IN OUT --resume           # after an interruption
  dsv4-convert {cmd} IN OUT --target vllm --tp 2   # for TP 2 only, padded as vLLM pads it
  dsv4-convert {cmd} IN OUT --json --report r.json   # one JSON object, on stdout and in r.json

It runs on the CPU, by design: a GPU route (--device cuda) was measured and withdrawn, 0.39x the CPU
route on an H100 box with the same bytes (the GPU could take only the weight repack, while reading,
writing and start-up stay and two PCIe copies are added; docs/PERFORMANCE.md).

\b
Exit codes: 0 converted, 2 usage error, 3 unreadable input, 4 input not convertible by this command,
5 output cannot be written, 130 interrupted (Ctrl-C, SIGTERM, SIGHUP). docs/ERRORS.md lists every id.
"""


def layout_options(fn):
    """--tp / --ep: convert for one tensor/expert-parallel split (padded per rank where the engine pads)."""
    fn = click.option("--ep", type=click.IntRange(1), default=None, metavar="M",
                      help="Expert-parallel size of that split (needs --tp; must divide it; default 1). MoE TP = TP / EP.")(fn)
    return click.option(
        "--tp", type=click.IntRange(1), default=None, metavar="N",
        help="Convert for this one tensor-parallel size. Needed only when the engine pads these experts' "
             "per-rank shapes (no layout-agnostic split exists, e.g. gpt-oss H = I = 2880, or I_shard not a "
             "multiple of 64/128): the experts are then written padded per rank exactly as the engine pads "
             "them, and the output serves only that --tp/--ep (recorded in quantization_config.tp_layout; "
             "the plugin refuses any other). Shapes that need no padding give the usual layout-agnostic "
             "bytes. Without --tp the output serves every split that needs no padding.")(fn)


def _layout(tp, ep) -> tuple[int | None, int]:
    if tp is None:
        if ep is not None:
            raise UsageError("--ep needs --tp (the split the output is written for)", error_id="usage.flags")
        return None, 1
    ep = ep or 1
    if tp % ep:
        raise UsageError(f"--ep {ep} must divide --tp {tp} (the MoE runs with TP / EP per expert)",
                         error_id="usage.flags")
    return tp, ep


def _run(quant: Quant, src, out, target, act_dtype, w4a8, workers, max_shard_size, resume, force, dry_run,
         report, executor, device=None, tp=None, ep=None, allow_unservable=False):
    refuse_gpu_device(device)  # exit 2 before anything is read or written
    tp, ep = _layout(tp, ep)
    force_progress = report.pop("force_progress")
    if (resume or force) and dry_run:
        raise UsageError("--dry-run writes nothing; it cannot be combined with --resume/--force",
                         error_id="usage.flags")
    try:
        tgt = MarlinTarget(engine=target, act_dtype=act_dtype, w4a8=w4a8)
    except ValueError as e:
        raise UsageError(str(e), error_id="usage.target") from None
    ckpt = open_checkpoint(src)
    check_source(ckpt, quant)
    if not allow_unservable:
        check_servable(ckpt, tgt.engine)
    tree = None
    if out is not None and not dry_run:  # OUT's owner, from here to publish: every refusal before any work
        tree = OutputTree(out, force=force, resume=resume, source=ckpt.root)
        tree.check()
    plan = build_plan(ckpt, tgt, max_shard_size=parse_size(max_shard_size),
                      options={"command": CONVERT_COMMAND[quant]}, tp=tp, ep=ep)
    if tp is not None and (refused := split_refusals(split_dims(ckpt.config, tgt.engine), tp)) and not report["quiet"]:
        # asked for explicitly (plan never offers it): converted as asked, the refusal said up front and in SERVING.md
        click.echo(f"warning: {tgt.engine} refuses TP {tp} for this model at launch ({'; '.join(refused)}; "
                   "core/targets/parallel_rules.py): this output cannot be served as converted; `dsv4-convert plan` lists "
                   "the splits it accepts", err=True)
    if dry_run:
        summary = _plan_summary(plan)
        emit(summary, _plan_text(plan, summary), **report)
        return
    bad_inputs = invalid_input_scales(ckpt)  # a few bytes per projection; published unchanged, so say it
    result = run_conversion(plan, tree, workers=workers, progress=show_progress(report["quiet"], force_progress), executor=executor)
    reused = f", {result.shards_reused} reused from the interrupted run" if result.shards_reused else ""
    text = (f"converted {plural(result.projections, 'projection')} into {plural(result.shards, 'shard')}{reused} "
            f"({human_size(result.bytes_out)}, {tgt.layout_tag}) in {result.seconds:.1f} s "
            f"({human_rate(result.bytes_out, result.seconds)}) -> {result.out}")
    if ckpt.left_out:  # original/, metal/: folders no engine reads (core/checkpoint/source_location.py LEFT_OUT_DIRS)
        text += f"\nleft out (no engine reads them): {_folders(ckpt.left_out)}"
    if stale_block(ckpt.config.get("quantization_config"), ckpt.hf_quant_config):  # nvidia/DeepSeek-V3-0324-FP4
        text += ("\nconfig.json's quantization_config contradicts hf_quant_config.json (a stale block): the conversion "
                 "serves the non-expert layers from hf_quant_config.json's block (quantization_config.serves_from)")
    if mtp := copied_mtp_layers(ckpt.tensors, ckpt.config, ckpt.projection_names):  # core/sources/mtp.py
        text += f"\nMTP (draft) layers copied byte for byte (no FP4 experts): {', '.join(mtp)} (SERVING.md)"
    emit({**result.as_dict(), "left_out": list(ckpt.left_out), "mtp_copied": list(mtp)},
         text + f"\nnext: dsv4-convert validate {shell_quote(str(result.out))} --against "
         f"{shell_quote(_absolute_source(src))}", **report)
    if result.lost_scales and not report["quiet"]:
        click.echo(f"warning: {result.lost_scales} NVFP4 scale bytes are negative or too small for "
                   f"{tgt.layout_tag} and were zeroed/made positive as the engine would; the originals are "
                   "recorded for marlin-to-source. Run validate to see where.", err=True)
    if bad_inputs and not report["quiet"]:
        ref, v = bad_inputs[0]
        click.echo(f"warning: {len(bad_inputs)} NVFP4 input scale(s) are not a finite value > 0 (first {ref.name} = "
                   f"{v!r} in {ref.file}); they are kept as they are (Marlin W4A16 does not use them), but the "
                   "export is broken for any W4A4/W4A8 path: re-export it (validate: nvfp4.input_scale.invalid).",
                   err=True)


def _absolute_source(src: str) -> str:
    """IN as a path that works from any folder (a Hub repo id stays as typed)."""
    path = Path(src).expanduser()
    return str(path.resolve()) if path.exists() else str(src)


def _folders(paths) -> str:
    counts = Counter(p.split("/", 1)[0] for p in paths)
    return ", ".join(f"{d}/ ({n} file{'s' if n > 1 else ''})" for d, n in sorted(counts.items()))


def _plan_summary(plan) -> dict:
    ckpt = plan.checkpoint
    return {
        "source": str(ckpt.root), "source_format": ckpt.format.value, "marlin_layout": plan.target.layout_tag,
        "act_dtype": plan.target.act_dtype, "w4a8": plan.target.w4a8,
        "projections": dict(Counter(p.quant.value for p in plan.projections)),
        "tensors_in": len(ckpt.tensors), "tensors_out": sum(len(s.tensors) for s in plan.shards),
        "shards": [{"file": s.file, "tensors": len(s.tensors), "bytes": s.nbytes} for s in plan.shards],
        "bytes_in": sum(t.nbytes for t in ckpt.tensors.values()), "bytes_out": plan.output_bytes,
        "rescale_pass": plan.needs_rescale,
        "layouts": [{"tp": t, "ep": e} for t, e in plan.layouts],
        **({} if plan.tp_layout is None else {"tp_layout": TpLayout.from_tiles(*plan.tp_layout, plan.rank_tiles).as_dict()}),
    }


def _plan_text(plan, summary: dict) -> str:
    lines = [
        f"source      {summary['source']} ({summary['source_format']})",
        f"target      {summary['marlin_layout']}, {summary['act_dtype']}{' W4A8' if plan.target.w4a8 else ''}",
        f"projections {', '.join(f'{n} {q}' for q, n in summary['projections'].items())}",
        f"tensors     {summary['tensors_in']} in -> {summary['tensors_out']} out, {plural(len(plan.shards), 'shard')}",
        f"bytes       {human_size(summary['bytes_in'])} in -> {human_size(summary['bytes_out'])} out",
    ]
    if plan.tp_layout is not None:
        tp, ep = plan.tp_layout
        pads = [f"{c} I_shard {v.i_shard}->{v.i_pad}, H {v.hidden}->{v.h_pad}" for c, v in plan.rank_tiles.items()
                if v.status == PAD]
        lines.append(f"layout      TP {tp} / EP {ep} only, padded per rank: {len(pads)} of {len(plan.rank_tiles)} "
                     f"experts layers ({pads[0]}{', ...' if len(pads) > 1 else ''})" if pads else
                     f"layout      TP {tp} / EP {ep}: no padding needed, layout-agnostic bytes")
    if plan.needs_rescale:
        lines.append("rescale     a planning pass reads the NVFP4 scales to pick vLLM's factor per layer stack")
    return "\n".join([*lines, "(dry run: nothing written)"])


def _command(quant: Quant, name: str, suffix: str, repo: str, doc: str):
    @click.command(name, help=doc + EXAMPLES.format(cmd=name, suffix=suffix, repo=repo))
    @click.argument("src", metavar="IN")
    @click.argument("out", metavar="OUT", required=False)
    @target_options
    @layout_options
    @run_options
    @device_option
    @executor_options
    @click.option("--allow-unservable", is_flag=True, default=lambda: settings().allow_unservable,
                  help="Convert a model family the serving plugins do not load yet (refused by default, with the "
                       "reason; docs/FORMAT.md lists the families). The output validates and reverses byte for "
                       f"byte, but will not start in the plugins. Env: {ALLOW_UNSERVABLE_ENV}=1.")
    def command(src, out, target, act_dtype, tp, ep, workers, max_shard_size, resume, force, dry_run, as_json,
                report_file, quiet, force_progress, device, executor, allow_unservable, w4a8=False):
        if out is None and not dry_run:
            raise click.UsageError("missing argument OUT (only --dry-run can do without it)")
        _run(quant, src, out, target, act_dtype, w4a8, workers, max_shard_size, resume, force, dry_run,
             {"as_json": as_json, "report_file": report_file, "quiet": quiet, "force_progress": force_progress},
             executor, device, tp, ep, allow_unservable)
    return command


nvfp4_to_marlin = _command(Quant.NVFP4, "nvfp4-to-marlin", "-NVFP4", "nvidia/DeepSeek-V4-Flash-NVFP4", """Repack NVFP4 experts into Marlin tile order.

IN is a checkpoint directory (or a Hugging Face repo id) in ModelOpt NVFP4 (DeepSeek-V4 or generic
names) or compressed-tensors nvfp4-pack-quantized form. OUT is written atomically: it appears only
when complete. Everything that is not an FP4 expert is copied byte for byte. MXFP4 MTP experts of a
DeepSeek-V4 NVFP4 checkpoint are packed as MXFP4.""")

mxfp4_to_marlin = click.option(
    "--w4a8", is_flag=True, help=f"{ENGINES[W4A8_ENGINE].display}'s W4A8 layout (MXFP4 weights, FP8 activations; "
                                 f"needs --target {W4A8_ENGINE}). Served only by "
                                 f"{ENGINES[W4A8_ENGINE].w4a8_versions()}: newer releases removed W4A8 Marlin and "
                                 "refuse the checkpoint; without --w4a8 (W4A16) every release serves it.",
)(_command(Quant.MXFP4, "mxfp4-to-marlin", "", "deepseek-ai/DeepSeek-V4-Flash", """Repack MXFP4 experts into Marlin tile order.

IN is a DeepSeek-V4 native checkpoint (MXFP4 experts, FP8 elsewhere) or compressed-tensors
mxfp4-pack-quantized. MXFP4 Marlin runs with bfloat16 activations only. OUT is written atomically.
Everything that is not an FP4 expert is copied byte for byte."""))
