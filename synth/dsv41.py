"""The DeepSeek-V4.1-Flash replica (`synth --family deepseek-v41`): V4's native names and MXFP4 experts
(synth/layouts.py) with V4.1's own parts, at small sizes.

The facts and where they come from (vLLM 0.34.0 `vllm/models/deepseek_v41`, its config
`transformers_utils/configs/deepseek_v41.py`, `config/engram.py`; SGLang 0.5.23 `srt/models/deepseek_v4.py`,
`deepseek_v41_vit.py`, `deepseek_v4_dspark.py`; the deepseek-ai/DeepSeek-V4.1-Flash model page):
- config.json: `architectures [DeepseekV41ForCausalLM]`, `model_type deepseek_v41`, the text model nested under
  `text_config` and the vision tower under `vision_config` (vLLM's DeepseekV41Config flattens both onto the top
  level: `vision_*` names from `vision_config`); `quantization_config` {quant_method fp8, fmt e4m3,
  activation_scheme dynamic, scale_fmt ue8m0, weight_block_size [32, 32], expert_dtype fp4}: the dense linears are
  FP8 in 32x32 blocks with E8M0 scales (vLLM's DeepseekV4FP8Config.get_quant_method serves them as MXFP8 W8A8 and
  names their scales `weight_scale`, nvidia/model.py _linear_scale_param_name), the routed experts MXFP4.
- Trunk layers: V4's block (hyper-connection mixers, sliding-window attention `attn.{wq_a,wq_b,wkv,wo_a,wo_b}`,
  `ffn.gate` with `bias` and, in a vision checkpoint, `bias_vl` on every MoE layer (deepseek_v4/nvidia/model.py:
  "Vision checkpoints route image sentinel tokens with bias_vl ... Created on every MoE layer"), FP8 shared experts,
  routed experts `layers.L.ffn.experts.E.w{1,3,2}.{weight,scale}`). V4.1 builds no hash layers (nvidia/model.py
  DeepseekV4MoE: num_hash_layers=0) and no learned `hc_head` ("v4.1 has no learned hc_head"). The replica's
  attention is sliding-window only (`compress_ratios` 0), as DeepSeek-V4's replica: vLLM builds a compressor on
  every trunk layer listed in `kv_source_layer_ids` (attention.py; its compressor asserts head_dim 512) and an
  indexer on `index_source_layer_ids`, so the one KV source id is past the trunk (the model reads
  max(kv_source_layer_ids)) and no layer indexes. Not modelled: the release's compressed and indexed layers.
- Engram, on the layers of `engram_layer_ids` (common/engram.py Engram, ParallelEngramEmbedding, EngramLayout):
  `layers.L.engram.embed.weight` F8_E4M3 [num_embeddings, engram_head_dim] with per-row 1x32 E8M0 scales
  `engram.embed.scale` [num_embeddings, engram_head_dim / 32] (the mapper routes it to `embed_tokens.weight_scale_inv`),
  the FP8 projection `engram.wkv` [hidden x (hc_mult + 1), (max_ngram_size - 1) x n_heads x head_dim], and BF16
  `engram.q_weight` / `k_weight` [hc_mult, hidden]. The table's rows are the (n-gram, head) prime-sized buckets the
  layout draws upward from `engram_vocab_size - 1`, never reused; `engram_num_embeddings` is their sum here.
  Never FP4: the converter copies Engram byte for byte.
- DSpark draft stages `mtp.{0,1,2}.*` (nvidia/dspark.py, "Its weights ship in the target checkpoint under the
  mtp.{0,1,2}.* prefix"): each a decoder block whose MoE has `dspark_n_routed_experts` experts (nvidia/model.py
  DeepseekV4MoE: a layer index >= num_hidden_layers takes the dspark_* counts); `mtp.0.main_proj` (FP8, [hidden,
  hidden x len(dspark_target_layer_ids)]) and `mtp.0.main_norm`; the head stack on the last stage: `norm`,
  `markov_head.embed` [vocab, dspark_markov_rank], `markov_head.head` [vocab, rank], `confidence_head.proj`
  [1, hidden + rank] F32 (qwen3_dspark.py DSparkMarkovHead / DSparkConfidenceHead; _remap_dspark_name). vLLM builds
  its `context_wkv_proj` from each stage's `attn.wkv` (_duplicate_context_wkv_weights): no tensor of its own.
- The BF16 vision tower `vision.*` and `aligner.*` (deepseek_v4/common/vision.py DeepseekV4ViT / DeepseekV4Aligner:
  patch_embed.proj, blocks.N.{norm1, attn.wqkv, attn.wo, norm2, mlp.w1 [2 x inter, dim], mlp.w2}, norm; aligner w1,
  w2 with biases) and the F32 `image_start` / `image_end` / `image_newline` [hidden]: copied byte for byte.
Sizes, values and the tokenizer are synthetic; which V4.1 linears the release keeps outside FP8 is not public here:
the replica quantises every dense linear of the text model (the block has no ignore list).
"""

from __future__ import annotations

import torch

from .experts import Tweaks
from .layouts import DSV4_HC_MULT, Dims, _dsv4_block, _fp8_linear, _norm
from .seeded import dense, fp8_block_quantize

__all__ = ["DSV41_BLOCK", "dsv41_config", "dsv41_tensors", "dsv41_tokenizer", "draft_experts", "engram_layout"]

DSV41_BLOCK = 32          # the dense linears' FP8 block (quantization_config weight_block_size [32, 32])
DRAFT_STAGES = 3          # mtp.0, mtp.1, mtp.2
_ENGRAM = {"engram_max_ngram_size": 3, "engram_n_heads": 2, "engram_head_dim": 64, "engram_vocab_size": 16,
           "engram_pad_token_id": 2}
_MARKOV_RANK = 32
_VISION = {"model_type": "deepseek_v41_vision", "num_hidden_layers": 1, "hidden_size": 64,
           "num_attention_heads": 2, "intermediate_size": 128, "patch_size": 4, "downsample_ratio": 2,
           "rope_theta": 10000.0}


def draft_experts(d: Dims) -> int:
    """`dspark_n_routed_experts`: fewer than the trunk's, as in the release (its draft MoE is smaller)."""
    return max(1, d.experts // 2)


def _engram_layers(d: Dims) -> list[int]:
    return [d.layers - 1]  # the last trunk layer (the release places Engram on a few middle layers)


def engram_layout(d: Dims) -> tuple[int, ...]:
    """The bucket sizes of one Engram layer's table: per n-gram size, per head, the next unused prime above
    engram_vocab_size - 1 (vLLM 0.34 common/engram.py EngramLayout)."""
    sizes, current = [], _ENGRAM["engram_vocab_size"] - 1
    for _ in range((_ENGRAM["engram_max_ngram_size"] - 1) * _ENGRAM["engram_n_heads"]):
        current += 1
        while any(current % p == 0 for p in range(2, int(current ** 0.5) + 1)):
            current += 1
        sizes.append(current)
    return tuple(sizes)


def _engram(seed: int, d: Dims, dtype: torch.dtype):
    rows, head_dim = sum(engram_layout(d)), _ENGRAM["engram_head_dim"]
    cols = (_ENGRAM["engram_max_ngram_size"] - 1) * _ENGRAM["engram_n_heads"] * head_dim

    def write(out: dict, prefix: str) -> None:
        table = dense(seed, f"{prefix}.engram.embed", (rows, head_dim), std=0.5, dtype=torch.float32)
        out[f"{prefix}.engram.embed.weight"], out[f"{prefix}.engram.embed.scale"] = fp8_block_quantize(
            table, (1, DSV41_BLOCK))
        _fp8_linear(out, seed, f"{prefix}.engram.wkv", d.hidden * (DSV4_HC_MULT + 1), cols, DSV41_BLOCK)
        for w in ("q_weight", "k_weight"):
            out[f"{prefix}.engram.{w}"] = dense(seed, f"{prefix}.engram.{w}", (DSV4_HC_MULT, d.hidden),
                                                dtype=torch.bfloat16)
    return write


def _vision(out: dict, seed: int, d: Dims, dtype: torch.dtype) -> None:
    v = _VISION
    dim, inter, patch = v["hidden_size"], v["intermediate_size"], v["patch_size"]

    def linear(name: str, n: int, k: int, bias: bool = True) -> None:
        out[f"{name}.weight"] = dense(seed, name, (n, k), dtype=dtype)
        if bias:
            out[f"{name}.bias"] = dense(seed, f"{name}.bias", (n,), dtype=dtype)

    linear("vision.patch_embed.proj", dim, 3 * patch * patch)
    for i in range(v["num_hidden_layers"]):
        b = f"vision.blocks.{i}"
        _norm(out, seed, f"{b}.norm1.weight", dim, dtype)
        linear(f"{b}.attn.wqkv", 3 * dim, dim)
        linear(f"{b}.attn.wo", dim, dim)
        _norm(out, seed, f"{b}.norm2.weight", dim, dtype)
        linear(f"{b}.mlp.w1", 2 * inter, dim, bias=False)
        linear(f"{b}.mlp.w2", dim, inter, bias=False)
    _norm(out, seed, "vision.norm.weight", dim, dtype)
    linear("aligner.w1", d.hidden, dim * v["downsample_ratio"] ** 2)
    linear("aligner.w2", d.hidden, d.hidden)
    for name in ("image_start", "image_end", "image_newline"):
        out[name] = dense(seed, name, (d.hidden,), dtype=torch.float32)


def dsv41_tensors(fmt: str, seed: int, d: Dims, tweaks: Tweaks, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """name -> tensor, in file order: embed, trunk layers (Engram on engram_layer_ids), norm, head, the DSpark
    stages, the vision tower."""
    out: dict[str, torch.Tensor] = {"embed.weight": dense(seed, "embed.weight", (d.vocab, d.hidden), dtype=dtype)}
    engram, engram_at = _engram(seed, d, dtype), _engram_layers(d)
    v41 = {"block": DSV41_BLOCK, "bias_vl": True}
    for i in range(d.layers):
        _dsv4_block(out, seed, f"layers.{i}", str(i), i, d, fmt, tweaks, dtype,
                    engram=engram if i in engram_at else None, **v41)
    _norm(out, seed, "norm.weight", d.hidden, dtype)
    out["head.weight"] = dense(seed, "head.weight", (d.vocab, d.hidden), dtype=dtype)
    for s in range(DRAFT_STAGES):
        p = f"mtp.{s}"
        if s == 0:
            _fp8_linear(out, seed, f"{p}.main_proj", d.hidden, d.hidden * len(_target_layers(d)), DSV41_BLOCK)
            _norm(out, seed, f"{p}.main_norm.weight", d.hidden, dtype)
        _dsv4_block(out, seed, p, p, d.layers + s, d, fmt, tweaks, dtype, experts=draft_experts(d), **v41)
        if s == DRAFT_STAGES - 1:
            _norm(out, seed, f"{p}.norm.weight", d.hidden, dtype)
            out[f"{p}.markov_head.embed.weight"] = dense(seed, f"{p}.markov_head.embed", (d.vocab, _MARKOV_RANK),
                                                         dtype=dtype)
            out[f"{p}.markov_head.head.weight"] = dense(seed, f"{p}.markov_head.head", (d.vocab, _MARKOV_RANK),
                                                        dtype=dtype)
            out[f"{p}.confidence_head.proj.weight"] = dense(seed, f"{p}.confidence_head.proj",
                                                            (1, d.hidden + _MARKOV_RANK), dtype=torch.float32)
    _vision(out, seed, d, dtype)
    return out


def _target_layers(d: Dims) -> list[int]:
    return list(range(d.layers))


def dsv41_config(d: Dims) -> dict:
    """config.json: the nested text and vision configs and the FP8 [32, 32] / MXFP4 quantisation block."""
    text = {
        "model_type": "deepseek_v41_text", "hidden_size": d.hidden, "moe_intermediate_size": d.intermediate,
        "num_hidden_layers": d.layers, "num_attention_heads": d.heads, "num_key_value_heads": 1,
        "head_dim": d.head_dim, "q_lora_rank": d.q_lora_rank, "qk_rope_head_dim": min(64, d.head_dim),
        "o_groups": 1, "o_lora_rank": d.heads * d.head_dim, "n_routed_experts": d.experts, "n_shared_experts": 1,
        "num_experts_per_tok": d.top_k, "scoring_func": "sqrtsoftplus", "routed_scaling_factor": 1.5,
        "swiglu_limit": 10.0, "num_hash_layers": 0, "vocab_size": d.vocab, "tie_word_embeddings": False,
        "max_position_embeddings": 4096, "compress_ratios": [0] * (d.layers + DRAFT_STAGES),
        "kv_source_layer_ids": [d.layers], "index_source_layer_ids": [], "sliding_window": 128,
        "hc_mult": DSV4_HC_MULT, "hc_sinkhorn_iters": 20, "hc_eps": 1e-06, "index_n_heads": 64,
        "index_head_dim": 128, "index_topk": 512, "topk_method": "noaux_tc", "norm_topk_prob": True,
        "hidden_act": "silu", "rms_norm_eps": 1e-06, "rope_theta": 10000, "compress_rope_theta": 160000,
        "bos_token_id": 0, "eos_token_id": 1,
        # DSpark: three draft stages with their own, smaller MoE
        "num_nextn_predict_layers": DRAFT_STAGES, "dspark_n_routed_experts": draft_experts(d),
        "dspark_num_experts_per_tok": min(d.top_k, draft_experts(d)), "dspark_target_layer_ids": _target_layers(d),
        "dspark_markov_rank": _MARKOV_RANK,
        # Engram
        "engram_layer_ids": _engram_layers(d), "engram_num_embeddings": [sum(engram_layout(d))] * len(_engram_layers(d)),
        # every synthetic token normalises to itself (dsv41_tokenizer): the compressed vocabulary is the vocabulary
        "engram_compressed_vocab_size": d.vocab, **_ENGRAM,
    }
    return {"architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41", "torch_dtype": "bfloat16",
            "text_config": text, "vision_config": dict(_VISION),
            # the image span's token (129264 of the release's 129280; SGLang 0.5.23 configs/deepseek_v4.py default)
            "image_token_id": d.vocab - 16,
            "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                    "scale_fmt": "ue8m0", "weight_block_size": [DSV41_BLOCK, DSV41_BLOCK],
                                    "expert_dtype": "fp4"}}


def dsv41_tokenizer(d: Dims) -> dict[str, dict]:
    """tokenizer.json, a word-level vocabulary of `d.vocab` synthetic tokens, and tokenizer_config.json naming two
    of them BOS and EOS (ids 0 and 1, as config.json says), so that no token is added. V4.1's engines read the tokenizer
    while building the model: vLLM's Engram hash (common/engram.py NgramHashState) compresses the vocabulary by
    normalising each token's text and checks the result against `engram_compressed_vocab_size`; every token here
    is a distinct lower-case word, so the compressed vocabulary is the vocabulary."""
    tokenizer = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
                 "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None, "decoder": None,
                 "model": {"type": "WordLevel", "vocab": {f"t{i}": i for i in range(d.vocab)}, "unk_token": "t3"}}
    return {"tokenizer.json": tokenizer,
            "tokenizer_config.json": {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "t0",
                                      "eos_token": "t1", "model_max_length": 4096,
                                      "synthetic": "dsv4-convert synth (no real vocabulary)"}}
