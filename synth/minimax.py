"""MiniMax-M3 / M3.1's config parts (synth/families.py names the sources): the per-layer dispatch both engines read
and M3.1's `quant_method mxfp8` block with compressed-tensors NVFP4 experts."""

from __future__ import annotations

from .layouts import Dims

__all__ = ["MXFP8_CT_BLOCK", "minimax_m3_layers", "minimax_m3_vision", "mxfp8_ct_block"]

# M3.1's quantisation block beyond the exclusions: the fields vLLM 0.34 ModelOptMxFp8Config.from_config requires for
# NVFP4 experts (moe_quant_algo NVFP4, moe_quant_format nvfp4-pack-quantized, group_size 16) and SGLang 0.5.23's
# Fp8Config / MiniMaxM3Nvfp4Config.from_config read (activation_scheme dynamic, weight_block_size [1, 32]). The
# release's FP8 KV cache (`kv_cache_quant_algo`) is left out: no KV cache is built here.
MXFP8_CT_BLOCK = {"quant_method": "mxfp8", "activation_scheme": "dynamic", "weight_block_size": [1, 32],
                  "moe_quant_algo": "NVFP4", "moe_quant_format": "nvfp4-pack-quantized", "group_size": 16}


def minimax_m3_layers(d: Dims) -> dict:
    """Every layer full attention with a sparse MoE: vLLM 0.34 reads `layer_types` / `mlp_layer_types` (transformers'
    MiniMaxM3VLTextConfig fields; `minimax_m2` configs keep them as written), SGLang 0.5.23 `moe_layer_freq`."""
    return {"layer_types": ["full_attention"] * d.layers, "mlp_layer_types": ["sparse"] * d.layers,
            "moe_layer_freq": [1] * d.layers}


def mxfp8_ct_block(spec, d: Dims) -> dict:
    """The block of a MiniMax-M3.1 replica: the BF16 attention and shared experts by module path, as both engines
    match `ignored_layers` (SGLang: whole dotted segments, vLLM: substrings), in the text model's spelling
    (`model.layers.L...`, what SGLang's VL model prefixes) and, for the VL checkpoint, the tensors' own."""
    prefixes = dict.fromkeys(("model.layers", spec.prefix))
    ignored = [f"{p}.{i}.{m}" for p in prefixes for i in range(d.layers)
               for m in ("self_attn", f"{spec.moe}.{spec.shared}")]
    return {**MXFP8_CT_BLOCK, "ignored_layers": [*ignored, spec.lm_head.removesuffix(".weight")]}


def minimax_m3_vision(d: Dims) -> dict:
    """The VL checkpoint's vision tower config at a small size (no tensors: the replica is served text-only). Both
    engines read it while they build the wrapper: SGLang 0.5.23 minimax_m3_vl.py always builds the tower
    (CLIPVisionConfig.from_dict of it: "vision_config is required"), vLLM 0.33 its own MiniMaxM3Config keeps it, 0.34
    parses it as transformers' MiniMaxM3VLVisionConfig (fields: patch_size 14, temporal_patch_size 2,
    spatial_merge_size 2 as its defaults; "hub code uses old schema", vLLM 0.34 transformers_utils/config.py);
    `projector_hidden_size` is the text model's width."""
    return {"projector_hidden_size": d.hidden,
            "vision_config": {"model_type": "minimax_m3_vl_vision", "hidden_size": 64, "intermediate_size": 128,
                              "num_hidden_layers": 1, "num_attention_heads": 2, "num_channels": 3,
                              "image_size": 56, "patch_size": 14, "temporal_patch_size": 2,
                              "spatial_merge_size": 2, "hidden_act": "gelu", "layer_norm_eps": 1e-5,
                              # the hub schema SGLang's CLIPVisionConfig requires (minimax_vl_common.py: 3D RoPE
                              # only, its merge sizes from img_token_compression_config)
                              "position_embedding_type": "rope", "rope_mode": "3d", "rope_theta": 10000.0,
                              "vision_segment_max_frames": None,
                              "img_token_compression_config": {"temporal_patch_size": 2, "spatial_merge_size": 2}}}
