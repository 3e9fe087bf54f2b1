"""`dsv4-convert plan`: a launch plan for sm_120 from headers only (docs/PLAN.md)."""

from __future__ import annotations

import sys

import click

from ..core.checkpoint.reader import open_checkpoint
from ..core.errors import ContentError, UsageError
from ..core.targets.engines import ACT_DTYPES, DEFAULT_ENGINE
from ..planner.launch import make_plan, shape_from_checkpoint
from .options import ACT_DTYPE_CHOICE, TARGET_CHOICE, TARGET_HELP, FiniteFloat
from .report import emit, report_options

__all__ = ["plan"]

EXAMPLES = """

\b
Examples:
  dsv4-convert plan ./DeepSeek-V4-Flash --gpus 8 --gpu-mem-gib 96 --target sglang
  dsv4-convert plan ./dsv4-marlin --gpus 4 --gpu-mem-gib 96 --target vllm --json

\b
Exit codes: 0 a configuration fits, 1 none does, 2 usage error, unreadable input or a report that
cannot be written, 4 NOT SERVED (plan.not_served: the plugin is not proven to load it; no launch command),
130 interrupted. With --json, one JSON object on every path (docs/ERRORS.md).
"""


@click.command(help="Which TP/EP splits work, memory per GPU, the memory flag, the MoE backend to force and a "
                    "launch command, from headers only." + EXAMPLES)
@click.argument("path")
@click.option("--gpus", default=8, show_default=True, type=click.IntRange(min=1), help="GPUs in the server")
@click.option("--gpu-mem-gib", default=96.0, show_default=True, type=FiniteFloat(min=1),
              help="memory per GPU in GiB, at least 1 (RTX PRO 6000: 96)")
@click.option("--arch", type=click.Choice(["sm_120", "sm_90", "sm_100"]), default="sm_120", show_default=True)
@click.option("--target", type=TARGET_CHOICE, default=None, help=f"engine: {TARGET_HELP}  [default: {DEFAULT_ENGINE}]")
@click.option("--engine", type=TARGET_CHOICE, default=None, hidden=True,
              help="deprecated spelling of --target (removed in the next release)")
@click.option("--act-dtype", type=ACT_DTYPE_CHOICE, default=ACT_DTYPES[0], show_default=True)
@click.option("--engram", type=click.Choice(["auto", "gpu", "host"]), default="auto", show_default=True,
              help="DeepSeek-V4.1's Engram tables on the GPUs or in pinned host memory; auto: the engine's default, "
                   "else the other where only that fits (vLLM: host, --engram-config; SGLang: GPUs, "
                   "SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE)")
@report_options
def plan(path, gpus, gpu_mem_gib, arch, target, engine, act_dtype, engram, as_json, report_file, quiet):
    if engine is not None:
        if target is not None and target != engine:
            raise UsageError(f"--engine {engine} contradicts --target {target}", error_id="usage.flags",
                             hint="drop --engine (a deprecated spelling of --target)")
        click.echo("warning: --engine is deprecated and will be removed in the next release; use --target", err=True)
    ckpt = open_checkpoint(path)  # unreadable: main() answers exit 2, plan's class as validate's
    result = make_plan(shape_from_checkpoint(ckpt), gpus=gpus, gpu_mem_gib=gpu_mem_gib, arch=arch,
                       engine=target or engine or DEFAULT_ENGINE, act_dtype=act_dtype, path=str(path), engram=engram)
    doc, text = result.to_json(), result.render_text()
    code = 0 if result.chosen is not None else 1
    if result.not_served:  # the plan is still shown (splits, memory), with the error beside it
        e = ContentError(f"NOT SERVED on {doc['engine']}: {result.not_served}", error_id="plan.not_served",
                         hint="plan for an engine that serves it (see `dsv4-convert inspect`), or convert a source "
                              "the README's support matrix lists as served")
        code = e.exit_code
        doc["error"] = {"id": e.error_id, "message": e.message, "file": None, "tensor": None, "fix": e.hint}
        text += "\n\n" + e.render()
    emit(doc, text, as_json=as_json, report_file=report_file, quiet=False, exit_code=code)
    sys.exit(code)
