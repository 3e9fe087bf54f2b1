"""config.json / hf_quant_config.json / tokenizer files of a synthetic checkpoint, per source format
(docs/spec/CHECKPOINT_FORMATS.md §3.2 DeepSeek-V4, §4.2-4.4 ModelOpt, §5 compressed-tensors, §6 gpt-oss)."""

from __future__ import annotations

from typing import Any

from ..core.files import CONFIG, HF_QUANT_CONFIG
from ..core.sources.source_formats import SourceFormat, source_format
from .layouts import DSV4_HC_MULT, Dims
from .minimax import MXFP8_CT_BLOCK

__all__ = ["config_files"]

_DSV4_FP8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "scale_fmt": "ue8m0",
             "weight_block_size": [128, 128]}
_DSV4_EXCLUDE = ["*.attn.*", "*.ffn.shared_experts.*", "head", "mtp.*"]
_HF_EXCLUDE = ["lm_head", "model.layers.*.mlp.gate", "model.layers.*.mlp.shared_experts*",
               "model.layers.*.self_attn*"]
_CT_IGNORE = ["lm_head", "re:.*mlp\\.gate$", "re:.*shared_experts.*", "re:.*self_attn.*"]
_GPTOSS_NOT_CONVERT = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]


def _fp4_args(group: int) -> dict:
    return {"dynamic": False, "num_bits": 4, "type": "float", "group_size": group}


def _modelopt_groups() -> dict:
    return {"group_0": {"input_activations": _fp4_args(16), "weights": _fp4_args(16), "targets": ["Linear"]}}


# DeepSeek-V4-Flash's config.json beyond the dimensions (the published Flash-Base config.json, inlined in
# alibaba/rtp-llm's DeepSeek-V4 config test; the same values are transformers' DeepseekV4Config defaults,
# checkpoint deepseek-ai/DeepSeek-V4-Flash-Base): the engines read them while building the model (SGLang's
# ModelConfig takes its window from `sliding_window`; vLLM builds e_score_correction_bias for `noaux_tc`).
_DSV4_MODEL = {"sliding_window": 128, "hc_mult": DSV4_HC_MULT, "hc_sinkhorn_iters": 20, "hc_eps": 1e-06,
               "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512, "topk_method": "noaux_tc",
               "norm_topk_prob": True, "hidden_act": "silu", "rms_norm_eps": 1e-06, "rope_theta": 10000,
               "compress_rope_theta": 160000, "bos_token_id": 0, "eos_token_id": 1,
               "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 16,
                                "original_max_position_embeddings": 65536, "type": "yarn"}}


def _dsv4_config(d: Dims) -> dict[str, Any]:
    """Shrunk where the release's value sizes a tensor: o_groups x o_lora_rank = heads x head_dim (synth's wo_a
    and wo_b; one group, its rank a multiple of SGLang's 128-wide FP8 wo_a blocks), max_position_embeddings
    (the engines' rotary caches; Flash: 1048576) and `compress_ratios`: every layer (and the MTP slot) 0, a
    sliding-window layer like Flash's first two (its list: 0, 0, then 4 / 128 alternating, 0 for MTP), so
    synth writes no compressor or indexer tensors."""
    return {
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "torch_dtype": "bfloat16",
        "hidden_size": d.hidden, "moe_intermediate_size": d.intermediate, "num_hidden_layers": d.layers,
        "num_attention_heads": d.heads, "num_key_value_heads": 1, "head_dim": d.head_dim,
        "q_lora_rank": d.q_lora_rank, "qk_rope_head_dim": min(64, d.head_dim),
        "o_groups": 1, "o_lora_rank": d.heads * d.head_dim,
        "n_routed_experts": d.experts, "n_shared_experts": 1, "num_experts_per_tok": d.top_k,
        "scoring_func": "sqrtsoftplus", "routed_scaling_factor": 1.5, "swiglu_limit": 10.0,
        "num_hash_layers": d.hash_layers, "num_nextn_predict_layers": 1 if d.mtp else 0,
        "vocab_size": d.vocab, "tie_word_embeddings": False, "expert_dtype": "fp4",
        "max_position_embeddings": 4096, "compress_ratios": [0] * (d.layers + 1), **_DSV4_MODEL,
        "quantization_config": dict(_DSV4_FP8),
    }


def _modelopt_dsv4(d: Dims) -> tuple[dict, dict]:
    layers = {f"layers.{i}.ffn.experts": {"quant_algo": "NVFP4", "group_size": 16} for i in range(d.layers)}
    producer = {"name": "modelopt", "version": "dsv4-nvfp4-experts"}
    config = _dsv4_config(d)
    config["quantization_config"].update({
        "moe_quant_algo": "NVFP4", "producer": producer, "quant_algo": "MIXED_PRECISION",
        "kv_cache_quant_algo": None, "group_size": 16, "config_groups": _modelopt_groups(),
        "quantized_layers": layers, "ignore": list(_DSV4_EXCLUDE)})
    hf_quant = {"producer": producer, "quantization": {
        "quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": None, "group_size": 16,
        "quantized_layers": layers, "exclude_modules": list(_DSV4_EXCLUDE)}}
    return config, hf_quant


def _hf_config(d: Dims) -> dict[str, Any]:
    return {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "torch_dtype": "bfloat16",
        "hidden_size": d.hidden, "moe_intermediate_size": d.intermediate, "num_hidden_layers": d.layers,
        "num_attention_heads": d.heads, "head_dim": d.head_dim, "n_routed_experts": d.experts,
        "n_shared_experts": 1, "num_experts_per_tok": d.top_k, "vocab_size": d.vocab,
        "tie_word_embeddings": False,
        # read by both engines while they build a DeepSeek-V3 model (core/targets/engine_config.py), as its config.json has them
        "moe_layer_freq": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
    }


def _ct_config(quant: str, fmt: str | None = None) -> dict[str, Any]:
    fmt = fmt or f"{quant}-pack-quantized"
    if quant == "nvfp4":
        weights = {**_fp4_args(16), "strategy": "tensor_group", "symmetric": True,
                   "scale_dtype": "torch.float8_e4m3fn"}
        acts = {**weights, "dynamic": "local", "observer": "static_minmax"}
    else:
        weights = {**_fp4_args(32), "strategy": "group", "symmetric": True, "scale_dtype": "torch.uint8"}
        acts = None
    return {"quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": acts,
                                          "output_activations": None, "format": fmt}},
            "ignore": list(_CT_IGNORE), "kv_cache_scheme": None, "global_compression_ratio": None,
            "sparsity_config": {}, "version": "0.18.0"}


def _gptoss_config(d: Dims) -> dict[str, Any]:
    return {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "torch_dtype": "bfloat16",
        "hidden_size": d.hidden, "intermediate_size": d.intermediate, "num_hidden_layers": d.layers,
        "num_attention_heads": d.heads, "head_dim": d.head_dim, "num_local_experts": d.experts,
        "num_experts_per_tok": d.top_k, "experts_per_token": d.top_k, "vocab_size": d.vocab,
        "swiglu_limit": 7.0, "tie_word_embeddings": False,
        "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": list(_GPTOSS_NOT_CONVERT)},
    }


def _modelopt_hf(d: Dims) -> tuple[dict, dict]:
    producer = {"name": "modelopt", "version": "0.37.0"}
    config = _hf_config(d)
    config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4",
                                     "config_groups": _modelopt_groups(), "ignore": list(_HF_EXCLUDE),
                                     "producer": producer}
    hf_quant = {"producer": producer, "quantization": {
        "quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
        "exclude_modules": list(_HF_EXCLUDE)}}
    return config, hf_quant


def _mxfp8_ct(d: Dims) -> tuple[dict, None]:
    """MiniMax-M3.1's layout: quant_method mxfp8 with NVFP4 experts (synth/minimax.py); the BF16 layers ignored."""
    config = _hf_config(d)
    config["quantization_config"] = {**MXFP8_CT_BLOCK, "ignored_layers": list(_HF_EXCLUDE)}
    return config, None


def _ct(d: Dims, row: SourceFormat) -> tuple[dict, None]:
    config = _hf_config(d)
    config["quantization_config"] = _ct_config(row.trunk.value, row.ct_format)
    return config, None


# the source-format table's `synth.config` -> the writer of its config files: (dims, row) -> (config, hf_quant_config)
_WRITERS = {
    "dsv4": lambda d, row: (_dsv4_config(d), None),
    "modelopt-dsv4": lambda d, row: _modelopt_dsv4(d),
    "modelopt-hf": lambda d, row: _modelopt_hf(d),
    "ct": _ct,
    "mxfp8-ct": lambda d, row: _mxfp8_ct(d),
    "gpt-oss": lambda d, row: (_gptoss_config(d), None),
}


def _model_config(fmt: str, d: Dims) -> tuple[dict, dict | None]:
    row = source_format(fmt)
    return _WRITERS[row.synth.config](d, row)


def config_files(fmt: str, dims: Dims) -> dict[str, dict]:
    """file name -> JSON object, for every non-tensor file of the checkpoint."""
    config, hf_quant = _model_config(fmt, dims)
    files = {
        CONFIG: config,
        "generation_config.json": {"_from_model_config": True, "bos_token_id": 0, "eos_token_id": 1,
                                   "do_sample": True, "temperature": 0.6, "top_p": 0.95},
        "tokenizer_config.json": {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
                                  "eos_token": "</s>", "model_max_length": 4096,
                                  "synthetic": "dsv4-convert synth (no real vocabulary)"},
    }
    if hf_quant is not None:
        files[HF_QUANT_CONFIG] = hf_quant
    return files
