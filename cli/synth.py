"""`dsv4-convert synth OUT`: write a small synthetic DeepSeek-V4-shaped checkpoint (or one real-size
MoE layer) in any supported source format. A thin wrapper around `dsv4_convert.synth`."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..core.files import SYNTH_MANIFEST
from ..core.sources.families import family_named
from ..core.sources.source_formats import source_format
from ..core.units import plural
from ..runtime.cpu_budget import torch_threads, usable_cpus
from ..synth import (
    DEFECT_NAMES,
    REAL_SIZE,
    SYNTH_FAMILIES,
    SYNTH_FORMATS,
    write_synthetic_checkpoint,
)
from ..synth.defects import DEFECTS
from ..synth.families import FAMILY_SPECS
from .report import emit, progress_option, report_options, show_progress

__all__ = ["synth"]

def _examples(name: str) -> str:
    """The releases a synth family (or a release replica of one) stands for."""
    spec = FAMILY_SPECS.get(name)
    return (spec and spec.examples) or family_named(spec.family if spec else name).examples


_FORMAT_HELP = "\n".join(f"  {name:<20} {source_format(name).summary}" for name in SYNTH_FORMATS)
_FAMILY_HELP = "\n".join(
    f"  {name:<16} {', '.join(fmts):<38} {_examples(name)}" for name, fmts in SYNTH_FAMILIES.items())
_DEFECT_HELP = "\n".join(
    f"  {d.name:<16} {d.doc}" + (f" (layer 0 expert {d.expert} {'/'.join(d.roles)})" if d.expert is not None else "")
    for d in DEFECTS.values())

HELP = f"""Write a small but structurally real DeepSeek-V4-shaped checkpoint to OUT.

Real tensor names, dtypes and configs for the chosen source format (config.json with the
DeepSeek-V4 fields, hf_quant_config.json for ModelOpt), FP8 block-quant attention and shared
experts, BF16 embed/head/norms, router gate (+ bias, tid2eid for hash layers), routed experts
quantized from random bf16 matrices and spread across shards, an optional MTP block. The same
arguments give byte-identical files. synth.json beside config.json records the arguments, the
files and, for each --defect, the exact tensor and element it changed.

\b
Formats (--format):
{_FORMAT_HELP}
\b
Model families (--family; real tensor names, config.json and quantisation config of that
architecture's releases at shrunk sizes; --format picks among the family's formats, the first
is the default):
{_FAMILY_HELP}

\b
Defects (--defect, repeatable; each hits one fixed place, recorded in synth.json):
{_DEFECT_HELP}

\b
--real-size writes ONE DeepSeek-V4-Flash MoE layer ({REAL_SIZE.experts} experts, hidden {REAL_SIZE.hidden},
intermediate {REAL_SIZE.intermediate}; ~3.4 GB MXFP4, ~3.6 GB NVFP4) in ~1 GiB shards, expert tensors only.
Its data is random codes and scale bytes, not quantized matrices (fast; fine for benchmarks).

\b
Examples:
  dsv4-convert synth ./tiny-nvfp4
  dsv4-convert synth ./tiny-mxfp4 --format mxfp4-dsv4 --mtp --layers 3
  dsv4-convert synth ./bad --format nvfp4-ct --defect nan-scale --defect missing-shard
  dsv4-convert synth ./bench --format mxfp4-dsv4 --real-size
  dsv4-convert synth ./tiny-qwen3 --family qwen3-moe --format nvfp4-ct

\b
Exit codes: 0 written, 2 usage error, 5 output cannot be written, 130 interrupted.
"""


def _advance(bar):
    def update(nbytes: int, total: int) -> None:
        bar.total = total
        bar.update(nbytes)
    return update


@click.command(help=HELP)
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(SYNTH_FORMATS), default=None,
              help="source format to write [default: nvfp4-modelopt-dsv4, or the family's first format]")
@click.option("--family", type=click.Choice(tuple(SYNTH_FAMILIES)), default=None,
              help="write this model family's names and configs (see the list above)")
@click.option("--layers", default=2, show_default=True, help="MoE layers")
@click.option("--experts", default=8, show_default=True, help="routed experts per layer")
@click.option("--hidden", default=256, show_default=True, help="hidden size H (multiple of 32)")
@click.option("--intermediate", default=128, show_default=True, help="expert intermediate size I (multiple of 32)")
@click.option("--shards", default=3, show_default=True, help="number of safetensors shards")
@click.option("--seed", default=0, show_default=True, help="random seed; same seed, same bytes")
@click.option("--hash-layers", default=1, show_default=True, help="leading layers with a tid2eid hash router")
@click.option("--mtp", is_flag=True, help="add an MTP block mtp.0.* (DeepSeek-V4 formats only)")
@click.option("--defect", "defects", multiple=True, type=click.Choice(DEFECT_NAMES), metavar="NAME",
              help="inject a defect (repeatable); see the list above")
@click.option("--real-size", is_flag=True, help="one real-size DSV4-Flash MoE layer of random codes")
@click.option("--force", is_flag=True, help="replace OUT if it is empty or an earlier synth output")
@report_options
@progress_option
def synth(out, fmt, family, layers, experts, hidden, intermediate, shards, seed, hash_layers, mtp, defects, real_size,
          force, as_json, report_file, quiet, force_progress):
    bar = None
    if real_size and show_progress(quiet, force_progress):
        from tqdm import tqdm
        bar = tqdm(desc="synth", unit="B", unit_scale=True, unit_divisor=1024, leave=False)
    try:
        with torch_threads(usable_cpus() if real_size else 1):  # a small replica is many small ops
            path = write_synthetic_checkpoint(
                out, format=fmt, family=family, layers=layers, experts=experts, hidden=hidden, intermediate=intermediate,
                shards=shards, seed=seed, mtp=mtp, defects=defects, hash_layers=min(hash_layers, layers),
                real_size=real_size, force=force, progress=None if bar is None else _advance(bar))
    finally:
        if bar is not None:
            bar.close()
    m = json.loads((path / SYNTH_MANIFEST).read_text())
    fmt = m["format"]
    extra = f", defects: {', '.join(defects)}" if defects else ""
    emit({"out": str(path), "format": fmt, "family": family, "files": m["files"], "tensors": m["tensors"],
          "total_size": m["total_size"], "defects": list(defects)},
         f"wrote {path} ({fmt}{f', {family}' if family else ''}{', real size' if real_size else ''}): {plural(len(m['files']), 'file')}, "
         f"{plural(m['tensors'], 'tensor')}, {m['total_size']:,} bytes{extra}", as_json=as_json, report_file=report_file,
         quiet=quiet)
