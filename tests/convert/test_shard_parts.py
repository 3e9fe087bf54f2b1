"""A shard written in parts (convert/pieces.py: several jobs, each its run of tensors at its place in
the file) is the file one writer makes: written in any order of parts, through the shared mapping
(moving its window inside a part and inside one tensor) and through the pwrite fallback; the parts
check their tensors against the header like the whole-shard writer does.

Substitutions: the mapping window is made 64 KiB (monkeypatch of safetensors_writer._WINDOW, 64 MiB)
so that a test of a few hundred KiB moves it; the pwrite fallback is forced by making
posix_fallocate answer EOPNOTSUPP (what filesystems without it answer); both are what the writer
does on a real-size layer and on such a filesystem, with real files."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from dsv4_convert.convert import safetensors_writer
from dsv4_convert.convert.safetensors_writer import ShardWriter, TensorSpec, header_bytes
from dsv4_convert.runtime.digest import file_digest

SIZES = [3, 70_001, 1, 200_000, 0, 65_536, 131_075, 9]  # bytes: tensors across, inside and beyond a window


def _specs():
    return [TensorSpec(f"t{i}", "U8", (n,)) for i, n in enumerate(SIZES)]


def _data():
    rng = np.random.default_rng(7)
    return [rng.integers(0, 256, n, dtype=np.uint8) for n in SIZES]


def _whole(path):
    w = ShardWriter(path, _specs(), {"format": "pt"}, fsync=False)
    for spec, d in zip(_specs(), _data()):
        w.write(spec.name, d)
    return w.close()


@pytest.fixture(params=["mapped", "pwrite"])
def sink(request, monkeypatch):
    monkeypatch.setattr(safetensors_writer, "_WINDOW", 64 << 10)
    if request.param == "pwrite":
        def refuse(fd, offset, length):
            raise OSError(errno.EOPNOTSUPP, "not supported")
        monkeypatch.setattr(os, "posix_fallocate", refuse)
    return request.param


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 0, 1), (1, 2, 0)])
def test_parts_in_any_order_make_the_whole_file(tmp_path, sink, order, monkeypatch):
    sha, size = _whole(tmp_path / "whole")
    cuts = [(0, 2), (2, 5), (5, len(SIZES))]
    data = _data()
    for k in order:
        a, b = cuts[k]
        w = ShardWriter(tmp_path / "parts", _specs(), {"format": "pt"}, fsync=False, part=(a, b))
        assert w._sink.__class__.__name__ == ("_MappedSink" if sink == "mapped" else "_BufferedSink")
        for spec, d in zip(_specs()[a:b], data[a:b]):
            w.write(spec.name, d)
        got_sha, written = w.close()
        header = len(header_bytes(_specs(), {"format": "pt"})) if a == 0 else 0  # part 0 writes the header
        assert got_sha is None and written == header + sum(SIZES[a:b])
    assert (tmp_path / "parts").read_bytes() == (tmp_path / "whole").read_bytes()
    assert file_digest(tmp_path / "parts") == sha and os.path.getsize(tmp_path / "parts") == size


def test_a_part_refuses_tensors_of_another_part(tmp_path, sink):
    w = ShardWriter(tmp_path / "p", _specs(), fsync=False, part=(2, 5))
    with pytest.raises(RuntimeError, match="expected tensor t2 next, got t0"):
        w.write("t0", _data()[0])
    w.write("t2", _data()[2])
    with pytest.raises(RuntimeError, match="never written"):
        w.close()
    w.abort()
