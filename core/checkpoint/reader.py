"""Lazy sharded checkpoint reader: config files + safetensors headers -> Checkpoint; tensor data on demand.

`open_checkpoint` reads only config files and shard headers (a 46-shard checkpoint takes seconds) and
checks the index against the shards. `TensorReader` reads tensors with `os.preadv` into numpy arrays
(`array`) or torch tensors (`get`), and raw bytes for byte-identical copies. `load_projection` turns
one Projection into plain tensors in one convention, whatever the source format.
torch is imported where a tensor is made, not here: the converter's CPU path reads with `array` and
never needs it (convert/cpu_path.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..files import CONFIG, HF_QUANT_CONFIG, INDEX_FILE, SINGLE_FILE, SOURCE_DIR
from ..sources.detect import detect_format
from ..sources.grouping import group_projections
from ..sources.source_formats import SourceFormat, global_rule_of
from .gc_pause import builds_tables
from .index import check_index, listing, natural_key, read_json, read_weight_map
from .safetensors_header import read_header
from .source_location import LEFT_OUT_DIRS, is_download_metadata, resolve_source
from .tensor_model import Checkpoint, Projection, Quant, TensorRef

__all__ = ["ProjectionData", "TensorReader", "load_projection", "open_checkpoint"]

# ------------------------------------------------------------------------------------------- checkpoint
@builds_tables  # 10^5 acyclic objects: no garbage collection while they are built
def open_checkpoint(source: str | Path) -> Checkpoint:
    """Read config files, the index and every shard header (no tensor data); detect the format and
    group the FP4 projections. Raises InputError for unreadable input and ContentError for content
    that is not a checkpoint this tool understands."""
    root = resolve_source(source)
    config = read_json(root / CONFIG, missing_id="config.missing", bad_id="config.not_json",
                       what=CONFIG)
    hf_quant = read_json(root / HF_QUANT_CONFIG, missing_id=None, bad_id="hf_quant_config.not_json",
                         what=HF_QUANT_CONFIG)
    if (root / INDEX_FILE).exists():
        weight_map = read_weight_map(root)
        shards = sorted(set(weight_map.values()), key=natural_key)
        odd = [s for s in shards if (root / s).exists() and not (root / s).is_file()]
        if odd:  # a directory or a FIFO is there: "does not exist" would send the user the wrong way
            raise InputError(f"the index names {len(odd)} shards that are not regular files (a directory, FIFO "
                             f"or device): {listing(odd)}", error_id="index.shard_not_a_file",
                             file=str(root / odd[0]), hint="replace each with the real .safetensors file")
        absent = [s for s in shards if not (root / s).is_file()]
        if absent:
            raise InputError(f"the index names {len(absent)} shard files that do not exist: {listing(absent)}",
                             error_id="index.missing_shard", file=str(root / absent[0]),
                             hint="the download is incomplete: re-download the missing shards")
        index_file: str | None = INDEX_FILE
    elif (root / SINGLE_FILE).is_file():
        weight_map, shards, index_file = None, [SINGLE_FILE], None
    else:
        stray = sorted(p.name for p in root.glob("*.safetensors"))
        raise InputError(f"{root} has no {INDEX_FILE} and no {SINGLE_FILE}"
                         + (f" (found {listing(stray)})" if stray else ""),
                         error_id="checkpoint.no_weights", file=str(root),
                         hint="pass a Hugging Face style checkpoint directory; sharded weights need their index")
    headers = {shard: read_header(root / shard, file=shard)[0] for shard in shards}
    if weight_map is not None:
        check_index(root, weight_map, headers)
    tensors = {name: ref for refs in headers.values() for name, ref in refs.items()}
    fmt, reason = detect_format(config, hf_quant, tensors)
    projections = group_projections(fmt, config, tensors)
    skip = set(shards) | ({INDEX_FILE} if index_file else set())
    entries = [p.relative_to(root) for p in root.rglob("*")]
    entries = [f for f in entries if f.as_posix() not in skip and not is_download_metadata(f)]
    _refuse_unreadable_files(root, [f for f in entries if f.parts[0] not in LEFT_OUT_DIRS])
    files = [f for f in entries if (root / f).is_file()]
    others = sorted(f.as_posix() for f in files if f.parts[0] not in LEFT_OUT_DIRS)
    left_out = sorted(f.as_posix() for f in files if f.parts[0] in LEFT_OUT_DIRS)
    return Checkpoint(root=root, format=fmt, config=config, hf_quant_config=hf_quant, tensors=tensors,
                      projections=projections, other_files=tuple(others), left_out=tuple(left_out),
                      index_file=index_file,
                      format_reason=reason)


def _refuse_unreadable_files(root: Path, entries: list[Path]) -> None:
    """Every non-weight file is copied byte for byte, so each must be one: a dangling symlink (a Hub
    snapshot with a lost blob), a FIFO or a device is refused by name, never dropped in silence; a
    `.safetensors` outside the index (GLM's mtp.safetensors) must be a readable safetensors file."""
    for rel in entries:
        p = root / rel
        if p.is_dir() and rel.suffix != ".safetensors" or p.is_file() and rel.suffix != ".safetensors":
            continue
        what = ("a directory" if p.is_dir() else "a dangling symlink" if p.is_symlink() and not p.exists()
                else None if p.is_file() else "a FIFO, socket or device")
        if what is not None:
            raise InputError(f"{rel.as_posix()} in {root} is {what}: every file beside the weights is copied byte "
                             "for byte, and this one cannot be", error_id="input.not_a_regular_file", file=str(p),
                             hint="restore the file (a Hub snapshot's lost blob: download it again), or remove it")
        if rel.parts[0] != SOURCE_DIR:  # the tool's own reverse record: marlin-to-source checks it, naming it
            read_header(p, file=rel.as_posix())  # a weights file the index does not list: it must be one


# ----------------------------------------------------------------------------------------------- tensors
class TensorReader:
    """Reads tensors of one checkpoint root with pread, keeping one file descriptor per shard.

    No memory map: a long conversion or validation touches every byte of a 150 GB checkpoint, and
    mapped pages count toward the process's RSS; with pread, memory stays at the tensors in flight."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self._fds: dict[str, int] = {}

    def __enter__(self) -> TensorReader:  # noqa: PYI034 (Self needs 3.11)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def _error(self, ref: TensorRef, problem: str) -> InputError:
        return InputError(f"cannot read {ref.name} from {self.root / ref.file}: {problem}",
                          error_id="reader.unreadable", tensor=ref.name, file=str(self.root / ref.file),
                          hint="the shard is truncated, changed or vanished since its header was read: "
                               "re-download it, or re-open the checkpoint")

    def iter_bytes(self, ref: TensorRef, chunk: int = 16 << 20):
        """The tensor's raw bytes in chunks (large passthrough tensors are copied this way)."""
        try:
            fd = self._fds.get(ref.file)
            if fd is None:
                fd = self._fds[ref.file] = os.open(self.root / ref.file, os.O_RDONLY)
            pos = ref.begin
            while pos < ref.end:
                data = os.pread(fd, min(chunk, ref.end - pos), pos)
                if not data:
                    raise self._error(ref, f"the file ends at byte {pos}, the tensor at {ref.end}")
                pos += len(data)
                yield data
        except OSError as e:
            raise self._error(ref, e.strerror or str(e)) from None

    def _read_into(self, ref: TensorRef, view: memoryview) -> None:
        """The tensor's bytes straight into `view` (one copy, from the page cache)."""
        try:
            fd = self._fds.get(ref.file)
            if fd is None:
                fd = self._fds[ref.file] = os.open(self.root / ref.file, os.O_RDONLY)
            pos = 0
            while pos < len(view):
                n = os.preadv(fd, [view[pos:]], ref.begin + pos)
                if not n:
                    raise self._error(ref, f"the file ends at byte {ref.begin + pos}, the tensor at {ref.end}")
                pos += n
        except OSError as e:
            raise self._error(ref, e.strerror or str(e)) from None

    def read_bytes(self, ref: TensorRef) -> bytes:
        """The tensor's raw bytes, straight from the file (for byte-identical copies)."""
        return b"".join(self.iter_bytes(ref))

    def array(self, ref: TensorRef) -> np.ndarray:
        """The tensor's bytes as a flat uint8 array (one copy, from the page cache)."""
        flat = np.empty(ref.nbytes, dtype=np.uint8)  # not zero-filled: every byte is read into it
        if ref.nbytes:
            self._read_into(ref, memoryview(flat))
        return flat

    def expert_array(self, ref: TensorRef, index: int) -> np.ndarray:
        """The bytes of slab `index` of a tensor stacked along dim 0 (gpt-oss experts), reading only those."""
        slab = ref.nbytes // ref.shape[0]
        return self.array(TensorRef(ref.name, ref.file, ref.dtype, tuple(ref.shape[1:]), ref.begin + index * slab,
                                    ref.begin + (index + 1) * slab))

    def get(self, ref: TensorRef):
        """The tensor as a torch tensor in its stored dtype (I8 stays int8, F8_E8M0 is float8_e8m0fnu)."""
        return _as_tensor(self.array(ref), ref.dtype, ref.shape)

    def get_expert(self, ref: TensorRef, index: int):
        """Slab `index` of a tensor stacked along dim 0 (gpt-oss experts), reading only its bytes."""
        return _as_tensor(self.expert_array(ref, index), ref.dtype, ref.shape[1:])


def _as_tensor(flat: np.ndarray, dtype: str, shape):
    import torch

    from .tensor_io import TORCH_DTYPES
    t = torch.from_numpy(flat) if flat.size else torch.empty(0, dtype=torch.uint8)  # numpy's empty: stride 0
    return t.view(TORCH_DTYPES[dtype]).reshape(shape)


# ----------------------------------------------------------------------------------------- projections
@dataclass
class ProjectionData:
    """One projection in one convention, whatever the source format.

    weight: uint8 [N, K/2] packed E2M1 codes (Marlin sources: int32 [K/16, 2N] as stored).
    scale: NVFP4 float8_e4m3fn [N, K/16]; MXFP4 uint8 E8M0 bytes [N, K/32] (Marlin: as stored, [K/g, N]).
    global_scale: float32 0-d, ModelOpt convention (a multiplier): `weight_scale_2`, or for
        compressed-tensors `1 / max(weight_global_scale)`; for Marlin sources the kept original
        `weight_scale_2`; None for MXFP4.
    input_scale: as stored (ModelOpt `input_scale`; compressed-tensors `input_global_scale`, which is
        a reciprocal), or None."""
    weight: "torch.Tensor"  # noqa: F821 (torch is imported on use)
    scale: "torch.Tensor"  # noqa: F821
    global_scale: "torch.Tensor | None"  # noqa: F821
    input_scale: "torch.Tensor | None"  # noqa: F821


def load_projection(reader: TensorReader, proj: Projection, *, fmt: SourceFormat | None = None) -> ProjectionData:
    """Read one projection: I8 -> U8 view, E8M0 -> bytes, gpt-oss expert selection, gate/up
    de-interleave (rows `row_start::row_step`) and block reshape. `fmt` is only needed to tell a
    compressed-tensors global (a divisor) from a ModelOpt one; without it the tensor name decides."""
    import torch

    from ...formats.nvfp4 import global_from_ct
    if proj.expert_index is not None:  # one expert's slab of a stacked tensor, then its rows
        weight, scale = (reader.get_expert(ref, proj.expert_index) for ref in (proj.weight, proj.scale))
        if proj.k_major:  # [K/2, rows] -> [rows, K/2]: the per-expert layout
            weight, scale = weight.t(), scale.t()
        weight, scale = weight[proj.rows].contiguous(), scale[proj.rows].contiguous()
        weight = weight.reshape(weight.shape[0], -1)
    else:
        weight = reader.get(proj.weight)
        scale = reader.get(proj.scale)
    if proj.marlin_global is not None or weight.dtype == torch.int32:
        g = reader.get(proj.global_scale).float().reshape(()) if proj.global_scale is not None else None
        inp = reader.get(proj.input_scale) if proj.input_scale is not None else None
        return ProjectionData(weight=weight, scale=scale, global_scale=g, input_scale=inp)
    weight = weight.contiguous().view(torch.uint8)
    if proj.quant is Quant.MXFP4:
        scale = scale.contiguous().view(torch.uint8)
    elif scale.dtype != torch.float8_e4m3fn:
        scale = scale.contiguous().view(torch.float8_e4m3fn)
    global_scale = None
    if proj.global_scale is not None:
        g = reader.get(proj.global_scale).float()
        rule = fmt.global_rule if fmt is not None else global_rule_of(proj.global_scale.name)
        global_scale = global_from_ct(g) if rule and rule.reciprocal else g.reshape(())
    input_scale = reader.get(proj.input_scale) if proj.input_scale is not None else None
    return ProjectionData(weight=weight.contiguous(), scale=scale.contiguous(), global_scale=global_scale,
                          input_scale=input_scale)
