"""`dsv4-convert plan`: a launch plan for sm_120 from headers only (docs/PLAN.md)."""

from __future__ import annotations

import json
import sys

import click

from dsv4_convert.core.errors import DsvError
from dsv4_convert.core.reader import open_checkpoint
from dsv4_convert.validate.launch import make_plan, shape_from_checkpoint

__all__ = ["plan"]

EXAMPLES = """

\b
Examples:
  dsv4-convert plan ./DeepSeek-V4-Flash --gpus 8 --gpu-mem-gib 96 --engine sglang
  dsv4-convert plan ./dsv4-marlin --gpus 4 --gpu-mem-gib 96 --engine vllm --json -

\b
Exit codes: 0 a configuration fits, 1 none does, 2 usage error or unreadable input.
"""


@click.command(help="Which TP/EP splits work, memory per GPU, the memory flag, the MoE backend to force and a "
                    "launch command, from headers only." + EXAMPLES)
@click.argument("path")
@click.option("--gpus", default=8, show_default=True, type=click.IntRange(min=1), help="GPUs in the server")
@click.option("--gpu-mem-gib", default=96.0, show_default=True, type=click.FloatRange(min=1),
              help="memory per GPU (RTX PRO 6000: 96)")
@click.option("--arch", type=click.Choice(["sm_120", "sm_90", "sm_100"]), default="sm_120", show_default=True)
@click.option("--engine", type=click.Choice(["sglang", "vllm"]), default="sglang", show_default=True)
@click.option("--act-dtype", type=click.Choice(["bfloat16", "float16"]), default="bfloat16", show_default=True)
@click.option("--json", "json_file", metavar="FILE", help="write the plan as JSON to FILE ('-' for stdout)")
def plan(path, gpus, gpu_mem_gib, arch, engine, act_dtype, json_file):
    try:
        ckpt = open_checkpoint(path)
    except DsvError as e:
        click.echo(e.render(), err=True)
        sys.exit(2)
    result = make_plan(shape_from_checkpoint(ckpt), gpus=gpus, gpu_mem_gib=gpu_mem_gib, arch=arch, engine=engine,
                       act_dtype=act_dtype, path=str(path))
    if json_file == "-":
        click.echo(json.dumps(result.to_json(), indent=2))
    else:
        click.echo(result.render_text())
        if json_file:
            with open(json_file, "w") as f:
                json.dump(result.to_json(), f, indent=2)
    sys.exit(0 if result.chosen is not None else 1)
