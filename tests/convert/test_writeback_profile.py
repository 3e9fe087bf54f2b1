"""The performance seams of the converter (issue 13): the shard writer's buffered path starts
writeback as it writes (a real `sync_file_range` on a real file) without changing a byte, the inline
run (`--workers 1`) gives the same bytes as the pool, and DSV4_CONVERT_PROFILE leaves a per-job breakdown that adds up.
No substitutions: real files, real CLI subprocesses; the byte reference is the pool run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import xxhash

from dsv4_convert.convert import safetensors_writer
from dsv4_convert.convert.safetensors_writer import ShardWriter, TensorSpec
from dsv4_convert.runtime import direct_io, settings
from dsv4_convert.runtime.profiling import breakdown
from dsv4_convert.runtime.settings import PROFILE_ENV
from tests.helpers.cli import run_cli, tree_hashes


def test_writeback_is_started_and_the_bytes_are_unchanged(tmp_path, monkeypatch):
    monkeypatch.setenv(direct_io.DIRECT_IO_ENV, "0")  # the buffered path (O_DIRECT has no writeback to start)
    monkeypatch.setattr(settings, "_current", None)  # parsed again at the next read (then restored)
    assert safetensors_writer._start_writeback is not None, "Linux libc has sync_file_range"
    n = safetensors_writer._KICK + 12345  # more than one kick, and a tail
    data = np.random.default_rng(0).integers(0, 256, size=n, dtype=np.uint8)
    path = tmp_path / "s.safetensors"
    w = ShardWriter(path, [TensorSpec("x", "U8", (n,))], fsync=False)
    w.begin("x")
    for chunk in np.array_split(data, 7):
        w.feed(chunk)
    assert not w.direct_io
    digest, size = w.close()
    raw = path.read_bytes()
    assert size == len(raw) and digest == xxhash.xxh3_128(raw).hexdigest()
    assert raw[-n:] == data.tobytes()
    fd = os.open(path, os.O_WRONLY)  # the call itself succeeds on a real file (returns 0, not -1)
    try:
        assert safetensors_writer._start_writeback(fd, 0, size, safetensors_writer._SYNC_FILE_RANGE_WRITE) == 0
    finally:
        os.close(fd)


def test_inline_and_pool_runs_agree_and_the_profile_adds_up(tmp_path, synth_source):
    src = synth_source("nvfp4-modelopt-dsv4")
    run_cli("nvfp4-to-marlin", src, tmp_path / "pool" / "out", "--workers", "2", "--target", "vllm", "-q")
    prof = tmp_path / "prof"
    run_cli("nvfp4-to-marlin", src, tmp_path / "inline" / "out", "--workers", "1", "--target", "vllm", "-q",
            env={PROFILE_ENV: str(prof)})
    assert tree_hashes(tmp_path / "inline" / "out") == tree_hashes(tmp_path / "pool" / "out")
    marks = [name for name, _ in json.loads((prof / "driver.json").read_text())]
    assert marks == ["start", "rescale", "shards", "finalize", "publish"]
    shards = json.loads((tmp_path / "pool" / "out" / "model.safetensors.index.json").read_text())["weight_map"].values()
    assert {p.stem for p in prof.glob("*.prof")} == set(shards)
    b = breakdown(prof)
    cats = ["read", "weights", "scales", "globals", "hash", "write", "python"]
    assert all(b[c] >= 0 for c in cats) and b["weights"] > 0 and b["scales"] > 0 and b["read"] > 0
    assert sum(b[c] for c in cats) <= b["jobs_wall"] * 1.05 + 0.05  # the categories split the jobs' wall time


def test_every_function_the_profile_counts_exists():
    """A renamed function would silently drop out of its category (the profile still adds up, under "python")."""
    import ast

    from dsv4_convert.runtime.profiling import _CUMULATIVE
    root = Path(__file__).resolve().parents[2]
    for entries in _CUMULATIVE.values():
        for file, name, *_ in entries:
            tree = ast.parse((root / file).read_text())
            assert name in {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}, f"{file}: no {name}"
