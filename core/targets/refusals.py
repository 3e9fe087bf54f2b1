"""What an engine release itself cannot serve through the plugin, with the engine's own reason: the `Refused` rows of
core/targets/served.py (its REFUSED table reads them), and here the rows for what the real producers write
(tests/fixtures/producers: NVIDIA ModelOpt, llm-compressor), each quoted from the engine's code and proven by a
serving_tests node. Pure: no engine import.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Refused", "producer_refusals"]


@dataclass(frozen=True)
class Refused:
    """A family x source format that an engine release itself cannot serve through the plugin, with the engine's
    own reason (quoted from its code) and the serving_tests node id that shows it: the gate and the matrix say why."""
    family: str
    source_format: str
    engine: str           # release key
    reason: str
    proof: str


def producer_refusals(engine_versions: tuple[str, ...]) -> tuple[Refused, ...]:
    """The real producers' outputs no engine loads as the producer wrote them (or, DeepSeek-V3 on SGLang, even with
    the config keys validate asks for), for the release keys `engine_versions`."""
    return (
        # the real producers' outputs (tests/fixtures/producers) no engine loads, as the producer wrote them
        *(Refused(family, "mxfp4-modelopt-hf", key, (
            "SGLang cannot load ModelOpt's MXFP4 export itself: `_parse_modelopt_quant_config` maps no quant_algo "
            "'mxfp4' (0.47), so `quant_method: modelopt` builds ModelOptFp8Config, which refuses it (\"ModelOptFp8Config "
            "only supports regular FP8 quantization, but found 'mxfp4'\"); 'W4A16_MXFP4' (0.48) gets ModelOptFp4Config, "
            "which refuses it too (\"ModelOpt currently only supports: FP8, NVFP4, NVFP4_AWQ, W4A16_NVFP4 quantizations "
            "in sglang\")" if key == "sglang 0.5.23" else
            "vLLM cannot load ModelOpt's MXFP4 export itself: its ModelOpt override takes an algo holding 'FP4' for "
            "modelopt_fp4, whose config refuses 'MXFP4' (modelopt.py: \"ModelOpt currently only supports: ['FP8', "
            "'FP8_PER_CHANNEL_PER_TOKEN', 'FP8_PB_WO', 'NVFP4', 'W4A16_NVFP4', 'MXFP8', 'MIXED_PRECISION'] "
            "quantizations in vLLM\")"),
            "serving_tests/test_engine_refusals.py::test_neither_engine_loads_the_modelopt_mxfp4_source_itself")
          for family in ("qwen3-moe", "deepseek-v3") for key in engine_versions),
        *(Refused(family, "mxfp4-ct", "sglang 0.5.23",
                  "SGLang cannot load llm-compressor's MXFP4A16 export itself (every Linear quantised, attention too): "
                  "its compressed-tensors lookup has no MXFP4 weight-only linear scheme (compressed_tensors.py "
                  "_get_scheme_from_parts: \"No compressed-tensors compatible scheme was found.\")",
                  "serving_tests/test_engine_refusals.py::test_sglang_cannot_load_the_compressed_tensors_mxfp4a16_source_itself")
          for family in ("qwen3-moe", "mixtral")),
        Refused("deepseek-v3", "nvfp4-ct", "sglang 0.5.23",
                "SGLang cannot load llm-compressor's DeepSeek-V3 NVFP4A16 export itself, even with the config keys it "
                "lacks: its DeepSeek loader fuses q_a_proj and kv_a_proj_with_mqa by concatenating every tensor of the "
                "pair (deepseek_common/deepseek_weight_loader.py do_load_weights, `torch.cat([q_a_proj_weight, "
                "kv_a_proj_weight], dim=cat_dim)`), so their two `weight_global_scale` [1] become [2] against the fused "
                "layer's one (layers/linear.py weight_loader: AssertionError)",
                "serving_tests/test_engine_refusals.py::test_sglang_cannot_load_the_llm_compressor_deepseek_v3_even_with_its_keys"),
    )
