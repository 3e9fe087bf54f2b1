"""Strict safetensors header parser (no torch): 8-byte little-endian length, JSON header, data buffer.

Every rule of the format is checked (docs/spec/CHECKPOINT_FORMATS.md §2.1) so that a corrupt or truncated
shard fails here, naming the file, the tensor and the fix, instead of producing a wrong tensor later:
known dtypes, shape x element size == byte range, offsets contiguous from 0 (no hole, no overlap),
the data buffer exactly covered (no trailing bytes) and inside the file, no duplicate keys,
`__metadata__` a str -> str map. Every header the reference implementation (the `safetensors` library)
refuses is refused here too, typed (tests/reliability/test_header_differential.py feeds both the same
generated headers): strings are valid UTF-8 (no lone `\\ud800` escape), shapes and offsets are
unsigned 64-bit integers (no `-0`, nothing past 2**64 - 1, and the element and bit counts, multiplied
left to right, never pass it either). Stricter than the library, on purpose: a key named twice (readers
disagree on which one wins), an entry key besides dtype, shape, data_offsets, and a header that does not
start with `{` (the format's rule; the library 0.8 reads leading whitespace).

Sub-byte dtypes (`F4`, `F6_E2M3`, `F6_E3M2`) are accepted: the header records the *logical* element
count, so the byte size is numel * bits / 8, which must be a whole number. Offsets in the returned
TensorRefs are absolute file offsets (8 + header length + relative offset).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import operator
import os
import re
import struct
from pathlib import Path

from ..errors import InputError
from .dtypes import DTYPE_SIZES, SUB_BYTE_BITS
from .index import lone_surrogate
from .tensor_model import TensorRef

__all__ = ["MAX_HEADER_SIZE", "dtype_bits", "parse_header", "read_header"]

MAX_HEADER_SIZE = 100_000_000  # the reference implementation's hard limit
_NEGATIVE_ZERO = re.compile(r"[\[,:][ \t\n\r]*-0")  # where a number -0 can start (or, rarely, inside a string)
_MAX_U64 = (1 << 64) - 1  # the reference reads shapes and offsets as u64 and refuses a product past it
_ENTRY_KEYS = {"dtype", "shape", "data_offsets"}
_REWRITE = "re-download or re-export this shard; a safetensors writer never produces this"


def dtype_bits(dtype: str) -> int | None:
    """Bits per element of a safetensors dtype string, or None when unknown."""
    if dtype in DTYPE_SIZES:
        return DTYPE_SIZES[dtype] * 8
    return SUB_BYTE_BITS.get(dtype)


def _err(error_id: str, message: str, *, file: str, tensor: str | None = None,
         hint: str = _REWRITE) -> InputError:
    return InputError(f"{file}: {message}", error_id=error_id, file=file, tensor=tensor, hint=hint)


class _DuplicateKey(Exception):
    def __init__(self, key: str):
        self.key = key


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return out


def _is_uint(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _numel(shape: list[int]) -> int | None:
    """The element count as the reference computes it, left to right; None when a partial product
    passes 2**64 - 1, even with a 0 further on (it refuses those: an overflow)."""
    numel = 1
    for d in shape:
        numel *= d
        if numel > _MAX_U64:
            return None
    return numel


_BY_OFFSETS = operator.itemgetter(3, 4)  # (name, dtype, shape, begin, end) -> (begin, end)
_BITS = {**{d: size * 8 for d, size in DTYPE_SIZES.items()}, **SUB_BYTE_BITS}


def _valid_entry(entry: object) -> tuple[str, tuple[int, ...], int, int] | None:
    """_parse_entry's result for an entry that passes every one of its checks, else None (then
    _parse_entry names the error). Exact types, as json.loads makes them (bool is not an int): a real
    checkpoint has 10^5 entries, and this path costs a third of the full one."""
    if type(entry) is not dict or entry.keys() != _ENTRY_KEYS:
        return None
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    bits = _BITS.get(dtype) if type(dtype) is str else None
    if bits is None or type(shape) is not list or len(shape) > 8 or type(offsets) is not list or len(offsets) != 2:
        return None
    numel = 1
    for d in shape:
        if type(d) is not int or d < 0:
            return None
        numel *= d
        if numel > _MAX_U64:
            return None
    begin, end = offsets
    if (type(begin) is not int or type(end) is not int or not 0 <= begin <= end <= _MAX_U64
            or numel * bits > _MAX_U64 or numel * bits != (end - begin) * 8):
        return None
    return dtype, tuple(shape), begin, end


def _parse_entry(name: str, entry: object, *, file: str) -> tuple[str, tuple[int, ...], int, int]:
    if not isinstance(entry, dict) or set(entry) != _ENTRY_KEYS:
        got = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
        raise _err("header.bad_entry", f"entry {name!r} must be an object with exactly the keys "
                   f"dtype, shape, data_offsets; found {got}", file=file, tensor=name)
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str):
        raise _err("header.bad_entry", f"entry {name!r}: dtype must be a string, found {dtype!r}",
                   file=file, tensor=name)
    if not isinstance(shape, list) or not all(_is_uint(d) for d in shape):
        raise _err("header.bad_entry", f"entry {name!r}: shape must be a list of non-negative "
                   f"integers, found {shape!r}", file=file, tensor=name)
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_uint(o) for o in offsets)
            or not offsets[0] <= offsets[1] <= _MAX_U64):
        raise _err("header.bad_entry", f"entry {name!r}: data_offsets must be [begin, end] with "
                   f"0 <= begin <= end < 2**64, found {offsets!r:.200}", file=file, tensor=name)
    bits = dtype_bits(dtype)
    if bits is None:
        known = ", ".join(sorted([*DTYPE_SIZES, *SUB_BYTE_BITS]))
        raise _err("header.unknown_dtype", f"tensor {name!r} has unknown dtype {dtype!r} (known: {known})",
                   file=file, tensor=name,
                   hint="upgrade dsv4-convert if this is a newer safetensors dtype, else re-export the shard")
    numel = _numel(shape)
    begin, end = offsets
    if numel is None or numel * bits > _MAX_U64:
        raise _err("header.shape_size_mismatch", f"tensor {name!r}: shape {shape!r:.200} x {dtype} counts "
                   "2**64 elements or bits or more", file=file, tensor=name)
    if (numel * bits) % 8 or numel * bits // 8 != end - begin:
        raise _err("header.shape_size_mismatch",
                   f"tensor {name!r}: shape {shape} x {dtype} ({bits} bits/element) needs "
                   f"{numel * bits / 8:g} bytes but data_offsets {offsets} span {end - begin} bytes",
                   file=file, tensor=name)
    return dtype, tuple(shape), begin, end


def parse_header(buf: bytes, *, file_size: int, file: str,
                 allow_truncated: bool = False) -> tuple[dict[str, TensorRef], dict[str, str]]:
    """Parse and check a safetensors header.

    `buf` holds at least the first 8 + header-length bytes of the file, `file_size` is the whole
    file's size. Returns (tensors in data order with absolute offsets, `__metadata__` or {}).
    `allow_truncated` accepts tensors that run past the end of the file (the validator reports them,
    and a header kept without its data is checked this way)."""
    if len(buf) < 8 or file_size < 8:
        raise _err("header.too_short", f"file has {min(len(buf), file_size)} bytes, fewer than the "
                   "8-byte header length prefix: not a safetensors file, or an empty download", file=file)
    (n,) = struct.unpack("<Q", buf[:8])
    if n > MAX_HEADER_SIZE:
        raise _err("header.too_large", f"declared header length {n} exceeds the safetensors limit "
                   f"{MAX_HEADER_SIZE}: the file is corrupt or not safetensors", file=file)
    if 8 + n > file_size:
        raise _err("header.length_past_eof", f"declared header length {n} runs past the end of the "
                   f"file ({file_size} bytes): the file is truncated or not safetensors", file=file)
    if len(buf) < 8 + n:
        raise _err("header.too_short", f"only {len(buf)} of the {8 + n} header bytes were given",
                   file=file, hint="pass the whole header (read_header does)")
    raw = bytes(buf[8:8 + n])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _err("header.not_utf8", f"header is not valid UTF-8 ({e.reason} at byte {8 + e.start})",
                   file=file) from None
    if not text.startswith("{"):
        raise _err("header.not_object", "header must be a JSON object starting with '{'", file=file)
    fast = _decode_fast(text) if not _NEGATIVE_ZERO.search(text) else None  # json reads -0 as 0: see the slow path
    if fast is not None:
        try:
            result = _check(fast, n=n, file_size=file_size, file=file, allow_truncated=allow_truncated)
        except InputError:
            result = None  # the slow path below reports the error, in the same order as it always did
        if result is not None and _no_key_lost(text, fast, result[0], result[1]):
            return _utf8_strings(text, result, file)
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicates, parse_int=_u64_literal)
    except _DuplicateKey as e:
        raise _err("header.duplicate_key", f"header names {e.key!r} twice", file=file, tensor=e.key) from None
    except _NegativeZero:
        raise _err("header.not_json", "header holds the number -0, which the safetensors library refuses "
                   "(it reads it as a float)", file=file) from None
    except json.JSONDecodeError as e:
        raise _err("header.not_json", f"header is not valid JSON ({e.msg} at header byte {e.pos})",
                   file=file) from None
    except (ValueError, RecursionError) as e:  # an integer of over 4300 digits; nesting too deep
        raise _err("header.not_json", f"header is not valid JSON ({type(e).__name__}: {str(e)[:120]})",
                   file=file) from None
    return _utf8_strings(text, _check(obj, n=n, file_size=file_size, file=file, allow_truncated=allow_truncated), file)


class _NegativeZero(Exception):
    pass


def _u64_literal(digits: str) -> int:
    """json's integer hook: `-0` is refused (the reference parses it as the float -0.0)."""
    if digits == "-0":
        raise _NegativeZero
    return int(digits)


def _utf8_strings(text: str, result: tuple[dict, dict], file: str) -> tuple[dict, dict]:
    """`result` when every name and metadata string is valid UTF-8 (core/checkpoint/index.py lone_surrogate)."""
    tensors, metadata = result
    bad = lone_surrogate(text, itertools.chain(tensors, metadata, metadata.values()))
    if bad is not None:
        raise _err("header.not_utf8", f"header string {bad!r:.200} escapes a lone UTF-16 surrogate "
                   "(\\ud800-\\udfff without its pair): not valid UTF-8", file=file)
    return result


def _decode_fast(text: str) -> dict | None:
    """json.loads without the duplicate-key hook (a Python call per object: 10^5 of them in a real
    checkpoint), or None when the text does not decode to an object (the slow path names the error)."""
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def _slot_setters():
    return tuple(getattr(TensorRef, f.name).__set__ for f in dataclasses.fields(TensorRef))


_SET_NAME, _SET_FILE, _SET_DTYPE, _SET_SHAPE, _SET_BEGIN, _SET_END = _slot_setters()  # in field order


def _tensor_ref(name: str, file: str, dtype: str, shape: tuple, begin: int, end: int) -> TensorRef:
    """TensorRef(name, file, dtype, shape, begin, end), at half the cost of the frozen dataclass's
    __init__ (one per tensor: 10^5 in a real checkpoint); the fields are set through their slots, as
    that __init__ does (tests/core/test_safetensors_header.py compares the two)."""
    ref = object.__new__(TensorRef)
    _SET_NAME(ref, name)
    _SET_FILE(ref, file)
    _SET_DTYPE(ref, dtype)
    _SET_SHAPE(ref, shape)
    _SET_BEGIN(ref, begin)
    _SET_END(ref, end)
    return ref


def _no_key_lost(text: str, obj: dict, tensors: dict, metadata: dict) -> bool:
    """True when the header `text` names no key twice at any level, given that `obj` (its hook-less
    decode, in which a repeated key keeps its last value) passed every check. Then every object in it is
    the top level, `__metadata__` (str -> str) or a 3-key tensor entry, so the decoded keys number
    `decoded` below. In JSON a `:` outside a string follows a key, one per key, so text.count(":") >=
    the keys in the text >= decoded, and equality means no key was lost. A `:` inside a name or a
    metadata value answers False, and the caller decodes again with the hook (exact, slower)."""
    decoded = len(obj) + 3 * len(tensors) + len(metadata)
    return text.count(":") == decoded


def _check(obj: object, *, n: int, file_size: int, file: str,
           allow_truncated: bool) -> tuple[dict[str, TensorRef], dict[str, str]]:
    """Every rule after JSON decoding, on a decoded header object."""
    if not isinstance(obj, dict):
        raise _err("header.not_object", "header must be a JSON object", file=file)
    obj = dict(obj)  # the caller's object stays whole (the fast path may decode again)
    metadata = obj.pop("__metadata__", None)
    metadata = {} if metadata is None else metadata  # null is allowed (the reference reads it as absent)
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise _err("header.bad_metadata", "__metadata__ must map strings to strings, found "
                   f"{metadata!r:.200}", file=file)

    parsed = [(name, *(_valid_entry(entry) or _parse_entry(name, entry, file=file))) for name, entry in obj.items()]
    parsed.sort(key=_BY_OFFSETS)
    data_start, data_len = 8 + n, file_size - 8 - n
    pos, prev = 0, None
    for name, _dtype, _shape, begin, end in parsed:
        if begin < pos:
            raise _err("header.offsets_overlap", f"tensor {name!r} starts at data byte {begin}, inside "
                       f"{prev!r} which ends at {pos}", file=file, tensor=name)
        if begin > pos:
            raise _err("header.offsets_hole", f"data bytes [{pos}, {begin}) before tensor {name!r} "
                       "belong to no tensor", file=file, tensor=name)
        pos, prev = end, name
    if pos > data_len and not allow_truncated:
        first = next(p[0] for p in parsed if p[4] > data_len)
        raise _err("header.offsets_past_eof", f"the header declares {pos} data bytes but the file holds "
                   f"only {data_len} after the header ({pos - data_len} missing; tensor {first!r} is the "
                   "first one past the end): the file is truncated", file=file, tensor=first,
                   hint="re-download this shard (an interrupted download leaves a short file)")
    if pos < data_len:
        raise _err("header.data_size_mismatch", f"the file has {data_len - pos} trailing bytes after the "
                   f"last tensor (data buffer {data_len} bytes, tensors cover {pos})", file=file)
    tensors = {name: _tensor_ref(name, file, dtype, shape, data_start + begin, data_start + end)
               for name, dtype, shape, begin, end in parsed}
    return tensors, dict(metadata)


def read_header(path: Path, *, file: str | None = None,
                allow_truncated: bool = False) -> tuple[dict[str, TensorRef], dict[str, str]]:
    """Read and check only the header of `path`. `file` is the name recorded in the TensorRefs
    (default: the file name; the reader passes the path relative to the checkpoint root)."""
    path = Path(path)
    name = file if file is not None else path.name
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            prefix = f.read(8)
            buf = prefix
            if len(prefix) == 8:
                (n,) = struct.unpack("<Q", prefix)
                if n <= MAX_HEADER_SIZE and 8 + n <= size:  # validated before allocating n bytes
                    buf = prefix + f.read(n)
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror or e}", error_id="header.unreadable",
                         file=str(path), hint="check that the file exists and is readable") from None
    try:
        return parse_header(buf, file_size=size, file=name, allow_truncated=allow_truncated)
    except InputError as e:
        e.file = str(path)
        raise
