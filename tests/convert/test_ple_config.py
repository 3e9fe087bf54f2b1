"""The converted config.json of a Qwen3.8-Flash-Next checkpoint names its PLE tables' storage for the engines
(convert/quant_config.py rewrite_config, `ple_embedding_dtype`; docs/FORMAT.md): in the text config of a nested
config or at the top of a flat one, never over a value the source set, and nowhere when the tables need none.

Substitution: the converted record is a stand-in holding only `as_dict()` (the block rewrite_config copies verbatim);
the end-to-end conversion of the replicas is tests/convert/test_qwen4_exp.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

from dsv4_convert.convert.quant_config import rewrite_config

RECORD = SimpleNamespace(as_dict=lambda: {"quant_method": "marlin_fp4"})


def test_nested_config_gets_it_in_its_text_config():
    source = {"architectures": ["Qwen4ExpForConditionalGeneration"], "text_config": {"hidden_size": 8}}
    out = json.loads(rewrite_config(source, RECORD, ple_storage="float8_e4m3fn"))
    assert out["text_config"] == {"hidden_size": 8, "ple_embedding_dtype": "float8_e4m3fn"}
    assert "ple_embedding_dtype" not in out and out["quantization_config"] == {"quant_method": "marlin_fp4"}
    assert source["text_config"] == {"hidden_size": 8}  # the source's dict is not touched


def test_flat_config_gets_it_at_the_top():
    out = json.loads(rewrite_config({"architectures": ["Qwen4ExpForCausalLM"]}, RECORD, ple_storage="nvfp4"))
    assert out["ple_embedding_dtype"] == "nvfp4"


def test_a_value_the_source_set_is_kept_and_no_storage_writes_nothing():
    source = {"text_config": {"ple_embedding_dtype": "float8_e4m3fn"}}
    assert json.loads(rewrite_config(source, RECORD, ple_storage="nvfp4"))["text_config"] == source["text_config"]
    assert "ple_embedding_dtype" not in json.loads(rewrite_config({"text_config": {}}, RECORD))["text_config"]
