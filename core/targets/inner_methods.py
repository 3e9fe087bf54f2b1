"""Which quantisation method each engine builds for a source's own quantisation block: the method the
plugin hands every non-expert layer to (attention, dense MLP, shared experts). Pure, for validate's
pre-flight; the plugins ask the installed engine itself (serving/vllm_config.py, sglang_methods.py).

Mirrors, per engine release the engine table (core/targets/engines.py) lists, which names the resolver of each
(`engines.engine_inner_method` dispatches through it):
- vLLM 0.33.0 and 0.34.0 (the same code): `ModelArchConfigConvertorBase._normalize_quantization_config` (a nested ModelOpt block,
  hf_quant_config.json's form, gets quant_method modelopt / modelopt_fp4 / modelopt_mixed from quant_algo;
  a flat config.json block keeps its own; names are lower-cased, `compressed_tensors` ->
  `compressed-tensors`), then `ModelConfig._verify_quantization`'s override walk
  (`ModelOpt*Config.override_quantization_method`: FP8 -> modelopt, NVFP4 / FP4 -> modelopt_fp4, MXFP8
  -> modelopt_mxfp8, MIXED_PRECISION -> modelopt_mixed; DeepSeek-V4 `fp8` -> deepseek_v4_fp8; gpt-oss
  `mxfp4` -> gpt_oss_mxfp4).
- SGLang 0.5.23: `ModelConfig._parse_quant_hf_config` / `_parse_modelopt_quant_config` (a block without
  quant_method or with `modelopt`: MIXED_PRECISION with NVFP4 layers -> modelopt_mixed, otherwise
  w4afp8; FP4 / NVFP4 -> modelopt_fp4; FP8 -> modelopt_fp8; MXFP8 -> mxfp8).
Both read config.json's block, and hf_quant_config.json only when config.json has none
(core/record/converted_config.py serving_block).
"""

from __future__ import annotations

__all__ = ["FP4_METHODS", "FP8_METHODS", "HF_QUANT_CONFIG_BLOCK", "resolve_sglang", "resolve_vllm", "stale_block"]

# methods whose linear layers hold NVFP4 (packed uint8) weights, and those whose hold FP8 weights
FP4_METHODS = frozenset({"modelopt_fp4", "modelopt_mixed", "compressed-tensors"})
FP8_METHODS = frozenset({"fp8", "modelopt", "modelopt_fp8", "deepseek_v4_fp8", "modelopt_mixed",
                         "compressed-tensors", "w4afp8"})


# the model types DeepseekV4FP8Config.override_quantization_method claims (vLLM 0.34 models/deepseek_v41/
# quant_config.py, the class CUDA builds; its V4 parent claims the V4 types only)
_DEEPSEEK_V4_TYPES = ("deepseek_v4", "deepseek_v4_text", "deepseek_v41", "deepseek_v41_text")


def _modelopt_algo(block: dict) -> str | None:
    """quant_algo of a ModelOpt block (config.json's flat one or hf_quant_config.json's nested one)."""
    inner = block.get("quantization")
    src = inner if isinstance(inner, dict) else block
    algo = src.get("quant_algo")
    return str(algo).upper() if algo is not None else None


_FP4_ALGOS = ("NVFP4", "FP4", "W4A16_NVFP4", "NVFP4_AWQ", "MIXED_PRECISION")
HF_QUANT_CONFIG_BLOCK = "hf_quant_config.json"  # a conversion's `serves_from`: the block the plugin serves from


def stale_block(block, hf_quant_config) -> bool:
    """config.json's block contradicts hf_quant_config.json (nvidia/DeepSeek-V3-0324-FP4 keeps the block FP8 of the
    model before its FP4 export): both engines follow config.json's and build the wrong method for the FP4 layers.
    validate reports it (structure.quant_config.stale_block); a conversion serves from hf_quant_config.json."""
    if not isinstance(block, dict) or not isinstance(hf_quant_config, dict):
        return False
    file_algo, block_algo = _modelopt_algo(hf_quant_config), _modelopt_algo(block)
    if file_algo is None:
        return False
    if block_algo:
        return block_algo != file_algo
    return file_algo in _FP4_ALGOS and not str(block.get("quant_method", "")).lower().startswith(("modelopt", "compressed"))


def _is_modelopt(block: dict) -> bool:
    producer = block.get("producer")
    return (isinstance(producer, dict) and producer.get("name") == "modelopt") or \
        str(block.get("quant_method", "")).lower().startswith("modelopt")


def resolve_vllm(block: dict, model_type: str | None) -> str | None:
    method = str(block.get("quant_method", ""))
    nested = block.get("quantization")
    legacy = isinstance(nested, dict) and "modelopt_quant_config" in nested
    producer = block.get("producer") if isinstance(block.get("producer"), dict) else {}
    if (producer.get("name") == "modelopt" or legacy) and isinstance(nested, dict) and nested.get("quant_algo"):
        # normalisation reads only the nested (hf_quant_config.json) form; vLLM refuses other algos here
        method = {"FP8": "modelopt", "FP8_PER_CHANNEL_PER_TOKEN": "modelopt", "FP8_PB_WO": "modelopt",
                  "NVFP4": "modelopt_fp4", "MIXED_PRECISION": "modelopt_mixed"}.get(_modelopt_algo(block), "?")
    method = method.lower().replace("compressed_tensors", "compressed-tensors")
    if method.startswith("modelopt"):  # the ModelOpt override hooks, in vLLM's order
        algo = _modelopt_algo(block) or ""
        if algo == "FP8":
            return "modelopt"
        if "NVFP4" in algo or "FP4" in algo:
            return "modelopt_fp4"
        if "MXFP8" in algo:
            return "modelopt_mxfp8"
        if algo == "MIXED_PRECISION":
            return "modelopt_mixed"
    if method in ("fp8", "deepseek_v4_fp8") and model_type in _DEEPSEEK_V4_TYPES:
        return "deepseek_v4_fp8"
    if method in ("mxfp4", "gpt_oss_mxfp4") and model_type == "gpt_oss":
        return "gpt_oss_mxfp4"
    return method or None


def resolve_sglang(block: dict, model_type: str | None) -> str | None:
    del model_type  # SGLang's lookup does not read it
    method = block.get("quant_method")
    if method is None or method == "modelopt" or "quantization" in block:
        algo = _modelopt_algo(block) or ""
        inner = block.get("quantization") if isinstance(block.get("quantization"), dict) else block
        if algo == "MIXED_PRECISION":
            layers = inner.get("quantized_layers") or {}
            nvfp4 = any(str(v.get("quant_algo", "")).upper() in ("NVFP4", "W4A16_NVFP4")
                        for v in layers.values() if isinstance(v, dict))
            return "modelopt_mixed" if nvfp4 else "w4afp8"
        if "FP4" in algo:
            return "modelopt_fp4"
        if algo == "FP8":
            return "modelopt_fp8"
        if algo == "MXFP8":
            return "mxfp8"
    return str(method).lower() if method else None
