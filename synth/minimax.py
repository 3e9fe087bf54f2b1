"""MiniMax-M3 / M3.1's config parts (synth/families.py names the sources): the per-layer dispatch both engines read
and M3.1's `quant_method mxfp8` block with compressed-tensors NVFP4 experts."""

from __future__ import annotations

import torch

from .layouts import Dims

__all__ = ["MXFP8_CT_BLOCK", "minimax_m3_layers", "minimax_m3_vision", "mxfp8_ct_block", "quantize_mxfp8"]

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
    """The block of a MiniMax-M3.1 replica: attention and shared experts are MXFP8 (synth/family_layers.py), the head
    is left out (vLLM 0.34's ModelOpt config quantises a ParallelLMHead it does not exclude)."""
    return {**MXFP8_CT_BLOCK, "ignored_layers": [spec.lm_head.removesuffix(".weight")]}


def quantize_mxfp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 codes [N, K], E8M0 exponents U8 [N, K/32]) of an fp32 [N, K]: each 32-wide block along K gets the
    smallest power of two that brings its amax within E4M3's 448 (OCP MX: scale 2**(e - 127)). The names MiniMax-M3.1
    writes: `weight` and `weight_scale_inv` (vLLM 0.34 minimax_m3 load_weights: "The checkpoint stores block scales
    as ``weight_scale_inv``; the ModelOpt MXFP8 layers expose them as ``weight_scale``")."""
    n, k = w.shape
    blocks = w.float().reshape(n, k // 32, 32)
    amax = blocks.abs().amax(-1).clamp_min(2.0 ** -126)
    exp = torch.ceil(torch.log2(amax / 448.0)).clamp(-127, 127)
    codes = (blocks / torch.exp2(exp)[..., None]).to(torch.float8_e4m3fn).reshape(n, k)
    return codes, (exp + 127).to(torch.uint8)


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
