"""serving/config.py: parsing the converted checkpoint's quantization_config, without any engine."""

import pytest
import synth

from dsv4_convert.formats.marlin import MarlinTarget
from dsv4_convert.serving.config import (
    PluginConfigError,
    check_layout,
    check_rank_shape,
    expert_container,
    parse_quant_config,
    working_tp_sizes,
)


def _qc(engine="sglang", fmt="nvfp4", **change):
    return {**synth.quant_config(fmt, MarlinTarget(engine=engine)), **change}


def test_converted_config_parses():
    spec = parse_quant_config(_qc(rescale={"layers.0.ffn.experts.w13": 2.0}))
    assert spec.marlin_layout == "sglang-L2" and spec.experts == {"layers.0.ffn.experts": "nvfp4"}
    assert spec.original_quantization_config["quant_method"] == "fp8"


def test_parse_lists_every_problem_at_once():
    with pytest.raises(PluginConfigError) as e:
        parse_quant_config({"quant_method": "marlin_fp4", "format_version": 3, "act_dtype": "fp8"})
    msg = str(e.value)
    assert (
        "format_version" in msg
        and "marlin_layout is missing" in msg
        and "act_dtype" in msg
        and "experts" in msg
    )


@pytest.mark.parametrize(
    "engine, version, message",
    [
        ("vllm", "0.33.0", "converted for sglang"),
        ("sglang", "0.5.20", "needs sglang >= 0.5.23"),
    ],
)
def test_layout_refused(engine, version, message):
    with pytest.raises(PluginConfigError, match=message):
        check_layout(parse_quant_config(_qc()), engine=engine, engine_version=version)


def test_vllm_layout_needs_l4_version():
    spec = parse_quant_config(_qc(engine="vllm"))
    check_layout(spec, engine="vllm", engine_version="0.33.0")
    with pytest.raises(PluginConfigError, match="needs vllm >= 0.20.0"):
        check_layout(spec, engine="vllm", engine_version="0.19.1")


def test_act_dtype_mismatch_refused_for_nvfp4():
    with pytest.raises(PluginConfigError, match="--dtype bfloat16"):
        check_layout(
            parse_quant_config(_qc()), engine="sglang", engine_version="0.5.23", model_dtype="float16"
        )


@pytest.mark.parametrize(
    "prefix, expected",
    [
        ("model.layers.0.mlp.experts", "layers.0.ffn.experts"),
        ("model.layers.0.ffn.experts", "layers.0.ffn.experts"),
        ("model.layers.1.mlp.experts", None),
        ("model.layers.43.mlp.experts", "mtp.0.ffn.experts"),
        ("model.decoder.mlp.experts", "mtp.0.ffn.experts"),
    ],
)
def test_expert_container(prefix, expected):
    spec = parse_quant_config(_qc(experts={"layers.0.ffn.experts": "nvfp4", "mtp.0.ffn.experts": "mxfp4"}))
    assert expert_container(spec, prefix, num_hidden_layers=43) == expected


def test_dsv4_flash_shapes_work_at_tp_1_to_16():
    for tp in (1, 2, 4, 8, 16):
        check_rank_shape("mxfp4", "sglang", intermediate=2048, hidden=4096, tp_size=tp)
    assert working_tp_sizes("mxfp4", "vllm", intermediate=2048, hidden=4096) == [1, 2, 4, 8, 16]


def test_padding_shape_refused_with_working_layouts():
    with pytest.raises(PluginConfigError, match=r"TP 32 / EP 1: sglang pads mxfp4 experts per rank: I_shard 64 -> "
                                                r"128.*Layouts that work for this model: TP 1 / EP 1, .*TP 8 / EP 8"):
        check_rank_shape("mxfp4", "sglang", intermediate=2048, hidden=4096, tp_size=32)


@pytest.mark.parametrize("version", [1, 2])
def test_both_format_versions_parse(version):
    assert parse_quant_config(_qc(format_version=version)).format_version == version
