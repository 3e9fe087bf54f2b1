"""The streaming shard writer: what it writes is read back byte-identical by safetensors itself,
for every dtype the converter emits, and it refuses to write anything its header did not promise.
Every test runs on both write paths: O_DIRECT (where the filesystem takes it) and the page cache
(DSV4_CONVERT_DIRECT_IO=0); tests/runtime/test_direct_io.py compares the two byte for byte."""

from __future__ import annotations

import pytest
import torch
import xxhash
from safetensors import safe_open

from dsv4_convert.convert.safetensors_writer import ShardWriter, TensorSpec
from dsv4_convert.core.checkpoint.reader import TensorReader
from dsv4_convert.core.checkpoint.safetensors_header import read_header
from dsv4_convert.core.checkpoint.tensor_io import safetensors_dtype
from dsv4_convert.runtime import direct_io, settings
from dsv4_convert.runtime.digest import HASH_ALGORITHM
from tests.helpers.compare import assert_bytes_equal

DTYPES = [torch.float8_e4m3fn, torch.float8_e8m0fnu, torch.int32, torch.uint8, torch.int8, torch.bfloat16,
          torch.float16, torch.float32, torch.int64]


@pytest.fixture(autouse=True, params=["direct", "buffered"])
def io_path(request, monkeypatch):
    monkeypatch.setenv(direct_io.DIRECT_IO_ENV, "1" if request.param == "direct" else "0")
    monkeypatch.setattr(settings, "_current", None)  # parsed again at the next read (then restored)
    return request.param


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    out = {}
    for i, dt in enumerate(DTYPES):
        raw = torch.randint(0, 256, (3, 5 * torch.empty(0, dtype=dt).element_size()), generator=g, dtype=torch.uint8)
        out[f"t{i}.{str(dt).split('.')[-1]}"] = raw.view(dt)
    out["scalar"] = torch.tensor(1.5, dtype=torch.float32)  # 0-d, like weight_scale_2
    out["empty"] = torch.empty(0, 4, dtype=torch.bfloat16)
    return out


def test_write_then_read_is_byte_identical(tmp_path):
    tensors = _tensors()
    path = tmp_path / "model.safetensors"
    specs = [TensorSpec(n, safetensors_dtype(t), tuple(t.shape)) for n, t in tensors.items()]
    w = ShardWriter(path, specs, {"format": "pt", "marlin_layout": "sglang-L2"})
    for name, t in tensors.items():
        w.write(name, t.contiguous().reshape(-1).view(torch.uint8).numpy())
    sha, size = w.close()
    assert HASH_ALGORITHM == "xxh3_128"  # the independent reference below is that algorithm
    assert sha == xxhash.xxh3_128(path.read_bytes()).hexdigest() and size == path.stat().st_size
    with safe_open(path, "pt") as f:
        assert f.metadata() == {"format": "pt", "marlin_layout": "sglang-L2"}
        assert list(f.keys()) == sorted(tensors)
        for name, t in tensors.items():
            assert_bytes_equal(f.get_tensor(name), t, name)
    refs, _ = read_header(path)  # our own strict parser agrees too
    with TensorReader(tmp_path) as r:
        for name, t in tensors.items():
            assert_bytes_equal(r.get(refs[name]), t, name)
    assert (8 + int.from_bytes(path.read_bytes()[:8], "little")) % 8 == 0, "header padded to 8 bytes"


def test_streaming_in_chunks_equals_one_write(tmp_path):
    t = torch.arange(1000, dtype=torch.int32)
    spec = [TensorSpec("x", "I32", (1000,))]
    a, b = ShardWriter(tmp_path / "a", spec), ShardWriter(tmp_path / "b", spec, fsync=False)
    a.write("x", t.numpy())
    b.begin("x")
    for chunk in t.view(torch.uint8).split(333):
        b.feed(chunk.numpy())
    assert a.close() == b.close()


def test_refuses_what_the_header_did_not_promise(tmp_path):
    specs = [TensorSpec("a", "F32", (2,)), TensorSpec("b", "U8", (3,))]
    w = ShardWriter(tmp_path / "s", specs)
    with pytest.raises(RuntimeError, match="expected tensor a next"):
        w.write("b", bytes(3))
    with pytest.raises(RuntimeError, match="header says 8"):
        w.write("a", bytes(4))
    w = ShardWriter(tmp_path / "s2", specs)
    w.write("a", bytes(8))
    with pytest.raises(RuntimeError, match="never written"):
        w.close()
    with pytest.raises(ValueError, match="not writable"):
        ShardWriter(tmp_path / "s3", [TensorSpec("c", "F4", (2,))])
