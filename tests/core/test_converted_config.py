"""core/record/converted_config.py, the one schema of a converted checkpoint's quantization_config: what the
writer builds parses back to the same object, and the one parser refuses values of the wrong type for
all its users (here: the parser itself and `marlin-to-source` in a subprocess; validate in
tests/validate/checks/test_quant_config_checks.py, the plugins in serving_tests/test_config.py).

Checkpoints: `dsv4-convert synth` + `nvfp4-to-marlin --tp 2` by the real CLI. No substitutions.
"""

import json
import shutil

import pytest

from dsv4_convert.core.record.converted_config import ConvertedConfigError, ConvertedQuantConfig
from dsv4_convert.core.record.converted_rules import model_config_problems
from tests.helpers.cli import rerecord, run_cli


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cc")
    run_cli("synth", tmp / "src", "--format", "nvfp4-modelopt-hf", "--layers", "1", "--experts", "4",
            "--hidden", "256", "--intermediate", "192", "-q")
    run_cli("nvfp4-to-marlin", tmp / "src", tmp / "out", "--target", "vllm", "--tp", "2", "-q")
    return tmp / "out"


def _block(root):
    return json.loads((root / "config.json").read_text())["quantization_config"]


@pytest.mark.slow  # the `converted` fixture runs the CLI
def test_written_block_round_trips(converted):
    block = _block(converted)
    spec = ConvertedQuantConfig.parse(block)
    assert spec.as_dict() == block and spec.tp_layout.tp == 2 and spec.model_type == "deepseek_v3"


@pytest.mark.slow  # the `converted` fixture runs the CLI
@pytest.mark.parametrize("change, error_id", [
    ({"tp_layout": {"tp": "2", "ep": 1, "containers": {}}}, "converted_config.tp_layout"),
    ({"w4a8": True, "marlin_layout": "sglang-L2", "target_engine": "sglang"}, "converted_config.layout"),
    ({"group_size": True}, "converted_config.bad_value"),
    ({"rescale_factors": {"model.layers.9.mlp.experts.w13": 1.0}}, "converted_config.experts_map"),
    ({"quant_method": "modelopt"}, "converted_config.not_ours"),
    ({"serves_from": "config.json"}, "converted_config.bad_value"),
    ({"serves_from": "hf_quant_config.json", "original_hf_quant_config": None}, "converted_config.bad_value"),
    ({"expert_dtype": 4}, "converted_config.bad_value"),
])
def test_wrong_types_refused_with_their_id(converted, change, error_id):
    with pytest.raises(ConvertedConfigError) as e:
        ConvertedQuantConfig.parse({**_block(converted), **change})
    assert e.value.error_id == error_id and f"[{error_id}]" in e.value.message


@pytest.mark.slow  # the `converted` fixture runs the CLI
def test_serves_from_round_trips_and_chooses_the_serving_block(converted):
    """nvidia/DeepSeek-V3-0324-FP4's conversion: the plugins serve from hf_quant_config.json, not the stale block."""
    from dsv4_convert.core.record.converted_config import serving_block

    block = _block(converted)
    hf = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4"}}
    stale = {**block, "original_quantization_config": {"quant_method": "fp8"}, "original_hf_quant_config": hf}
    assert serving_block(ConvertedQuantConfig.parse(stale)) == {"quant_method": "fp8"}
    spec = ConvertedQuantConfig.parse({**stale, "serves_from": "hf_quant_config.json"})
    assert spec.as_dict() == {**stale, "serves_from": "hf_quant_config.json"} and serving_block(spec) == hf


@pytest.mark.slow  # the `converted` fixture runs the CLI
def test_the_verdict_serves_from_the_block_the_parser_chooses(converted):
    """Issue 38 item 3: `plan`'s and `inspect`'s verdict on a conversion reads its record through the one parser
    and serving_block (no second reading of the raw dict): a stale config.json block is judged, unless the record
    says `serves_from`, and a record the plugins refuse is refused."""
    from dsv4_convert.core.checkpoint.reader import open_checkpoint
    from dsv4_convert.core.targets.verdicts import UNREADABLE_RECORD, checkpoint_refusal, verdict

    ckpt = open_checkpoint(converted)
    block, fmt = _block(converted), ckpt.format.value
    assert verdict(ckpt.config, None, fmt, "vllm") is None
    stale = {**block, "original_quantization_config": {"quant_method": "fp8"}}
    why = checkpoint_refusal({**ckpt.config, "quantization_config": stale}, None, fmt, "vllm")
    assert why is not None and "'fp8'" in why
    serving = {**stale, "serves_from": "hf_quant_config.json"}  # hf_quant_config.json's NVFP4 block, served
    assert checkpoint_refusal({**ckpt.config, "quantization_config": serving}, None, fmt, "vllm") is None
    broken = {**ckpt.config, "quantization_config": {**block, "w4a8": "no"}}
    assert checkpoint_refusal(broken, None, fmt, "vllm") == verdict(broken, None, fmt, "vllm") == UNREADABLE_RECORD


# issue 37 item 6: every recorded rescale factor a plugin could act on wrongly. The vLLM plugin re-encodes a
# stack's block scales by the factor (serving/vllm_methods.py rank_rescale): Infinity turned every byte to 0.
BAD_RESCALE = [float("inf"), float("-inf"), float("nan"), 1e300, 3.0, 0, 0.0, -2.0, 2.0 ** 18, 2.0 ** 1000, 0.5,
               True, "2", None, [2.0]]


def _through_json(block: dict) -> dict:
    """The block as config.json text and back: Infinity / NaN / 1e300 as a file would hold them."""
    return json.loads(json.dumps(block))


@pytest.mark.slow  # the `converted` fixture runs the CLI
@pytest.mark.parametrize("value", BAD_RESCALE, ids=repr)
def test_every_bad_rescale_factor_is_refused_naming_its_key(converted, value):
    block = _block(converted)
    key = sorted(block["rescale_factors"])[0]
    block["rescale_factors"][key] = value
    with pytest.raises(ConvertedConfigError) as e:
        ConvertedQuantConfig.parse(_through_json(block))
    assert e.value.error_id == "converted_config.rescale_factor" and repr(key) in e.value.message, e.value.message


@pytest.mark.slow  # the `converted` fixture runs the CLI
def test_every_factor_vllms_bf16_rescale_can_give_is_accepted(converted):
    # vLLM's factor is 2**floor(log2(448*128 / m)), m the largest non-zero x128 scale, and 1 when m >= 448*128:
    # the smallest E4M3 scale 2**-9 gives m = 2**-2, so 2**floor(log2(229376)) = 2**17 is the largest
    block = _block(converted)
    key = sorted(block["rescale_factors"])[0]
    for e in range(18):
        block["rescale_factors"][key] = 2.0 ** e
        assert ConvertedQuantConfig.parse(_through_json(block)).rescale_factors[key] == 2.0 ** e


@pytest.mark.slow  # the `converted` fixture runs the CLI
@pytest.mark.parametrize("context, why", [
    ({"marlin_layout": "sglang-L2", "target_engine": "sglang", "tp_layout": None}, "SGLang has no rescale"),
    ({"act_dtype": "float16"}, "float16"),
    ("mxfp4", "mxfp4 experts have no rescale"),
])
def test_a_factor_other_than_1_is_refused_where_no_rescale_happens(converted, context, why):
    block = _block(converted)
    if context == "mxfp4":
        context = {"experts": dict.fromkeys(block["experts"], "mxfp4"), "weight_format": "mxfp4", "group_size": 32,
                   "tp_layout": None}
    block.update(context)
    key = sorted(block["rescale_factors"])[0]
    block["rescale_factors"] = {key: 1.0}
    ConvertedQuantConfig.parse(_through_json(block))  # 1: the identity, as a conversion writes it
    block["rescale_factors"][key] = 2.0
    with pytest.raises(ConvertedConfigError) as e:
        ConvertedQuantConfig.parse(_through_json(block))
    assert e.value.error_id == "converted_config.rescale_factor" and why in e.value.message, e.value.message


@pytest.mark.slow  # the `converted` fixture runs the CLI
def test_group_size_must_be_the_weight_formats(converted):
    with pytest.raises(ConvertedConfigError, match="nvfp4 blocks are 16 values"):
        ConvertedQuantConfig.parse({**_block(converted), "group_size": 32})


@pytest.mark.slow  # the `converted` fixture runs the CLI
def test_expert_dtype_round_trips_at_the_top_of_the_block(converted):
    """DeepSeek-V4.1's block keeps the source's expert_dtype where vLLM's DeepseekV41Config reads it; a block
    without one (every other source) writes none."""
    block = _block(converted)
    assert "expert_dtype" not in block
    with_dtype = {**block, "expert_dtype": "fp4"}
    spec = ConvertedQuantConfig.parse(with_dtype)
    assert spec.expert_dtype == "fp4" and spec.as_dict() == with_dtype


def test_model_dimension_of_the_wrong_type():
    (p,) = model_config_problems({"n_routed_experts": True, "hidden_size": 256})
    assert p.error_id == "converted_config.bad_value" and "n_routed_experts is True" in p.text


@pytest.mark.slow  # the `converted` fixture runs the CLI
def test_marlin_to_source_refuses_a_tp_given_as_a_string(converted, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(converted, bad)
    config = json.loads((bad / "config.json").read_text())
    config["quantization_config"]["tp_layout"]["tp"] = "2"
    (bad / "config.json").write_text(json.dumps(config, indent=2))
    rerecord(bad, "config.json")
    proc = run_cli("marlin-to-source", bad, tmp_path / "back", "--json", check=False)
    err = json.loads(proc.stdout)["error"]
    assert proc.returncode == 4 and err["id"] == "reverse.bad_config"
    assert "[converted_config.tp_layout] tp_layout.tp must be a positive integer, got '2'" in err["message"]
