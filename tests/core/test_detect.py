import pytest

from dsv4_convert.core.checkpoint.reader import open_checkpoint
from dsv4_convert.core.checkpoint.tensor_model import Quant, Role, TensorRef
from dsv4_convert.core.errors import ContentError
from dsv4_convert.core.sources.detect import detect_format
from dsv4_convert.core.sources.grouping import group_projections
from dsv4_convert.core.sources.source_formats import FORMATS as ROWS
from dsv4_convert.core.sources.source_formats import source_format
from tests.helpers.ckpt_factory import FORMATS, make_checkpoint


def _ref(name, dtype, shape):
    return TensorRef(name=name, file="model-00001-of-00001.safetensors", dtype=dtype, shape=tuple(shape),
                     begin=0, end=0)


def _mxfp4(prefix, n=64, k=128, weight_dtype="I8"):
    return {f"{prefix}.weight": _ref(f"{prefix}.weight", weight_dtype, [n, k // 2]),
            f"{prefix}.scale": _ref(f"{prefix}.scale", "F8_E8M0", [n, k // 32])}


def _nvfp4(prefix, n=64, k=128):
    return {f"{prefix}.weight": _ref(f"{prefix}.weight", "U8", [n, k // 2]),
            f"{prefix}.weight_scale": _ref(f"{prefix}.weight_scale", "F8_E4M3", [n, k // 16]),
            f"{prefix}.weight_scale_2": _ref(f"{prefix}.weight_scale_2", "F32", []),
            f"{prefix}.input_scale": _ref(f"{prefix}.input_scale", "F32", [])}


DSV4 = {"expert_dtype": "fp4", "quantization_config": {"quant_method": "fp8"}}
MODELOPT_DSV4 = {"expert_dtype": "fp4", "quantization_config": {"quant_method": "fp8", "moe_quant_algo": "NVFP4"}}


def test_detectors_are_ordered_most_specific_first():
    order = list(ROWS.values())
    assert order[0] is ROWS["marlin"] and order[-1] is ROWS["mxfp4-dsv4"]
    assert len(order) == len(set(order)) == len(ROWS)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_factory_format_is_detected(tmp_path, fmt):
    make_checkpoint(tmp_path, fmt, mtp=fmt == "nvfp4-modelopt-dsv4")
    ckpt = open_checkpoint(tmp_path)
    got, reason = detect_format(ckpt.config, ckpt.hf_quant_config, ckpt.tensors)
    assert got is source_format(fmt) and reason


def test_v41_expert_dtype_inside_quantization_config():
    cfg = {"quantization_config": {"quant_method": "fp8", "expert_dtype": "fp4"}}
    fmt, _ = detect_format(cfg, None, _mxfp4("layers.0.ffn.experts.0.w1"))
    assert fmt is ROWS["mxfp4-dsv4"]


def test_modelopt_dsv4_from_hf_quant_config_alone():
    hfq = {"quantization": {"quant_algo": "MIXED_PRECISION",
                            "quantized_layers": {"layers.0.ffn.experts": {"quant_algo": "NVFP4"}}}}
    fmt, reason = detect_format({"quantization_config": {"quant_method": "fp8"}}, hfq,
                                _nvfp4("layers.0.ffn.experts.0.w1"))
    assert fmt is ROWS["nvfp4-modelopt-dsv4"] and "MIXED_PRECISION" in reason


def test_modelopt_hf_without_quantization_config_uses_hf_quant_config():
    # ModelOpt's DeepSeek-V3 export deletes quantization_config from config.json
    hfq = {"quantization": {"quant_algo": "NVFP4", "group_size": 16}}
    fmt, _ = detect_format({}, hfq, _nvfp4("model.layers.3.mlp.experts.0.gate_proj"))
    assert fmt is ROWS["nvfp4-modelopt-hf"]


def test_unknown_format_lists_what_was_looked_at():
    with pytest.raises(ContentError) as info:
        detect_format({"quantization_config": {"quant_method": "quark"}}, None, _nvfp4("model.layers.0.mlp.w"))
    e = info.value
    assert e.error_id == "detect.unknown_format"
    assert "'quark'" in e.message and "hf_quant_config.json absent" in e.message


def test_fp8_base_model_is_unknown_with_a_hint():
    t = {"layers.0.ffn.experts.0.w1.weight": _ref("layers.0.ffn.experts.0.w1.weight", "F8_E4M3", [64, 128]),
         "layers.0.ffn.experts.0.w1.scale": _ref("layers.0.ffn.experts.0.w1.scale", "F32", [1, 1])}
    with pytest.raises(ContentError) as info:
        detect_format({"expert_dtype": "fp8", "quantization_config": {"quant_method": "fp8"}}, None, t)
    assert info.value.error_id == "detect.unknown_format" and "FP8" in info.value.hint


def test_config_says_nvfp4_but_scales_are_e8m0():
    t = _mxfp4("layers.0.ffn.experts.0.w1")
    with pytest.raises(ContentError) as info:
        detect_format(MODELOPT_DSV4, None, t)
    e = info.value
    assert e.error_id == "detect.contradiction"
    assert e.tensor == "layers.0.ffn.experts.0.w1.scale" and "groups of 32" in e.message


def test_native_config_but_nvfp4_tensors():
    with pytest.raises(ContentError) as info:
        detect_format(DSV4, None, _nvfp4("layers.0.ffn.experts.0.w1"))
    assert info.value.error_id == "detect.contradiction"
    assert info.value.tensor == "layers.0.ffn.experts.0.w1.weight_scale"


def test_declared_group_size_contradicts_scales():
    hfq = {"quantization": {"quant_algo": "NVFP4", "group_size": 32}}
    with pytest.raises(ContentError) as info:
        detect_format({}, hfq, _nvfp4("model.layers.0.mlp.experts.0.gate_proj"))
    e = info.value
    assert e.error_id == "detect.contradiction" and "group_size = 32" in e.message
    assert e.tensor == "model.layers.0.mlp.experts.0.gate_proj.weight_scale"


def test_mtp_mxfp4_does_not_contradict_modelopt_dsv4():
    t = {**_mxfp4("mtp.0.ffn.experts.0.w1"), **_nvfp4("layers.0.ffn.experts.0.w1")}
    fmt, _ = detect_format(MODELOPT_DSV4, None, t)
    projections = group_projections(fmt, MODELOPT_DSV4, t)
    assert [(p.layer, p.quant) for p in projections] == [("0", Quant.NVFP4), ("mtp.0", Quant.MXFP4)]


def test_missing_role_or_expert_is_not_fatal():
    t = {**_mxfp4("layers.0.ffn.experts.0.w1"), **_mxfp4("layers.0.ffn.experts.0.w2", 128, 64),
         **_mxfp4("layers.0.ffn.experts.2.w3")}
    projections = group_projections(ROWS["mxfp4-dsv4"], DSV4, t)
    assert [(p.expert, p.role) for p in projections] == [(0, Role.GATE), (0, Role.DOWN), (2, Role.UP)]


def test_weight_without_scale_is_an_error():
    t = _mxfp4("layers.0.ffn.experts.0.w1")
    del t["layers.0.ffn.experts.0.w1.scale"]
    with pytest.raises(ContentError) as info:
        group_projections(ROWS["mxfp4-dsv4"], DSV4, t)
    assert info.value.error_id == "group.missing_scale"
    assert info.value.tensor == "layers.0.ffn.experts.0.w1.weight"


def test_scale_without_weight_is_an_error():
    t = _mxfp4("layers.0.ffn.experts.0.w1")
    del t["layers.0.ffn.experts.0.w1.weight"]
    with pytest.raises(ContentError) as info:
        group_projections(ROWS["mxfp4-dsv4"], DSV4, t)
    assert info.value.error_id == "group.scale_without_weight"


def test_scale_shape_mismatch_says_how_it_was_derived():
    t = _mxfp4("layers.0.ffn.experts.0.w1")
    t["layers.0.ffn.experts.0.w1.scale"] = _ref("layers.0.ffn.experts.0.w1.scale", "F8_E8M0", [64, 8])
    with pytest.raises(ContentError) as info:
        group_projections(ROWS["mxfp4-dsv4"], DSV4, t)
    e = info.value
    assert e.error_id == "group.scale_shape" and e.tensor == "layers.0.ffn.experts.0.w1.scale"
    assert "[64, 4]" in e.message and "K=128" in e.message


def test_nvfp4_without_global_scale():
    t = _nvfp4("layers.0.ffn.experts.0.w1")
    del t["layers.0.ffn.experts.0.w1.weight_scale_2"]
    with pytest.raises(ContentError) as info:
        group_projections(ROWS["nvfp4-modelopt-dsv4"], MODELOPT_DSV4, t)
    assert info.value.error_id == "group.missing_global_scale"


def test_fp8_tensors_with_scale_are_never_fp4_projections():
    t = {**_mxfp4("layers.0.ffn.experts.0.w1"),
         "layers.0.ffn.experts.1.w1.weight": _ref("layers.0.ffn.experts.1.w1.weight", "F8_E4M3", [64, 128]),
         "layers.0.ffn.experts.1.w1.scale": _ref("layers.0.ffn.experts.1.w1.scale", "F8_E8M0", [1, 1]),
         "layers.0.ffn.shared_experts.w1.weight": _ref("layers.0.ffn.shared_experts.w1.weight", "F8_E4M3", [64, 128]),
         "layers.0.ffn.shared_experts.w1.scale": _ref("layers.0.ffn.shared_experts.w1.scale", "F8_E8M0", [1, 1])}
    projections = group_projections(ROWS["mxfp4-dsv4"], DSV4, t)
    assert [p.key for p in projections] == ["layers.0.ffn.experts.0.w1"]


def test_mixed_quant_in_a_pure_format_is_refused():
    t = {**_mxfp4("layers.0.ffn.experts.0.w1"), **_nvfp4("layers.1.ffn.experts.0.w1")}
    with pytest.raises(ContentError) as info:
        group_projections(ROWS["mxfp4-dsv4"], DSV4, t)
    assert info.value.error_id == "group.unexpected_quant"
    assert info.value.tensor == "layers.1.ffn.experts.0.w1.weight_scale"


def test_marlin_projection_shapes():
    p = "layers.0.ffn.experts.0.w1"
    t = {f"{p}.weight": _ref(f"{p}.weight", "I32", [128 // 16, 2 * 64]),
         f"{p}.weight_scale": _ref(f"{p}.weight_scale", "F8_E4M3", [128 // 16, 64]),
         f"{p}.weight_global_scale": _ref(f"{p}.weight_global_scale", "BF16", []),
         f"{p}.weight_scale_2": _ref(f"{p}.weight_scale_2", "F32", [])}
    cfg = {"quantization_config": {"quant_method": "marlin_fp4"}}
    fmt, _ = detect_format(cfg, None, t)
    (proj,) = group_projections(fmt, cfg, t)
    assert (proj.n, proj.k, proj.quant) == (64, 128, Quant.NVFP4)
    assert proj.marlin_global.name.endswith("weight_global_scale")
    assert proj.global_scale.name.endswith("weight_scale_2")


# ---- names and configs the real producers write (#27): ModelOpt's MXFP4 export, Nemotron-H's non-gated
# experts, llm-compressor's Mixtral under transformers 5. tests/convert/test_producers.py runs the exports.
def _mxfp4_modelopt(prefix, n=128, k=128):
    return {f"{prefix}.weight": _ref(f"{prefix}.weight", "U8", [n, k // 2]),
            f"{prefix}.weight_scale": _ref(f"{prefix}.weight_scale", "U8", [n, k // 32])}


def _layer(make, prefix, roles=("gate_proj", "up_proj", "down_proj")):
    return {k: v for e in range(2) for r in roles for k, v in make(f"{prefix}.{e}.{r}").items()}


@pytest.mark.parametrize("where", ["config.json", "hf_quant_config.json"])
@pytest.mark.parametrize("algo", ["mxfp4", "W4A16_MXFP4"])
def test_modelopt_mxfp4_export_reads_as_mxfp4(where, algo):
    """MXFP4_MLP_WEIGHT_ONLY_CFG: ModelOpt 0.47 writes quant_algo "mxfp4" (lower case) in both files, 0.48
    "W4A16_MXFP4" (issue #35); each was a contradiction that blamed a correct config."""
    block = {"quant_method": "modelopt", "quant_algo": algo, "producer": {"name": "modelopt"}}
    config = {"quantization_config": block} if where == "config.json" else {}
    hfq = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": algo}}
    tensors = _layer(_mxfp4_modelopt, "model.layers.0.mlp.experts")
    fmt, reason = detect_format(config, hfq, tensors)
    assert fmt is ROWS["mxfp4-modelopt-hf"] and algo.lower() in reason
    ps = group_projections(fmt, config, tensors)
    assert {p.quant for p in ps} == {Quant.MXFP4} and len(ps) == 6 and all(p.group_size == 32 for p in ps)


def test_modelopt_nvfp4_config_over_mxfp4_weights_is_still_a_contradiction():
    config = {"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}}
    with pytest.raises(ContentError) as e:
        detect_format(config, None, _layer(_mxfp4_modelopt, "model.layers.0.mlp.experts"))
    assert e.value.error_id == "detect.contradiction" and "mxfp4" in e.value.message


def test_nemotron_h_non_gated_experts_are_recognised():
    """Nemotron-3-Nano NVFP4: `backbone.layers.L.mixer.experts.E.{up_proj,down_proj}`, no gate; vLLM loads
    up_proj as the activated w1 shard (nemotron_h.py), so its role here is the gate's."""
    hfq = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4", "group_size": 16}}
    tensors = _layer(_nvfp4, "backbone.layers.1.mixer.experts", ("up_proj", "down_proj"))
    fmt, reason = detect_format({"architectures": ["NemotronHForCausalLM"]}, hfq, tensors)
    assert fmt is ROWS["nvfp4-modelopt-hf"] and "nemotron-h" in reason and "backbone.layers.L.mixer" in reason
    ps = group_projections(fmt, {}, tensors)
    assert {(p.expert, p.role) for p in ps} == {(0, Role.GATE), (0, Role.DOWN), (1, Role.GATE), (1, Role.DOWN)}
    assert all(p.key.endswith(("up_proj", "down_proj")) for p in ps)


@pytest.mark.parametrize("name, part", [
    ("backbone.layers.1.mixer.experts.0.fc1.weight", "'0.fc1.weight'"),
    ("backbone.layers.1.moe.experts.0.up_proj.weight", "'moe.experts'"),
    ("backbone.blocks.1.mixer.experts.0.up_proj.weight", "'backbone.blocks.1.mixer'"),
])
def test_an_unknown_expert_path_names_the_tensor_and_the_part_not_understood(name, part):
    hfq = {"quantization": {"quant_algo": "NVFP4"}}
    with pytest.raises(ContentError) as e:
        detect_format({}, hfq, {name: _ref(name, "U8", [64, 64])})
    assert e.value.error_id == "detect.unknown_format" and name in e.value.hint and part in e.value.hint, e.value.hint


def test_llm_compressor_mixtral_under_transformers_5_is_recognised():
    """llm-compressor 0.14 / transformers 5: `block_sparse_moe.experts.E.{gate,up,down}_proj.weight_packed`."""
    ct = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"}
    tensors = {}
    for e in range(2):
        for r in ("gate_proj", "up_proj", "down_proj"):
            p = f"model.layers.0.block_sparse_moe.experts.{e}.{r}"
            tensors |= {f"{p}.weight_packed": _ref(f"{p}.weight_packed", "U8", [64, 64]),
                        f"{p}.weight_scale": _ref(f"{p}.weight_scale", "F8_E4M3", [64, 8]),
                        f"{p}.weight_global_scale": _ref(f"{p}.weight_global_scale", "F32", [1])}
    fmt, reason = detect_format({"quantization_config": ct}, None, tensors)
    assert fmt is ROWS["nvfp4-ct"] and "block-sparse-moe-hf" in reason
    assert len(group_projections(fmt, {}, tensors)) == 6
