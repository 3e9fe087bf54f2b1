"""serving/config.py: parsing the converted checkpoint's quantization_config, without any engine."""

import pytest

import synth
from dsv4_convert.core.targets.target import MarlinTarget
from dsv4_convert.serving.config import (
    PluginConfigError,
    check_layout,
    check_rank_shape,
    check_tp_layout,
    expert_container,
    parse_quant_config,
    rank_param_sizes,
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


# --- tp_layout (`--tp/--ep` padded output) --------------------------------------------------------


def _padded_spec(fmt="mxfp4", engine="vllm", *, hidden=256, inter=192, tp=2, ep=1):
    layout = synth.tp_layout(fmt, engine, hidden=hidden, inter=inter, tp=tp, ep=ep)
    return parse_quant_config(_qc(engine=engine, fmt=fmt, tp_layout=layout, layouts=[{"tp": tp, "ep": ep}]))


def test_padded_layout_gives_recorded_sizes():
    spec = _padded_spec()
    assert spec.padded
    assert rank_param_sizes(spec, synth.CONTAINER, "vllm", hidden=256, i_shard=96, moe_tp=2) == (256, 128)


@pytest.mark.parametrize("moe_tp, ep, runs", [(1, 1, "TP 1 / EP 1"), (4, 1, "TP 4 / EP 1"), (1, 2, "TP 2 / EP 2")])
def test_padded_layout_refuses_another_split(moe_tp, ep, runs):
    spec = _padded_spec()
    with pytest.raises(PluginConfigError) as e:
        rank_param_sizes(spec, synth.CONTAINER, "vllm", hidden=256, i_shard=192 // moe_tp, moe_tp=moe_tp, ep=ep)
    msg = str(e.value)
    assert "converted padded for TP 2 / EP 1" in msg and f"vllm runs {runs}" in msg
    assert "--tensor-parallel-size 2" in msg and f"`--tp {moe_tp * ep} --ep {ep}`" in msg
    with pytest.raises(PluginConfigError, match="--tp-size 4 --ep-size 2"):
        check_tp_layout(_padded_spec(engine="sglang", hidden=256, inter=384, tp=4, ep=2), tp=2, ep=1)


def test_padded_layout_record_must_match_the_tile_rule():
    spec = _padded_spec()
    bad = {**spec.tp_layout.containers[synth.CONTAINER].as_dict(), "i_pad": 192}
    with pytest.raises(PluginConfigError, match=r"\[converted_config.tp_layout\].*the tile rule gives"):
        parse_quant_config({**spec.as_dict(), "tp_layout": {**spec.tp_layout.as_dict(),
                                                             "containers": {synth.CONTAINER: bad}}})


def test_padded_layout_record_must_match_the_model():
    spec = _padded_spec()
    with pytest.raises(PluginConfigError, match="records H=256 I_shard=96 padded to H=256 I=128, but the model has "
                                                "H=256 I_shard=112"):
        rank_param_sizes(spec, synth.CONTAINER, "vllm", hidden=256, i_shard=112, moe_tp=2)


def test_all_ok_tp_layout_is_layout_agnostic():
    spec = _padded_spec(inter=256)  # I_shard 128 at TP 2: no padding, bytes are the layout-agnostic ones
    assert spec.tp_layout.containers[synth.CONTAINER].status == "ok" and not spec.padded
    for moe_tp in (1, 2):
        assert rank_param_sizes(spec, synth.CONTAINER, "vllm", hidden=256, i_shard=256 // moe_tp,
                                moe_tp=moe_tp) == (256, 256 // moe_tp)


def test_without_tp_layout_a_padded_split_is_refused_as_today():
    spec = parse_quant_config(_qc(engine="vllm", fmt="mxfp4"))
    with pytest.raises(PluginConfigError, match="I_shard 96 -> 128.*Layouts that work"):
        rank_param_sizes(spec, synth.CONTAINER, "vllm", hidden=256, i_shard=96, moe_tp=2)


@pytest.mark.parametrize("layout, message", [
    ({"tp": 0, "ep": 1, "containers": {}}, "tp_layout.tp must be a positive integer"),
    ({"tp": 2, "ep": 1, "containers": {"layers.9.ffn.experts": {}}}, "is not listed in experts"),
    ({"tp": 2, "ep": 1, "containers": {"layers.0.ffn.experts": {"status": "pad"}}}, "needs status ok|pad"),
    ([2, 1], "tp_layout must be an object"),
])
def test_malformed_tp_layout_refused(layout, message):
    with pytest.raises(PluginConfigError, match=message):
        parse_quant_config(_qc(tp_layout=layout))
