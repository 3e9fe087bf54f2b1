"""MiniMax-M3 / M3.1's part of the served table (core/targets/served.py reads it; kept here so that module stays
within its size): the source formats its releases use with the method the engines build for their non-expert layers,
and the engine releases that cannot load a format themselves, with the engine's own reason and the test node that
shows it. Pure data: no engine import.
"""

from __future__ import annotations

from .refusals import Refused

__all__ = ["MINIMAX_M3_FORMATS", "MINIMAX_M3_REFUSED"]

# (format, the engines' method for the non-expert layers): nvidia/MiniMax-M3-NVFP4's ModelOpt MIXED_PRECISION, and
# M3.1's `quant_method: mxfp8` (MXFP8 linears, compressed-tensors NVFP4 experts), which both engines' resolvers name
# `mxfp8` (core/targets/inner_methods.py); rows on every release but those MINIMAX_M3_REFUSED names
MINIMAX_M3_FORMATS = (("nvfp4-modelopt-hf", "modelopt_mixed"), ("nvfp4-ct-mxfp8", "mxfp8"))

_NODES = "serving_tests/test_engine_refusals.py::"
_MXFP8_EXPERTS = _NODES + "test_minimax_m31_experts_are_built_as_mxfp8_by_the_release"
_TEXT_033 = _NODES + "test_vllm_033_cannot_build_the_minimax_m3_text_model"

_SGLANG_M31 = (
    "SGLang 0.5.23 builds `quant_method: mxfp8` as Fp8Config (quantization/__init__.py QUANTIZATION_METHODS 'mxfp8': "
    "Fp8Config, MXFP8 experts), which cannot load M3.1's NVFP4 `weight_packed` experts (FusedMoE _load_w13: size "
    "mismatch); its M3.1 config, MiniMaxM3Nvfp4Config, is built only for `--quantization minimax_m3_nvfp4` "
    "(model_config.py: \"Resolved by the MiniMax override from the MoE fields\", but no override_quantization_method "
    "in the release claims moe_quant_algo)")
_VLLM_033_M31 = (
    "vLLM 0.33.0's ModelOptMxFp8Config.from_config normalises MiniMax's `quant_method: mxfp8` block to quant_algo MXFP8, "
    "kv_cache_quant_algo and exclude_modules only (moe_quant_algo, which 0.34 reads for \"MiniMax-M3.1 checkpoints "
    "[that] keep MXFP8 linears but store routed experts as compressed-tensors NVFP4\", is dropped): the routed experts "
    "get ModelOptMxFp8FusedMoE, whose MXFP8 parameters cannot load the NVFP4 `weight_packed` experts (size mismatch)")
_VLLM_033_TEXT = (
    "vLLM 0.33.0's MiniMax-M3 attention reads `config.rope_theta` and `config.partial_rotary_factor` "
    "(models/minimax_m3/nvidia/model.py get_rope(rope_parameters={\"rope_theta\": config.rope_theta, ...})), which only "
    "its own MiniMaxM3TextConfig sets: the text config of the VL checkpoint (minimax_m3_vl, served). A text-only "
    "MiniMaxM3SparseForCausalLM config (model_type minimax_m2, as SGLang reads M3's) is built by transformers 5.20, "
    "which keeps them in rope_parameters: AttributeError")

# (family, source format, release, the engine's reason, the test node)
MINIMAX_M3_REFUSED = tuple(Refused(*row) for row in (
    ("minimax-m3", "nvfp4-ct-mxfp8", "sglang 0.5.23", _SGLANG_M31, _MXFP8_EXPERTS),
    ("minimax-m3-vl", "nvfp4-ct-mxfp8", "sglang 0.5.23", _SGLANG_M31, _MXFP8_EXPERTS),
    ("minimax-m3-vl", "nvfp4-ct-mxfp8", "vllm 0.33", _VLLM_033_M31, _MXFP8_EXPERTS),
    ("minimax-m3", "nvfp4-modelopt-hf", "vllm 0.33", _VLLM_033_TEXT, _TEXT_033),
    ("minimax-m3", "nvfp4-ct-mxfp8", "vllm 0.33", _VLLM_033_TEXT, _TEXT_033),
))
