"""Qwen3.8-Flash-Next's PLE n-gram tables (core/sources/side_tables.py) and the tensor an engine cannot load
(core/targets/engine_config.py): which names are table shards, the storage the engines must be told for them, and
SGLang's refusal of NVFP4 tables, each shown failing on a made-up case.

No substitutions: the functions under test read names and dtypes only; the refs are the two fields they read."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dsv4_convert.core.sources.side_tables import is_ple_table, ple_storage
from dsv4_convert.core.targets.engine_config import fix_hint, source_load_refusal

TABLE = "model.language_model.layers.{}.ple.ple_embedding.ngram_embedding.shard_{}.weight"


def _refs(*pairs):
    return {name: SimpleNamespace(dtype=dtype) for name, dtype in pairs}


@pytest.mark.parametrize(("name", "table"), [
    (TABLE.format(0, 3), True),
    ("layers.7.ple.ple_embedding.ngram_embedding.shard_0.weight", True),
    (TABLE.format(0, 3) + "_scale", False),                               # its NVFP4 block scales: not the rows
    ("model.language_model.layers.0.ple.ple_embedding.ngram_embedding.weight_scale", False),  # the table's scale
    ("model.language_model.layers.0.ple.key_proj.weight", False),
    ("model.language_model.layers.0.mlp.experts.0.gate_proj.weight", False),
    ("model.language_model.embed_tokens.weight", False),
])
def test_table_shards_are_recognised_by_name(name, table):
    assert is_ple_table(name) is table


@pytest.mark.parametrize(("dtype", "storage"), [("F8_E4M3", "float8_e4m3fn"), ("U8", "nvfp4"), ("BF16", None)])
def test_the_storage_follows_the_rows_dtype(dtype, storage):
    assert ple_storage(_refs((TABLE.format(0, 0), dtype), (TABLE.format(0, 1), dtype))) == storage


def test_no_table_or_two_storages_say_nothing():
    assert ple_storage(_refs(("model.language_model.layers.0.mlp.gate.weight", "U8"))) is None
    assert ple_storage(_refs((TABLE.format(0, 0), "F8_E4M3"), (TABLE.format(2, 0), "U8"))) is None


def test_sglang_alone_cannot_load_nvfp4_tables():
    nvfp4 = [TABLE.format(0, 0), TABLE.format(0, 0) + "_scale"]
    assert "_ple_table_is_fp8" in source_load_refusal({}, "sglang", nvfp4)
    assert "_ple_table_is_fp8" in source_load_refusal({}, "sglang 0.5.23", nvfp4)
    assert "vLLM" in fix_hint({}, "sglang", nvfp4)
    for engine in ("vllm", "vllm 0.33", "vllm 0.34"):
        assert source_load_refusal({}, engine, nvfp4) is None
    assert source_load_refusal({}, "sglang", nvfp4[:1]) is None  # FP8 / BF16 rows: no per-shard block scales
