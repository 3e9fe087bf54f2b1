"""When the converter cuts shards into pieces (convert/pieces.py split_shards): with the worker count
asked for, as soon as there are fewer shards than workers; with the automatic count, only when cutting
more than doubles the processes (below that, `seal`'s second pass over the bytes costs more than the
extra processes give: docs/PERFORMANCE.md). Plain shard plans of copied tensors, no files."""

from __future__ import annotations

import pytest

from dsv4_convert.convert.pieces import split_shards
from dsv4_convert.convert.plan import OutTensor, ShardPlan
from dsv4_convert.convert.safetensors_writer import TensorSpec
from dsv4_convert.core.checkpoint.tensor_model import TensorRef

MIB = 1 << 20


def _shards(count: int, tensors: int = 8, size: int = 64 * MIB) -> list[ShardPlan]:
    shards = []
    for s in range(count):
        file = f"model-{s:05d}.safetensors"
        shards.append(ShardPlan(file, tuple(
            OutTensor(TensorSpec(f"s{s}.t{i}", "U8", (size,)), source=TensorRef(f"s{s}.t{i}", file, "U8", (size,),
                                                                                  i * size, (i + 1) * size))
            for i in range(tensors))))
    return shards


@pytest.mark.parametrize("shards, workers, auto, split", [
    (8, 16, True, False),   # half as many shards as workers: whole, one worker each
    (1, 2, True, False),
    (4, 16, True, True),    # a quarter: cutting quadruples the processes
    (1, 3, True, True),
    (8, 16, False, True),   # --workers 16 asked for: every worker gets work
    (1, 2, False, True),
    (16, 16, False, False),
    (16, 16, True, False),
])
def test_when_shards_are_cut(shards, workers, auto, split):
    plan = _shards(shards)
    pieces = split_shards(plan, workers, auto=auto)
    assert any(not p.whole for p in pieces) is split
    assert len(pieces) >= (workers if split else shards)
    for s in plan:  # whatever the cut, each shard's pieces cover it once, in file order
        mine = [p for p in pieces if p.shard is s]
        assert [p.start for p in mine][0] == 0 and mine[-1].stop == len(s.tensors)
        assert all(a.stop == b.start for a, b in zip(mine, mine[1:]))
