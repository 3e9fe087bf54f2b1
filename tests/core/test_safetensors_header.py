import json
import struct

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from dsv4_convert.core.checkpoint.safetensors_header import parse_header, read_header
from dsv4_convert.core.errors import InputError


def _raw(path, header, data: bytes = b"", *, pad: bool = True) -> None:
    """Write a safetensors-like file by hand: `header` is a dict or the raw header bytes."""
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


def _entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def _fails(path, error_id: str) -> InputError:
    with pytest.raises(InputError) as info:
        read_header(path)
    e = info.value
    assert e.error_id == error_id, e.render()
    assert path.name in e.message and e.file == str(path)
    assert FIXES.get(error_id, "re-download or re-export this shard") in e.hint, e.render()
    return e


# the fix each refusal must give (docs/ERRORS.md); every other header error says to re-download or
# re-export the shard, since no safetensors writer produces it
FIXES = {
    "header.unknown_dtype": "upgrade dsv4-convert if this is a newer safetensors dtype",
    "header.offsets_past_eof": "re-download this shard (an interrupted download leaves a short file)",
}


def test_real_file_offsets_are_absolute_and_match_safetensors(tmp_path):
    tensors = {
        "a": torch.arange(12, dtype=torch.int8).reshape(3, 4),
        "scale": torch.tensor([1, 127, 254], dtype=torch.uint8).view(torch.float8_e8m0fnu),
        "g": torch.tensor(0.5, dtype=torch.float32),
        "empty": torch.zeros(0, 4, dtype=torch.bfloat16),
        "w": torch.randn(4, 8).to(torch.float8_e4m3fn),
    }
    path = tmp_path / "x.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    refs, meta = read_header(path)
    assert meta == {"format": "pt"}
    assert set(refs) == set(tensors)
    raw = path.read_bytes()
    begins = [r.begin for r in refs.values()]
    assert begins == sorted(begins), "tensors come in data order"
    with safe_open(str(path), framework="pt") as f:
        for name, ref in refs.items():
            t = f.get_tensor(name)
            assert ref.file == "x.safetensors"
            assert ref.shape == tuple(t.shape)
            assert raw[ref.begin:ref.end] == t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    assert refs["g"].shape == () and refs["g"].dtype == "F32"
    assert refs["scale"].dtype == "F8_E8M0"


def test_every_truncation_is_a_clean_input_error(tmp_path):
    full = tmp_path / "full.safetensors"
    save_file({"a": torch.ones(3, 5), "b": torch.zeros(7, dtype=torch.int8)}, str(full))
    raw = full.read_bytes()
    cut = tmp_path / "cut.safetensors"
    for n in range(len(raw)):
        cut.write_bytes(raw[:n])
        with pytest.raises(InputError) as info:
            read_header(cut)
        assert info.value.error_id.startswith("header."), (n, info.value.error_id)


def test_too_short(tmp_path):
    p = tmp_path / "s.safetensors"
    p.write_bytes(b"\x01\x02")
    _fails(p, "header.too_short")


def test_length_past_eof(tmp_path):
    p = tmp_path / "s.safetensors"
    p.write_bytes(struct.pack("<Q", 10_000) + b"{}")
    e = _fails(p, "header.length_past_eof")
    assert "10000" in e.message


def test_too_large_is_refused_before_reading(tmp_path):
    p = tmp_path / "s.safetensors"
    p.write_bytes(struct.pack("<Q", 2**62) + b"{}")
    _fails(p, "header.too_large")


def test_not_utf8(tmp_path):
    p = tmp_path / "s.safetensors"
    _raw(p, b'{"a\xff": 1}')
    _fails(p, "header.not_utf8")


def test_bad_json(tmp_path):
    p = tmp_path / "s.safetensors"
    _raw(p, b'{"a": {"dtype": "F32",')
    _fails(p, "header.not_json")


def test_not_an_object(tmp_path):
    p = tmp_path / "s.safetensors"
    _raw(p, b"[1, 2]")
    _fails(p, "header.not_object")


def test_duplicate_keys(tmp_path):
    p = tmp_path / "s.safetensors"
    e = _entry("U8", [2], 0, 2)
    _raw(p, f'{{"a": {json.dumps(e)}, "a": {json.dumps(e)}}}'.encode(), b"\0\0")
    err = _fails(p, "header.duplicate_key")
    assert err.tensor == "a"


# The header is decoded without a duplicate-key hook first and counted (core/checkpoint/safetensors_header.py
# _no_key_lost); these are the cases that count must send to the exact, hooked decode.
@pytest.mark.parametrize("text, key", [
    ('{"a":{"dtype":"U8","dtype":"U8","shape":[2],"data_offsets":[0,2]}}', "dtype"),  # inside an entry
    ('{"__metadata__":{"k":"v","k":"w"},"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}', "k"),
    ('{"a:b":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"a:b":{"dtype":"U8","shape":[2],'
     '"data_offsets":[0,2]}}', "a:b"),  # a colon in the name (the count cannot tell)
    ('{"a"  :{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"a"\n:{"dtype":"U8","shape":[2],'
     '"data_offsets":[0,2]}}', "a"),  # whitespace before the colons
    ('{"x":{"dtype":"U8","dtype":"U8","shape":[2],"data_offsets":[0,2]},"y":{"dtype":"Q9","shape":[1],'
     '"data_offsets":[2,3]}}', "dtype"),  # and an unknown dtype after it: the duplicate is named first
])
def test_duplicate_keys_at_every_level(tmp_path, text, key):
    p = tmp_path / "s.safetensors"
    _raw(p, text.encode(), b"\0\0")
    err = _fails(p, "header.duplicate_key")
    assert repr(key) in err.message


def test_names_and_metadata_with_colons_are_read(tmp_path):
    """A `:` inside a name or a metadata value is not a key (the count falls back to the exact decode)."""
    p = tmp_path / "s.safetensors"
    _raw(p, {"__metadata__": {"note": "a: b"}, "x:y": _entry("U8", [2], 0, 2)}, b"\0\0")
    tensors, meta = read_header(p)
    assert list(tensors) == ["x:y"] and meta == {"note": "a: b"}


def test_unknown_dtype(tmp_path):
    p = tmp_path / "s.safetensors"
    _raw(p, {"w": _entry("F3", [4], 0, 4)}, b"\0" * 4)
    err = _fails(p, "header.unknown_dtype")
    assert err.tensor == "w" and "'F3'" in err.message


@pytest.mark.parametrize("entry", [
    {"dtype": "U8", "shape": [2]},
    {"dtype": "U8", "shape": [-1], "data_offsets": [0, 2]},
    {"dtype": "U8", "shape": [2], "data_offsets": [2, 0]},
    {"dtype": 5, "shape": [2], "data_offsets": [0, 2]},
    {"dtype": "U8", "shape": [2], "data_offsets": [0, 2], "extra": 1},
    "not an object",
])
def test_bad_entry(tmp_path, entry):
    p = tmp_path / "s.safetensors"
    _raw(p, {"w": entry}, b"\0\0")
    _fails(p, "header.bad_entry")


def test_shape_size_mismatch(tmp_path):
    p = tmp_path / "s.safetensors"
    _raw(p, {"w": _entry("F32", [2, 2], 0, 12)}, b"\0" * 12)
    err = _fails(p, "header.shape_size_mismatch")
    assert "16 bytes" in err.message and "12 bytes" in err.message


def test_overlapping_offsets(tmp_path):
    p = tmp_path / "s.safetensors"
    _raw(p, {"a": _entry("U8", [4], 0, 4), "b": _entry("U8", [4], 2, 6)}, b"\0" * 6)
    err = _fails(p, "header.offsets_overlap")
    assert err.tensor == "b" and "'a'" in err.message


def test_hole_between_tensors(tmp_path):
    p = tmp_path / "s.safetensors"
    _raw(p, {"a": _entry("U8", [4], 0, 4), "b": _entry("U8", [4], 6, 10)}, b"\0" * 10)
    _fails(p, "header.offsets_hole")


def test_data_shorter_than_declared(tmp_path):
    p = tmp_path / "s.safetensors"
    _raw(p, {"a": _entry("U8", [4], 0, 4), "b": _entry("U8", [4], 4, 8)}, b"\0" * 5)
    err = _fails(p, "header.offsets_past_eof")
    assert err.tensor == "b" and "truncated" in err.message


def test_trailing_bytes(tmp_path):
    p = tmp_path / "s.safetensors"
    _raw(p, {"a": _entry("U8", [4], 0, 4)}, b"\0" * 9)
    err = _fails(p, "header.data_size_mismatch")
    assert "5 trailing bytes" in err.message


@pytest.mark.parametrize("meta", [{"format": 1}, ["x"], {"a": None}])
def test_bad_metadata(tmp_path, meta):
    p = tmp_path / "s.safetensors"
    _raw(p, {"__metadata__": meta, "a": _entry("U8", [1], 0, 1)}, b"\0")
    _fails(p, "header.bad_metadata")


def test_f4_uses_the_logical_element_count(tmp_path):
    p = tmp_path / "s.safetensors"
    _raw(p, {"w": _entry("F4", [4, 8], 0, 16)}, b"\0" * 16)
    refs, _ = read_header(p)
    assert refs["w"].nbytes == 16 and refs["w"].shape == (4, 8)
    _raw(p, {"w": _entry("F4", [3], 0, 2)}, b"\0" * 2)  # 12 bits is not a whole number of bytes
    _fails(p, "header.shape_size_mismatch")


def test_parse_header_names_the_given_file():
    buf = struct.pack("<Q", 2) + b"{}"
    refs, meta = parse_header(buf, file_size=len(buf), file="model-00001-of-00002.safetensors")
    assert refs == {} and meta == {}
    with pytest.raises(InputError) as info:
        parse_header(buf, file_size=len(buf) + 3, file="model-00001-of-00002.safetensors")
    assert info.value.error_id == "header.data_size_mismatch"
    assert "model-00001-of-00002.safetensors" in info.value.message


def test_unreadable_file(tmp_path):
    with pytest.raises(InputError) as info:
        read_header(tmp_path / "absent.safetensors")
    assert info.value.error_id == "header.unreadable"


def test_tensor_refs_are_built_as_the_dataclass_builds_them():
    """parse_header builds TensorRefs through their slots (core/checkpoint/safetensors_header.py _tensor_ref): the same
    object as TensorRef(...) in every field; a field added to TensorRef fails here until _tensor_ref sets it."""
    from dataclasses import astuple

    from dsv4_convert.core.checkpoint.safetensors_header import _tensor_ref
    from dsv4_convert.core.checkpoint.tensor_model import TensorRef
    args = ("layers.0.ffn.experts.1.w1.weight", "model-00001.safetensors", "U8", (2, 8), 80, 96)
    fast, slow = _tensor_ref(*args), TensorRef(*args)
    assert fast == slow and astuple(fast) == astuple(slow) == args and hash(fast) == hash(slow)

