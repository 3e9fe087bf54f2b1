"""marlin-to-source: rebuild the input checkpoint, byte for byte, from a converted one.

The converter keeps what it replaced in `dsv4-convert-source/`: the original config files and index,
every shard's exact header, and the few scale bytes a target clamps. The source projections are
re-derived from those headers with the reader's own grouping, so every source layout (per-expert
tensors, or gpt-oss stacks with interleaved gate/up rows) is rebuilt the same way: each original
shard is its header followed by its tensors at their original offsets, passthrough tensors copied
from the converted checkpoint and FP4 tensors decoded with the exact inverse transforms."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from ..core.checkpoint.index import read_weight_map
from ..core.checkpoint.reader import TensorReader, load_projection, open_checkpoint
from ..core.checkpoint.safetensors_header import parse_header
from ..core.checkpoint.small_files import read_small
from ..core.checkpoint.tensor_model import Projection, Quant, Role, TensorRef
from ..core.errors import ContentError, InputError
from ..core.files import (
    CONFIG,
    HF_QUANT_CONFIG,
    INDEX_FILE,
    LOST,
    MANIFEST,
    MARKER,
    SERVING_NOTES,
    SOURCE_DIR,
    SOURCE_HEADERS,
)
from ..core.record.converted_config import converted_record
from ..core.sources.grouping import group_projections
from ..core.sources.source_formats import source_format
from ..core.targets.target import MarlinTarget
from ..formats.marlin import marlin_to_mxfp4, marlin_to_nvfp4
from ..formats.padded_layout import decode_rank_blocks, padded_nk, unpad_source
from ..runtime.executors import ExecutorSpec, auto_workers, make_executor
from ..runtime.manifest import verify
from ..runtime.output import OutputTree, record_name_ok, refuse_reserved_names
from .lost_record import bad_record, check_lost_record, restore_lost
from .pipeline import _report
from .plan import kept_input_name
from .transform import scale_round_trip

__all__ = ["ReverseResult", "reverse_checkpoint"]

_GENERATED = {CONFIG, HF_QUANT_CONFIG, INDEX_FILE, SERVING_NOTES, MANIFEST, MARKER}


@dataclass
class ReverseResult:
    out: Path
    shards: int
    projections: int
    restored_scales: int  # scale bytes the target had clamped, restored from the record
    seconds: float

    def as_dict(self) -> dict:
        return dict(self.__dict__, out=str(self.out))


@dataclass(frozen=True)
class _Job:
    """Everything one shard rebuild needs (picklable)."""
    root: str
    target: MarlinTarget
    rescale: dict
    lost: dict
    converted: dict  # projection key -> the converted checkpoint's Projection
    outputs: dict  # converted tensor name -> TensorRef
    decoded_by: dict  # original tensor name -> [(source Projection, "weight" | "scale")]
    kept_as: dict  # original tensor name -> converted tensor name (globals, input scales)
    tiles: dict = field(default_factory=dict)  # container -> RankTiles of a padded --tp/--ep output


def _decode(reader, cp: Projection, job: _Job) -> dict[str, torch.Tensor]:
    src = load_projection(reader, cp)
    sf = job.rescale.get(f"{cp.container}.{cp.stack}", 1.0)

    def decode(q, s, n, k):
        if cp.quant is Quant.NVFP4:
            return marlin_to_nvfp4(q, s, target=job.target, n=n, k=k, sf=sf)
        return marlin_to_mxfp4(q, s, target=job.target, n=n, k=k)

    tiles = job.tiles.get(cp.container)
    if tiles is None:
        weight, scale = decode(src.weight, src.scale, cp.n, cp.k)
    else:  # --tp/--ep output: decode each rank's block, drop its padding (formats/padded_layout.py)
        down = cp.role is Role.DOWN
        weight, scale = decode_rank_blocks((src.weight, src.scale), down=down, t=tiles, decode=decode)
        weight, scale, zero = unpad_source(weight, scale, down=down, t=tiles)
        if not zero:
            raise ContentError(f"{cp.key}: the padding of the TP {tiles.tp} / EP {tiles.ep} layout holds non-zero "
                               "bytes, so the source cannot be rebuilt exactly", error_id="reverse.padding_not_zero",
                               tensor=cp.weight.name, file=cp.weight.file,
                               hint="the converted checkpoint was edited or not written by dsv4-convert; convert "
                                    "again from the source")
    if cp.quant is Quant.NVFP4:
        restore_lost(scale, cp.key, job.lost, scale_round_trip(job.target.clamps_scales, sf), Path(job.root) / SOURCE_DIR / LOST)
    return {"weight": weight.view(torch.uint8), "scale": scale.view(torch.uint8)}


def _assemble(reader, ref: TensorRef, uses, job: _Job) -> bytes:
    """The original bytes of an FP4 weight or scale tensor, from the projections it feeds."""
    if len(uses) == 1 and uses[0][0].expert_index is None:
        sp, part = uses[0]
        return _decode(reader, job.converted[sp.key], job)[part].numpy().tobytes()
    stacked = np.zeros(ref.nbytes, dtype=np.uint8).reshape(ref.shape[0], -1)  # [E, ...] stacks
    for sp, part in uses:
        t = _decode(reader, job.converted[sp.key], job)[part].numpy()
        slab = stacked[sp.expert_index]
        rows = slab.reshape(ref.shape[1], -1).T if sp.k_major else slab.reshape(ref.shape[1], -1)
        rows[sp.rows] = t.reshape(t.shape[0], -1)  # a K-major stack: written through the transposed view
    return stacked.tobytes()


def _rebuild_shard(job: _Job, file: str, prefix: bytes, refs: dict[str, TensorRef], tmp: str, callback=None) -> str:
    """Write one original shard: its recorded header bytes, then every tensor at its recorded offset."""
    with TensorReader(Path(job.root)) as reader, open(tmp, "wb") as f:
        f.write(prefix)
        for ref in sorted(refs.values(), key=lambda r: r.begin):
            if ref.name in job.decoded_by:
                data = _assemble(reader, ref, job.decoded_by[ref.name], job)
            else:
                name = job.kept_as.get(ref.name, ref.name)
                if name not in job.outputs:
                    raise ContentError(f"the original shard had {ref.name}, but the converted checkpoint has no "
                                       f"{name}", error_id="reverse.missing_tensor", tensor=name, file=file,
                                       hint="the converted checkpoint is incomplete or was edited")
                data = reader.read_bytes(job.outputs[name])
            if f.tell() != ref.begin or len(data) != ref.nbytes:
                raise ContentError(f"{ref.name}: rebuilt {len(data)} bytes at offset {f.tell()}, the original header "
                                   f"says {ref.nbytes} at {ref.begin}", error_id="reverse.layout_mismatch",
                                   tensor=ref.name, file=file, hint="the converted checkpoint was edited")
            f.write(data)
            _report(len(data), callback)
    return file


def _load_record(root: Path):
    sdir = root / SOURCE_DIR
    if not (sdir / SOURCE_HEADERS).exists():
        raise ContentError(f"{sdir / SOURCE_HEADERS} is missing", error_id="reverse.no_source_record",
                           file=str(sdir / SOURCE_HEADERS),
                           hint="only a complete dsv4-convert output can be reversed; convert again from the source")
    config = _record_json(sdir / CONFIG, dict)
    recorded = _record_json(sdir / SOURCE_HEADERS, dict)
    try:
        lost = load_file(sdir / LOST) if (sdir / LOST).exists() else {}
    except Exception as e:  # safetensors raises its own error type for a damaged file
        bad_record(sdir / LOST, f"not a readable safetensors file ({e})")
    shards = {}  # file -> (the 8-byte length + header bytes, its tensors), parsed once
    for file, text in recorded.items():
        # a name from the record becomes a path under OUT: a plain shard name only, never ../ or a dir
        if not (isinstance(text, str) and file.endswith(".safetensors") and record_name_ok(file)):
            bad_record(sdir / SOURCE_HEADERS, f"entry {file!r} is not a shard name -> header text pair")
        raw = text.encode()
        prefix = len(raw).to_bytes(8, "little") + raw
        try:
            shards[file] = (prefix, parse_header(prefix, file_size=len(prefix), file=file, allow_truncated=True)[0])
        except InputError as e:  # the record's copy of the header, not the shard on disk, is damaged
            bad_record(sdir / SOURCE_HEADERS, f"entry {file!r}: {e.message} [{e.error_id}]")
    if not shards:
        bad_record(sdir / SOURCE_HEADERS, "it lists no shard, so there is nothing to rebuild")
    _index_agrees(sdir, shards)
    return shards, config, lost


def _index_agrees(sdir: Path, shards: dict) -> None:
    """The recorded index (restored as is) must map every tensor to the shard headers.json rebuilds it in."""
    if not (sdir / INDEX_FILE).exists():
        return
    try:
        weight_map = read_weight_map(sdir)
    except InputError as e:
        bad_record(sdir / INDEX_FILE, f"{e.message} [{e.error_id}]")
    rebuilt = {name: file for file, (_, refs) in shards.items() for name in refs}
    if weight_map != rebuilt:
        odd = sorted(set(weight_map.items()) ^ set(rebuilt.items()))
        bad_record(sdir / INDEX_FILE, f"it and {SOURCE_HEADERS} place {len(odd)} tensors differently, e.g. "
                   f"{odd[0][0]!r}")


def _record_json(path: Path, kind: type):
    try:
        obj = json.loads(read_small(path))
    except (OSError, ValueError, RecursionError) as e:
        bad_record(path, f"not readable JSON ({e})")
    if not isinstance(obj, kind):
        bad_record(path, f"not a JSON {kind.__name__}")
    return obj


def _check_shapes(sources: list[Projection], converted: dict, tiles: dict) -> None:
    """Each converted projection must be its source's [N, K], or the padded [N, K] of the layout that
    tp_layout records for its container; else the bytes cannot be the source's (a tp_layout removed or
    edited, a tensor replaced)."""
    for sp in sources:
        cp, t = converted[sp.key], tiles.get(converted[sp.key].container)
        down = cp.role is Role.DOWN
        real = (sp.n, sp.k) if t is None else ((t.hidden, t.moe_tp * t.i_shard) if down else
                                               (t.moe_tp * t.i_shard, t.hidden))
        want = (sp.n, sp.k) if t is None else padded_nk(down, t)
        if (cp.n, cp.k) != want or (sp.n, sp.k) != real:
            how = (f"tp_layout records TP {t.tp} / EP {t.ep} padding for {cp.container}: [{want[0]}, {want[1]}]"
                   if t else f"tp_layout records no padding for {cp.container}")
            raise ContentError(f"{cp.key} is [N, K] = [{cp.n}, {cp.k}], its source was [{sp.n}, {sp.k}], and {how}",
                               error_id="reverse.shape_mismatch", tensor=cp.weight.name, file=cp.weight.file,
                               hint="config.json's quantization_config.tp_layout was removed or edited, or the tensor "
                                    "replaced: put back the config.json the conversion wrote, or convert again from "
                                    "the source")


def _refuse_unverified(root: Path) -> None:
    """Never rebuild "original" bytes from a converted checkpoint that no longer matches its manifest."""
    mismatches = verify(root, MANIFEST)
    if mismatches is None:
        raise ContentError(f"{root / MANIFEST} is missing: the checkpoint cannot be verified",
                           error_id="reverse.no_manifest", file=str(root / MANIFEST),
                           hint="only a complete dsv4-convert output can be reversed; convert again from the source")
    if mismatches:
        m = mismatches[0]
        raise ContentError(f"{len(mismatches)} files do not match the manifest, first {m.file} ({m.problem}: "
                           f"{m.detail})", error_id="reverse.manifest_mismatch", file=str(root / m.file),
                           hint="run `dsv4-convert validate` on it for the full list; convert again from the source")


def reverse_checkpoint(src, out: Path, *, workers: int | None = None, force: bool = False,
                       progress: bool = True, executor: ExecutorSpec = ExecutorSpec()) -> ReverseResult:
    from tqdm import tqdm

    start = time.perf_counter()
    ckpt = open_checkpoint(src)
    tree = OutputTree(out, force=force, source=ckpt.root, resumable=False)
    tree.check()  # before any work: OUT must not alias IN, and must be replaceable
    refuse_reserved_names(ckpt.root, converted=True)
    _refuse_unverified(ckpt.root)
    try:
        spec = converted_record(ckpt.config)  # the one strict parser (the plugins use it too)
        target = spec.target
        fmt = source_format(spec.source_format)
        layout = spec.split()
    except (KeyError, ValueError) as e:
        raise ContentError(f"config.json quantization_config is not a dsv4-convert block ({e})",
                           error_id="reverse.bad_config", file=CONFIG,
                           hint="was this checkpoint written by dsv4-convert? (format_version 1 or 2)") from None
    shards, config, lost = _load_record(ckpt.root)
    original = {name: ref for _, refs in shards.values() for name, ref in refs.items()}
    decoded_by, kept_as = {}, {}
    for sp in group_projections(fmt, config, original):
        decoded_by.setdefault(sp.weight.name, []).append((sp, "weight"))
        decoded_by.setdefault(sp.scale.name, []).append((sp, "scale"))
        if sp.global_scale is not None:
            kept_as[sp.global_scale.name] = f"{sp.key}.{fmt.global_rule.kept_as}"
        if sp.input_scale is not None:
            kept_as[sp.input_scale.name] = kept_input_name(sp)
    converted = {p.key: p for p in ckpt.projections}
    check_lost_record(lost, ckpt.root / SOURCE_DIR / LOST, {k for k, p in converted.items() if p.quant is Quant.NVFP4})
    used = {sp.key for uses in decoded_by.values() for sp, _ in uses}
    if unused := sorted(set(converted) - used):  # the record lost shards: the rebuild would drop experts
        bad_record(ckpt.root / SOURCE_DIR / SOURCE_HEADERS, f"it has no source tensors for {len(unused)} converted "
                   f"projections, e.g. {unused[0]}")
    missing = sorted(used - set(converted))
    if missing:
        raise ContentError(f"{len(missing)} projections of the source are not in the converted checkpoint, "
                           f"e.g. {missing[0]}", error_id="reverse.missing_tensor", tensor=missing[0],
                           hint="the converted checkpoint is incomplete or was edited")
    _check_shapes([sp for uses in decoded_by.values() for sp, part in uses if part == "weight"], converted,
                  layout[2] if layout else {})
    job = _Job(str(ckpt.root), target, dict(spec.rescale_factors), lost, converted, ckpt.tensors,
               decoded_by, kept_as, layout[2] if layout else {})
    try:
        tree.open(json.dumps(sorted(shards)))
        run = tree.scratch()
        total = sum(ref.nbytes for ref in original.values())
        bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="restoring", disable=not progress)
        pool = make_executor(executor, auto_workers(workers, total, len(shards)), bar, max_in_flight=workers)
        try:
            pool.check_paths(run, [])
            pool.map(_rebuild_shard, [(job, f, prefix, refs, str(run.tmp(f))) for f, (prefix, refs) in shards.items()],
                     lambda f: tree.take_shard(run, f, sum(r.nbytes for r in shards[f][1].values()) + len(shards[f][0])),
                     reports_progress=True, job_bytes=[sum(r.nbytes for r in refs.values()) for _, refs in shards.values()])
        finally:
            pool.shutdown()
        run.remove()
        bar.close()
        for rel in ckpt.other_files:
            if rel in _GENERATED or rel.startswith(SOURCE_DIR + "/"):
                continue
            tree.copy_in(ckpt.root / rel, rel)
        for name in (CONFIG, HF_QUANT_CONFIG, INDEX_FILE):
            if (ckpt.root / SOURCE_DIR / name).exists():
                tree.copy_in(ckpt.root / SOURCE_DIR / name, name)
        tree.mark_restored()  # "dsv4-convert wrote this", outside the files: a later --force may replace it
        tree.publish()
    except BaseException:
        tree.discard()
        raise
    restored = sum(v.numel() for k, v in lost.items() if k.endswith(".bytes"))
    return ReverseResult(Path(out), len(shards), len(converted), restored, time.perf_counter() - start)

