"""Work finer than a shard: when there are more workers than shards to write, each shard is cut into
pieces (runs of consecutive output tensors, never inside one projection's outputs) that separate jobs
write at their place in the same file (safetensors_writer.ShardWriter's `part`). Without this, a
layer stored in 4 shards kept 4 of 16 cores busy.

A shard written whole is hashed while it is written (and may go out with O_DIRECT); a shard written
in pieces is hashed once its last piece is in (`seal`), reading it back from the page cache: a
second pass over the bytes, at 10+ GB/s per core, on the machines with cores to spare that split."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from ..runtime.digest import file_digest
from .plan import ShardPlan

__all__ = ["Piece", "split_shards", "seal", "piece_sidecar", "PIECE_MIN_BYTES"]

PIECE_MIN_BYTES = 64 << 20  # a smaller piece costs more in job overhead than its parallelism gives
_PIECES_PER_WORKER = 2  # pieces differ in size and speed: two per worker keeps the tail short


@dataclass(frozen=True, slots=True)
class Piece:
    """Tensors shard.tensors[start:stop] of `shard`; whole when it covers every tensor."""
    shard: ShardPlan
    start: int
    stop: int

    @property
    def whole(self) -> bool:
        return self.start == 0 and self.stop == len(self.shard.tensors)

    @property
    def nbytes(self) -> int:
        return sum(o.spec.nbytes for o in self.shard.tensors[self.start:self.stop])

    @property
    def name(self) -> str:
        return self.shard.file if self.whole else f"{self.shard.file}.p{self.start}"


def _units(shard: ShardPlan) -> list[tuple[int, int]]:
    """[start, stop) runs of tensors a piece may not cut: a projection's outputs are consecutive and
    converted once; a copied tensor stands alone."""
    units: list[tuple[int, int]] = []
    key = None
    for i, o in enumerate(shard.tensors):
        k = o.projection.key if o.source is None else None
        if k is not None and k == key:
            units[-1] = (units[-1][0], i + 1)
        else:
            units.append((i, i + 1))
        key = k
    return units


def split_shards(shards: list[ShardPlan], workers: int, *, min_bytes: int | None = None,
                 auto: bool = False) -> list[Piece]:
    """The jobs for `workers` processes: one whole piece per shard while shards are at least as many
    as workers, else each shard cut into pieces of about total / (2 * workers) bytes (not below
    `min_bytes`). The pieces of a shard are in file order. `auto` (the worker count was not asked
    for): whole shards already while they are at least half as many as workers, with one worker
    each: splitting would at most double the processes, which gains less than `seal`'s second pass
    costs (docs/PERFORMANCE.md: 8 shards on 16 cores, 8 whole 8.3 s, 16 split 9.6 s; 1 shard on 2
    cores, whole 1.37 s, split 1.43 s; 4 shards on 16 cores still split, 3.0 s against 3.5 s)."""
    if workers <= len(shards) * (2 if auto else 1) or not shards:
        return [Piece(s, 0, len(s.tensors)) for s in shards]
    total = sum(s.nbytes for s in shards)
    if min_bytes is None:
        min_bytes = PIECE_MIN_BYTES
    target = max(min_bytes, math.ceil(total / (_PIECES_PER_WORKER * workers)))
    pieces: list[Piece] = []
    for s in shards:
        start = acc = 0
        count = max(1, round(s.nbytes / target))
        size = s.nbytes / count  # even pieces: the last is not a runt
        for a, b in _units(s):
            acc += sum(o.spec.nbytes for o in s.tensors[a:b])
            if acc >= size and b < len(s.tensors):
                pieces.append(Piece(s, start, b))
                start, acc = b, 0
        pieces.append(Piece(s, start, len(s.tensors)))
    return pieces


def piece_sidecar(tmp_path: str, piece: Piece, suffix: str) -> str:
    """Where a piece leaves its sidecar (lost scale bytes): beside the shard's tmp file, named by the
    piece, merged by `seal`."""
    return str(Path(tmp_path).with_name(piece.name)) + suffix


def seal(tmp_path: str, file: str, pieces: list[Piece], suffix: str) -> tuple[str, str, int]:
    """Once every piece of `file` is written: (file, hash, size) of the tmp file, and the pieces'
    sidecars merged into the shard's own (`file + suffix`, as a whole-shard job leaves it)."""
    sidecars = [p for p in (piece_sidecar(tmp_path, pc, suffix) for pc in pieces) if os.path.exists(p)]
    if sidecars:  # rare: lost scale bytes; written by the torch route, so torch is loaded already
        from safetensors.torch import load_file, save_file
        merged: dict = {}
        for p in sidecars:
            merged.update(load_file(p))
        save_file(merged, str(Path(tmp_path).with_name(file)) + suffix)
        for p in sidecars:
            os.unlink(p)
    return file, file_digest(Path(tmp_path)), os.path.getsize(tmp_path)
