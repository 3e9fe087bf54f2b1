"""Every golden case, every `marlin.*` tensor, byte for byte (tests/golden/README.md)."""

from pathlib import Path

import pytest
from safetensors import safe_open
from safetensors.torch import load_file

from dsv4_convert.core.targets.target import MarlinTarget
from dsv4_convert.formats.tiles import padded_moe_intermediate
from tests.helpers.compare import assert_bytes_equal
from tests.helpers.engine_stacks import (
    mxfp4_dense_to_marlin,
    mxfp4_moe_to_marlin,
    nvfp4_dense_to_marlin,
    nvfp4_moe_to_marlin,
)

GOLDEN = sorted((Path(__file__).parent.parent / "golden").glob("*.safetensors"))


def _prepare(t, m):
    target = MarlinTarget(engine=m["impl"], act_dtype=m["act_dtype"], w4a8=m["w4a8_fp8"] == "True")
    case = m["case"]
    if case == "nvfp4_dense":
        return nvfp4_dense_to_marlin(t["src.weight"], t["src.weight_scale"], t["src.weight_scale_2"], target=target)
    if case == "mxfp4_dense":
        return mxfp4_dense_to_marlin(t["src.weight"], t["src.weight_scale"], target=target)
    if case == "nvfp4_moe":
        i, h = int(m["I"]), int(m["H"])
        i_pad = padded_moe_intermediate(i, h, target.facts.padding)  # SGLang gated MoE never pads
        return nvfp4_moe_to_marlin(t["src.w13_weight"], t["src.w13_weight_scale"], t["src.w13_weight_scale_2"],
                                   t["src.w2_weight"], t["src.w2_weight_scale"], t["src.w2_weight_scale_2"],
                                   target=target, i_pad=i_pad)
    assert case == "mxfp4_moe", case
    return mxfp4_moe_to_marlin(t["src.w13_weight"], t["src.w13_weight_scale"], t["src.w2_weight"],
                               t["src.w2_weight_scale"], target=target)


# every case the engines' own code made (tests/golden/README.md): a case lost or renamed fails here
EXPECTED_CASES = [
    "mxfp4_dense_vllm_bfloat16_a8_s0",
    "mxfp4_dense_vllm_bfloat16_pad_s0",
    "mxfp4_dense_vllm_bfloat16_s0",
    "mxfp4_moe_sglang_bfloat16_s0",
    "mxfp4_moe_vllm_bfloat16_a8_s0",
    "mxfp4_moe_vllm_bfloat16_s0",
    "nvfp4_dense_sglang_bfloat16_pad_s0",
    "nvfp4_dense_sglang_bfloat16_s0",
    "nvfp4_dense_sglang_bfloat16_small_s0",
    "nvfp4_dense_sglang_float16_s0",
    "nvfp4_dense_vllm_bfloat16_pad_s0",
    "nvfp4_dense_vllm_bfloat16_s0",
    "nvfp4_dense_vllm_bfloat16_small_s0",
    "nvfp4_dense_vllm_float16_s0",
    "nvfp4_moe_sglang_bfloat16_s0",
    "nvfp4_moe_sglang_bfloat16_small_s0",
    "nvfp4_moe_sglang_float16_s0",
    "nvfp4_moe_vllm_bfloat16_pad_s0",
    "nvfp4_moe_vllm_bfloat16_s0",
    "nvfp4_moe_vllm_bfloat16_small_s0",
    "nvfp4_moe_vllm_float16_s0",
]


def test_golden_set_is_complete():
    assert len(GOLDEN) == 21
    assert [p.stem for p in GOLDEN] == EXPECTED_CASES


@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_golden_case_byte_exact(path):
    tensors = load_file(path)
    with safe_open(path, "pt") as f:
        meta = f.metadata()
    out = _prepare(tensors, meta)
    expected = {k[len("marlin."):]: v for k, v in tensors.items() if k.startswith("marlin.")}
    assert set(out) == set(expected)
    for name, value in expected.items():
        assert_bytes_equal(out[name], value, f"{path.stem}:{name}")
