"""Fast fuzz profile (CI) of the parsers that read untrusted bytes (tests/helpers/fuzz_targets.py): a
few hundred examples, a per-example deadline against hangs (a minute: a guard, never a speed claim,
so a loaded machine cannot fail it), and a bound on peak memory growth against
allocations sized by a forged field. The long profile is benchmarks/fuzz_parsers.py.

Plus the regressions the fuzzing found, as plain tests: integers over Python's 4300-digit limit and
deep nesting in a header (were ValueError / RecursionError), and shapes whose element count does not
fit a float (was OverflowError, and quadratic time for long shapes: now the product stops at the
first dimension that passes 2**64, which the test observes by counting the dimensions read).
"""

from __future__ import annotations

import json
import resource
import struct
import tracemalloc
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings

from dsv4_convert.core.checkpoint.reader import open_checkpoint
from dsv4_convert.core.checkpoint.safetensors_header import MAX_HEADER_SIZE, _numel, parse_header, read_header
from dsv4_convert.core.errors import InputError
from dsv4_convert.validate.headers import scan_checkpoint, scan_header
from tests.helpers.fuzz_targets import make_seeds, run_target, strategy

EXAMPLES = {"header_bytes": 150, "header_json": 150, "index": 100, "configs": 80}
MAX_RSS_GROWTH = 256 << 20
HANG_GUARD = timedelta(minutes=1)


def _profile(name: str):
    return settings(max_examples=EXAMPLES[name], deadline=HANG_GUARD, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def seeds(synth_source, tmp_path_factory):
    return make_seeds(synth_source("nvfp4-modelopt-dsv4", layers=1, experts=4, shards=2),
                      tmp_path_factory.mktemp("fuzz"))


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _fuzz(name: str, seeds) -> None:
    @_profile(name)
    @given(strategy(name, seeds))
    def run(case):
        run_target(name, seeds, case)

    before = _peak_rss()
    run()
    assert _peak_rss() - before < MAX_RSS_GROWTH, "a forged size led to a large allocation"


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_fuzz(seeds, name):
    _fuzz(name, seeds)


# ------------------------------------------------------------------------------ regressions, sizes
def _header(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _refused(buf: bytes, error_id: str, *, file_size: int | None = None) -> InputError:
    with pytest.raises(InputError) as e:
        parse_header(buf, file_size=len(buf) if file_size is None else file_size, file="x.safetensors")
    assert e.value.error_id == error_id, e.value.render()
    return e.value


@pytest.mark.parametrize("text", [
    '{"a": {"dtype": "U8", "shape": [' + "9" * 5000 + '], "data_offsets": [0, 1]}}',
    '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}",
], ids=["5000-digit-int", "deep-nesting"])
def test_unparseable_json_is_header_not_json(tmp_path, text):
    _refused(_header(text), "header.not_json")
    path = tmp_path / "x.safetensors"
    path.write_bytes(_header(text))
    assert scan_header(path, path.name).error  # the validator's own scan reports it, never raises


@pytest.mark.parametrize("metadata", [[], 0, "", False, {"a": 1}])
def test_metadata_that_is_not_a_string_map_is_refused(metadata):
    """An empty list, 0, "" or false used to pass as "no metadata"."""
    _refused(_header(json.dumps({"__metadata__": metadata})), "header.bad_metadata")


def test_null_metadata_is_no_metadata():
    buf = _header('{"__metadata__": null}')
    assert parse_header(buf, file_size=len(buf), file="x") == ({}, {})


@pytest.mark.parametrize("dims", [17, 100_000])
def test_shape_with_more_than_2_64_elements_is_refused_quickly(dims):
    text = json.dumps({"a": {"dtype": "U8", "shape": [2**63] * dims, "data_offsets": [0, 1]}})
    err = _refused(_header(text), "header.shape_size_mismatch", file_size=len(_header(text)) + 1)
    assert "2**64" in err.message and len(err.message) < 400


class _CountingShape(list):
    """A shape list that counts the dimensions its reader iterates over."""
    read = 0

    def __iter__(self):
        for d in super().__iter__():
            self.read += 1
            yield d


def test_a_long_forged_shape_stops_at_the_dimension_that_passes_2_64():
    """The quick refusal, without a clock: a product of 100000 dims of 2**63 would be quadratic work."""
    shape = _CountingShape([2**63] * 100_000)
    assert _numel(shape) is None and shape.read == 2  # 2**63 * 2**63 > 2**64 at the second
    assert _numel(_CountingShape([2, 3, 4])) == 24


def test_forged_header_length_allocates_nothing(tmp_path):
    """A length just under the 100 MB limit in a 1 KiB file: refused before any read of that size."""
    path = tmp_path / "forged.safetensors"
    path.write_bytes(struct.pack("<Q", MAX_HEADER_SIZE - 1) + b"{" * 1016)
    tracemalloc.start()
    try:
        with pytest.raises(InputError) as e:
            read_header(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert e.value.error_id == "header.length_past_eof" and peak < 1 << 20
    assert str(path) in e.value.render()


def test_forged_data_offsets_allocate_nothing(tmp_path):
    """Offsets claiming 2**60 bytes: the header is refused from its numbers, no buffer is sized by them.
    (2**60, not 2**63: 2**63 bytes are 2**66 bits, which the header rules now refuse before the offsets,
    as the safetensors library does.)"""
    path = tmp_path / "forged.safetensors"
    header = {"a": {"dtype": "U8", "shape": [2**60], "data_offsets": [0, 2**60]}}
    path.write_bytes(_header(json.dumps(header)) + b"\0" * 64)
    tracemalloc.start()
    try:
        with pytest.raises(InputError) as e:
            read_header(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert e.value.error_id == "header.offsets_past_eof" and e.value.tensor == "a" and peak < 1 << 20


@pytest.mark.parametrize("shard,error_id", [("²", "index.missing_shard"), ("model-٣-of-2.safetensors", "index.missing_shard"),
                                            ("/", "index.unsafe_path"), ("", "index.unsafe_path")])
def test_odd_shard_names_in_the_index_are_input_errors(seeds, shard, error_id):
    """"²" passes str.isdigit() but not int(): the shard sort raised ValueError. "/" and "" are not
    files inside the checkpoint at all."""
    run_target("index", seeds, json.dumps(seeds.index).encode())  # restore all three files (the fuzz tests write them)
    index = json.loads(json.dumps(seeds.index))
    index["weight_map"]["embed.weight"] = shard
    (seeds.root / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(InputError) as e:
        open_checkpoint(seeds.root)
    assert e.value.error_id == error_id


@pytest.mark.parametrize("file,error_id", [("model.safetensors.index.json", "index.not_json"),
                                           ("config.json", "config.not_json")])
@pytest.mark.parametrize("junk", [b"9" * 5000, b"[" * 100_000 + b"]" * 100_000], ids=["5000-digits", "nesting"])
def test_json_files_past_the_parser_limits_are_input_errors(seeds, file, error_id, junk):
    """Were ValueError / RecursionError out of open_checkpoint (and of validate's index scan)."""
    run_target("index", seeds, json.dumps(seeds.index).encode())  # restore all three files
    (seeds.root / file).write_bytes(b'{"weight_map": {}, "x": ' + junk + b"}")
    index_error = scan_checkpoint(seeds.root)[1]  # validate's own scan: a finding, never an exception
    assert (index_error is not None) == (file != "config.json")
    with pytest.raises(InputError) as e:
        open_checkpoint(seeds.root)
    assert e.value.error_id == error_id and file in e.value.render()


@pytest.mark.parametrize("value", [["x"], 1, None, {}])
def test_non_string_shard_names_in_the_index(seeds, value):
    """validate's index scan raised TypeError (unhashable / not a path) on these."""
    index = json.loads(json.dumps(seeds.index))
    index["weight_map"]["embed.weight"] = value
    run_target("index", seeds, json.dumps(index).encode())  # asserts: no exception but our own
    assert "weight_map" in scan_checkpoint(seeds.root)[1]
    with pytest.raises(InputError) as e:
        open_checkpoint(seeds.root)
    assert e.value.error_id == "index.bad_schema"
