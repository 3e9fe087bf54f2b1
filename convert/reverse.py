"""marlin-to-source: rebuild the input checkpoint, byte for byte, from a converted one.

The converter keeps what it replaced in `dsv4-convert-source/`: the original config files and index,
every shard's exact header, and the few scale bytes a target clamps. Each original shard is rebuilt
as its header followed by its tensors at their original offsets: passthrough tensors are copied from
the converted checkpoint, FP4 projections are decoded with the exact inverse transforms."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from .errors import ContentError
from .formats.marlin import MarlinTarget, marlin_to_mxfp4, marlin_to_nvfp4
from .pipeline import INDEX, LOST, SOURCE_DIR, _Pool
from .plan import container_of, stack_of
from .reader import load_projection, open_checkpoint
from .safetensors_header import parse_header
from .staging import MANIFEST, Staging
from .tensor_io import PreadReader
from .tensor_model import Checkpoint, Projection, Quant, TensorRef

__all__ = ["ReverseResult", "reverse_checkpoint"]

_GENERATED = {"config.json", "hf_quant_config.json", INDEX, "SERVING.md", MANIFEST}
# original tensor suffix -> where its bytes come from: a decoded part, or a kept tensor of the output
_DECODED = {"weight": "weight", "weight_packed": "weight", "scale": "scale", "weight_scale": "scale"}
_KEPT = {"weight_scale_2": "weight_scale_2", "weight_global_scale": "ct_weight_global_scale",
         "input_scale": "input_scale", "input_global_scale": "input_global_scale"}


@dataclass
class ReverseResult:
    out: Path
    shards: int
    projections: int
    restored_scales: int  # scale bytes the target had clamped, restored from the sidecar
    seconds: float

    def as_dict(self) -> dict:
        return dict(self.__dict__, out=str(self.out))


def _marlin_target(ckpt: Checkpoint) -> tuple[MarlinTarget, dict]:
    block = ckpt.config.get("quantization_config") or {}
    try:
        return MarlinTarget(block["target_engine"], block["act_dtype"], bool(block["w4a8"])), block
    except (KeyError, ValueError) as e:
        raise ContentError(f"config.json quantization_config is not a dsv4-convert block: {e}",
                           error_id="reverse.bad_config", file="config.json",
                           hint="was this checkpoint written by dsv4-convert? (format_version 1)") from None


def _decode(reader, p: Projection, target: MarlinTarget, sf: float, lost: dict) -> dict[str, torch.Tensor]:
    src = load_projection(reader, p)
    if p.quant is Quant.NVFP4:
        weight, scale = marlin_to_nvfp4(src.weight, src.scale, target=target, n=p.n, k=p.k, sf=sf)
        if f"{p.key}.index" in lost:
            flat = scale.view(torch.uint8).reshape(-1)
            flat[lost[f"{p.key}.index"]] = lost[f"{p.key}.bytes"]
    else:
        weight, scale = marlin_to_mxfp4(src.weight, src.scale, target=target, n=p.n, k=p.k)
    return {"weight": weight, "scale": scale}


def _rebuild_shard(root: str, file: str, header_text: str, projections: dict[str, Projection],
                   outputs: dict[str, TensorRef], target, rescale: dict, lost: dict, tmp: str, callback=None):
    raw = header_text.encode()
    prefix = len(raw).to_bytes(8, "little") + raw
    refs, _ = parse_header(prefix, file_size=len(prefix) + _data_size(header_text), file=file)
    with PreadReader(Path(root)) as reader, open(tmp, "wb") as f:
        f.write(prefix)
        cache: tuple[str, dict] | None = None
        for ref in sorted(refs.values(), key=lambda r: r.begin):
            key, _, suffix = ref.name.rpartition(".")
            p = projections.get(key)
            if p is not None and suffix in _DECODED:
                if cache is None or cache[0] != key:
                    sf = rescale.get(f"{container_of(p)}.{stack_of(p)}", 1.0)
                    cache = (key, _decode(reader, p, target, sf, lost))
                data = cache[1][_DECODED[suffix]].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            else:
                name = f"{key}.{_KEPT[suffix]}" if p is not None and suffix in _KEPT else ref.name
                out = outputs.get(name)
                if out is None:
                    raise ContentError(f"the original shard had {ref.name}, but the converted checkpoint has no {name}",
                                       error_id="reverse.missing_tensor", tensor=name, file=file,
                                       hint="the converted checkpoint is incomplete or was edited")
                data = reader.read_bytes(out)
            if f.tell() != ref.begin or len(data) != ref.nbytes:
                raise ContentError(f"{ref.name}: rebuilt {len(data)} bytes at offset {f.tell()}, the original header "
                                   f"says {ref.nbytes} at {ref.begin}", error_id="reverse.layout_mismatch",
                                   tensor=ref.name, file=file, hint="the converted checkpoint was edited")
            f.write(data)
            if callback:
                callback(len(data))
    return file


def reverse_checkpoint(src, out: Path, *, workers: int = 1, force: bool = False, progress: bool = True) -> ReverseResult:
    from tqdm import tqdm

    start = time.perf_counter()
    ckpt = open_checkpoint(src)
    target, block = _marlin_target(ckpt)
    sdir = ckpt.root / SOURCE_DIR
    headers_file = sdir / "headers.json"
    if not headers_file.exists():
        raise ContentError(f"{headers_file} is missing", error_id="reverse.no_source_record", file=str(headers_file),
                           hint="only a complete dsv4-convert output can be reversed; convert again from the source")
    headers = json.loads(headers_file.read_text())
    lost = load_file(sdir / LOST) if (sdir / LOST).exists() else {}
    projections = {p.key: p for p in ckpt.projections}
    rescale = block.get("rescale_factors") or {}
    staging = Staging(Path(out), force=force)
    staging.open(json.dumps(sorted(headers)))
    try:
        total = sum(_data_size(t) for t in headers.values())
        bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="restoring", disable=not progress)
        pool = _Pool(1, bar)  # restoring is I/O bound; one process keeps the progress exact
        args = [(str(ckpt.root), file, text, projections, ckpt.tensors, target, rescale, lost,
                 str(staging.path / file)) for file, text in headers.items()]
        pool.map(_rebuild_shard, args, lambda _: None, reports_progress=True)
        bar.close()
        for rel in ckpt.other_files:
            if rel in _GENERATED or rel.startswith(SOURCE_DIR + "/"):
                continue
            (staging.path / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ckpt.root / rel, staging.path / rel)
        for name in ("config.json", "hf_quant_config.json", INDEX):
            if (sdir / name).exists():
                shutil.copyfile(sdir / name, staging.path / name)
        staging.publish()
    except BaseException:
        staging.discard()
        raise
    restored = sum(v.numel() for k, v in lost.items() if k.endswith(".bytes"))
    return ReverseResult(Path(out), len(headers), len(projections), restored, time.perf_counter() - start)


def _data_size(header_text: str) -> int:
    entries = json.loads(header_text)
    return max((v["data_offsets"][1] for k, v in entries.items() if k != "__metadata__"), default=0)
