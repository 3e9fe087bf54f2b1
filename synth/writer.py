"""The synthetic checkpoint writer: small but structurally real checkpoints in every supported source
format, with injectable defects, plus a real-size MoE layer for benchmarks.

The layout per format lives in synth_layouts.py / synth_experts.py, configs in synth_configs.py,
defects in synth_defects.py and the real-size layer in synth_realsize.py. This module checks the
arguments, shards the tensors and writes them through the output tree (runtime/output/: staged in
`<out>.partial`, locked, published by one rename), as every command that writes a checkpoint does.

Beside config.json it writes `synth.json`: the arguments, the shard files, the tensor count, the
total tensor bytes and one record per injected defect (which tensor, which element, what changed).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..core.errors import UsageError
from ..core.files import CONFIG, INDEX_FILE, MTP_FILE, SYNTH_MANIFEST, shard_name
from ..core.sources.source_formats import source_format, synth_formats
from ..core.version import __version__
from ..runtime.output import OutputTree
from .configs import config_files
from .defects import DEFECTS, apply_file_defects, apply_tensor_defects, check_defects, tweaks_for
from .dsv41 import dsv41_config, dsv41_tensors, dsv41_tokenizer
from .families import FAMILY_SPECS
from .family_configs import family_config_files
from .family_layers import family_tensors
from .layouts import Dims, build_tensors
from .realsize import REAL_SIZE, real_size_plan

__all__ = [
    "DEFECT_NAMES",
    "REAL_SIZE",
    "SYNTH_FAMILIES",
    "SYNTH_FORMATS",
    "write_synthetic_checkpoint",
]

SYNTH_FORMATS = synth_formats()  # the source-format table's rows with a `synth` entry
# model family -> the source formats its releases use (the first is the default): core/sources/families.py FAMILIES
SYNTH_FAMILIES = {"deepseek-v4": ("nvfp4-modelopt-dsv4", "mxfp4-dsv4"), "gpt-oss": ("mxfp4-gptoss",),
                  "deepseek-v41": ("mxfp4-dsv4",),  # synth/dsv41.py
                  **{name: spec.formats for name, spec in FAMILY_SPECS.items()}}
DEFECT_NAMES = tuple(DEFECTS)
_OWN_TREE = ("deepseek-v41",)  # families written by their own module, not a FamilySpec (synth/dsv41.py)

Progress = Callable[[int, int], None]  # (bytes of the tensor just produced, total bytes of the checkpoint)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _split(sizes: list[int], shards: int) -> list[list[int]]:
    """`shards` contiguous, non-empty groups of tensor indices with about equal bytes each."""
    total, before = sum(sizes), 0
    groups = [[] for _ in range(shards)]
    for i, size in enumerate(sizes):
        groups[min(shards - 1, (before + size // 2) * shards // max(total, 1))].append(i)
        before += size
    if any(not g for g in groups):  # a huge tensor swallowed a boundary: fall back to equal counts
        per, extra = divmod(len(sizes), shards)
        bounds = [sum(per + (j < extra) for j in range(k)) for k in range(shards + 1)]
        groups = [list(range(bounds[k], bounds[k + 1])) for k in range(shards)]
    return groups


def _write_shards(tree: OutputTree, names: list[str], sizes: list[int], groups: list[list[int]],
                  produce: Callable[[str], torch.Tensor], progress: Progress | None) -> dict[str, str]:
    weight_map, total = {}, sum(sizes)
    for k, group in enumerate(groups):
        file = shard_name(k, len(groups))
        shard = {}
        for i in group:
            shard[names[i]] = produce(names[i]).contiguous()
            weight_map[names[i]] = file
            if progress:
                progress(sizes[i], total)
        # save_file, never save() to bytes: safetensors 0.8.0 save() writes F8_E8M0 it cannot read back
        _save(shard, tree.file(file))
        os.chmod(tree.file(file), 0o644)
        del shard
    return weight_map


def _save(shard: dict, path: Path) -> None:
    """save_file, with the OS error it hides in a SafetensorError's text raised as the OSError it is."""
    try:
        save_file(shard, str(path), metadata={"format": "pt"})
    except Exception as e:
        m = re.search(r"os error (\d+)", str(e))
        if m is None:
            raise
        code = int(m.group(1))
        raise OSError(code, os.strerror(code), str(path)) from None


def _check_args(fmt, layers, experts, hidden, intermediate, shards, hash_layers, mtp, dtype, real_size,
                defects, family=None) -> None:
    problems = []
    if family is not None:
        if family not in SYNTH_FAMILIES:
            problems.append(f"unknown family {family!r} (choose from {', '.join(SYNTH_FAMILIES)})")
        elif fmt not in SYNTH_FAMILIES[family]:
            problems.append(f"{family} releases come as {', '.join(SYNTH_FAMILIES[family])}, not {fmt}")
        elif (family in FAMILY_SPECS or family in _OWN_TREE) and (mtp or defects or real_size):
            problems.append(f"--family {family} takes no --mtp, --defect or --real-size (its MTP layer, if the "
                            "family has one, is always written)")
    if fmt not in synth_formats():
        problems.append(f"unknown format {fmt!r} (choose from {', '.join(synth_formats())})")
    for label, value, low in (("layers", layers, 1), ("experts", experts, 1), ("shards", shards, 1)):
        if value < low:
            problems.append(f"--{label} must be >= {low}, got {value}")
    for label, value in (("hidden", hidden), ("intermediate", intermediate)):
        if value < 32 or value % 32:
            problems.append(f"--{label} must be a positive multiple of 32 (the MXFP4 block), got {value}")
    if not 0 <= hash_layers <= layers:
        problems.append(f"hash_layers must be in [0, {layers}], got {hash_layers}")
    dsv4 = sorted(f for f in synth_formats() if source_format(f).synth.tree == "deepseek-v4")
    if mtp and fmt not in dsv4:
        problems.append(f"--mtp needs a DeepSeek-V4 format ({', '.join(dsv4)}), not {fmt}")
    if dtype not in (torch.bfloat16, torch.float16):
        problems.append(f"dtype_torch must be torch.bfloat16 or torch.float16, got {dtype}")
    if real_size and (mtp or defects):
        problems.append("--real-size makes one bare MoE layer: it takes no --mtp and no --defect")
    if "reshaped-down" in defects and hidden == intermediate:
        problems.append("--defect reshaped-down needs --hidden != --intermediate (else [I, H] is [H, I])")
    if problems:
        raise UsageError("; ".join(problems), error_id="synth.args", hint="see `dsv4-convert synth --help`")


def write_synthetic_checkpoint(out: Path, *, format: str | None = None, family: str | None = None, layers: int = 2,
                               experts: int = 8, hidden: int = 256, intermediate: int = 128, shards: int = 3,
                               seed: int = 0, mtp: bool = False, defects: Iterable[str] = (),
                               hash_layers: int = 1, dtype_torch: torch.dtype = torch.bfloat16,
                               real_size: bool = False, real_size_dims: Dims | None = None,
                               shard_bytes: int | None = None, force: bool = False,
                               progress: Progress | None = None) -> Path:
    """Write a synthetic checkpoint to `out` and return `out`. Same arguments, byte-identical files.

    Expert matrices are random bf16-representable values (`seeded.expert_matrix`) quantized with
    the project's codecs. `family` (SYNTH_FAMILIES) writes that model family's real tensor names and
    configs (synth/families.py) in `format` (default: the family's usual format). With `real_size=True` it writes ONE DeepSeek-V4-Flash-sized MoE layer
    (`REAL_SIZE`, or `real_size_dims`) of random codes and scale bytes - not quantized matrices - in
    shards of about `shard_bytes` (1 GiB), holding one shard in memory at a time; the small-model
    arguments (layers, experts, hidden, intermediate, shards) are then ignored."""
    out, defects = Path(out), tuple(defects)
    if format is None:
        format = SYNTH_FAMILIES.get(family, ("nvfp4-modelopt-dsv4",))[0]
    _check_args(format, layers, experts, hidden, intermediate, shards, hash_layers, mtp, dtype_torch,
                real_size, defects, family)
    if not real_size:
        check_defects(defects, format, experts)
    # an empty OUT is fine; --force replaces only a directory dsv4-convert wrote (runtime/output/rules.py);
    # not durable: a synthetic checkpoint is made again in seconds, so nothing is fsync'd (the rename stays atomic)
    if real_size:
        dims = real_size_dims or REAL_SIZE
    else:
        dims = Dims(layers, experts, hidden, intermediate, hash_layers, mtp)
        if family == "deepseek-v41":  # no hash layers in V4.1 (synth/dsv41.py)
            dims = dataclasses.replace(dims, hash_layers=0)
    configs = config_files(format, dims)
    if family in FAMILY_SPECS:
        configs.update(family_config_files(family, format, dims))
    elif family == "deepseek-v41":
        configs.update({CONFIG: dsv41_config(dims), **dsv41_tokenizer(dims)})
    # writes: the files besides shards and records that this run puts in OUT.partial, so that a run killed by
    # SIGKILL leaves a staging directory the next --force run knows as its own
    tree = OutputTree(out, force=force, resumable=False, allow_empty=True, durable=False, writes=set(configs))
    tree.check()
    try:
        tree.open(f"synth {format} {family} {seed}")
        if real_size:
            names, sizes, produce = real_size_plan(format, seed, dims, dtype_torch)
            target = shard_bytes or (1 << 30)
            groups = _split(sizes, min(len(sizes), max(1, -(-sum(sizes) // target))))
            records = []
        else:
            if family == "deepseek-v41":
                tensors = dsv41_tensors(format, seed, dims, tweaks_for(defects, experts), dtype_torch)
            elif family in FAMILY_SPECS:
                tensors, outside = family_tensors(family, format, seed, dims, dtype_torch)
                if outside:  # a file the index does not list (GLM's mtp.safetensors)
                    _save(outside, tree.file(MTP_FILE))
                    os.chmod(tree.file(MTP_FILE), 0o644)
            else:
                tensors = build_tensors(format, seed, dims, tweaks_for(defects, experts), dtype_torch)
            records = apply_tensor_defects(tensors, defects, format, experts)
            names = list(tensors)
            sizes = [_nbytes(tensors[n]) for n in names]
            if len(names) < shards:
                raise UsageError(f"{len(names)} tensors cannot fill {shards} shards", error_id="synth.args",
                                 hint="use fewer --shards")
            groups, produce = _split(sizes, shards), tensors.__getitem__
        weight_map = _write_shards(tree, names, sizes, groups, produce, progress)
        files = [shard_name(k, len(groups)) for k in range(len(groups))]
        total = sum(sizes)
        tree.write_json(INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})
        for fname, obj in configs.items():
            tree.write_json(fname, obj)
        for rec in records:
            if rec.tensors and rec.tensors[0] in weight_map:
                rec.file = weight_map[rec.tensors[0]]
        apply_file_defects(tree.file, files, records)
        tree.write_json(SYNTH_MANIFEST, {
            "generator": "dsv4-convert synth", "version": __version__, "format": format, "family": family,
            "seed": seed,
            "real_size": real_size, "random_codes": real_size, "dtype": str(dtype_torch).removeprefix("torch."),
            "dims": {"layers": dims.layers, "experts": dims.experts, "hidden": dims.hidden,
                     "intermediate": dims.intermediate, "hash_layers": dims.hash_layers, "mtp": dims.mtp,
                     "vocab": dims.vocab},
            "files": files, "tensors": len(names), "total_size": total,
            # every file synth wrote: a later --force replaces the directory only while it holds no other
            "written": sorted([*tree.written(), SYNTH_MANIFEST]),
            "defects": [r.as_json() for r in records]})
        tree.publish()
    except BaseException:
        tree.discard()
        raise
    return tree.out
