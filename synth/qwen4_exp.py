"""The Qwen3.8-Flash-Next replica (`synth --family qwen4-exp`, text architecture `qwen4-exp-text`): Qwen4-Exp's
text stack, a Qwen3.5-style hybrid of Gated-DeltaNet and QSA attention layers (synth/hybrid.py) whose residual
runs as `hc_count` hyper-connection streams, with per-layer n-gram embedding (PLE) tables on some linear layers.

Facts and sources (transformers 5 models/qwen4_exp configuration_qwen4_exp.py and modeling_qwen4_exp.py, as vLLM
0.34's venv ships them; vLLM 0.34 vllm/models/qwen4_exp/nvidia/model.py, ple_layer.py, common/ngram_embedding.py;
SGLang 0.5.23 sglang/srt/models/qwen4_exp.py, configs/qwen4_exp.py):
- `Qwen4ExpForConditionalGeneration` (model_type `qwen4_exp`, text under `text_config` of model_type
  `qwen4_exp_text`) keeps the text stack under `model.language_model.*` and `lm_head`; `Qwen4ExpForCausalLM`
  (vLLM only: SGLang 0.5.23 registers the multimodal class alone) reads the same names through its mapper
  `model.language_model.` -> `model.`, its config flat.
- A layer has no input / post-attention norms: each branch is entered through a gated residual,
  `{attn,mlp}_hyper_connection.{hc_norm [hc*H], input_mix_weight_down [r, hc*H], input_mix_weight_up [hc*H, r],
  block_inject_weight [hc, hc*H]}` (r = hc_lowrank), and the stack ends in `hyper_connection_mixer` (no
  block_inject_weight); both engines build them BF16 whatever the quantisation (vLLM: `quant_config=None`).
- Full-attention layers (`layer_types` `indexed_attention`) are QSA: Qwen3-Next's gated attention plus
  `self_attn.indexer.{index_qk_proj [(n+1)*d, H], q_layernorm [d], k_layernorm [d]}` (`indexer_n_heads` n,
  `indexer_head_dim` d, one key head). MoE: router `mlp.gate`, `mlp.shared_expert`, `mlp.shared_expert_gate`, the
  routed experts `mlp.experts.E.{gate,up,down}_proj` (the NVFP4 releases' per-expert names, Qwen3-Next's block).
- PLE on the linear layers `ple_layer_ids` (one-indexed): `ple.key_proj [hc*H, P]`, `ple.value_proj [H, P]`,
  `ple.norm_{key,query,conv} [hc*H]`, `ple.conv1d [hc*H, 1, ple_conv_kernel_size]`, and the hashed n-gram table
  `ple.ple_embedding.ngram_embedding.shard_<i>.weight`, `split_ngram_parts` row shards of a table of
  (ngram_size - 1) * heads_per_ngram heads of P / heads columns, each head a prime number of rows above
  `ngram_vocab_size_base`, padded to `make_ngram_vocab_size_divisible_by`. The table is BF16, FP8 (one F32
  `ngram_embedding.weight_scale`) or NVFP4 (per shard `weight` U8 and `weight_scale` E4M3, one F32
  `ngram_embedding.weight_scale_2`): vLLM common/ngram_embedding.py Qwen4ExpPLE{Fp8,NvFp4}EmbeddingMethod.
- nvidia's release is ModelOpt MIXED_PRECISION (issue #35), its n-gram tables FP8 (SGLang qwen4_exp.py
  _ple_table_is_fp8: "a ModelOpt MIXED_PRECISION entry for the ngram table (nvidia/*-Flash-Next-NVFP4)"); the
  replica's FP8 attention and linear attention follow the Qwen3.5 replica's MIXED_PRECISION split (an assumption);
  `qwen4-exp-nvfp4` is the plain ModelOpt NVFP4 form (BF16 attention, PLE, hyper-connections) and
  `qwen4-exp-ple-nvfp4` the MIXED_PRECISION form with NVFP4 n-gram tables, which vLLM reads and SGLang does not.
- The MTP draft: a BF16 block under `mtp.*` (qwen4_exp_mtp), `mtp_num_hidden_layers` 1.
Not modelled: the vision tower (served text-only).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..formats.nvfp4 import nvfp4_global_for, quantize_nvfp4
from .hybrid import LINEAR, gated_attention, gdn_layer, layer_types
from .layouts import Dims
from .seeded import dense

__all__ = ["HC", "PLE", "QSA", "ple_layers", "ple_table_rows", "qwen4_exp_layer_extras", "qwen4_exp_mtp",
           "qwen4_exp_top_extras", "qwen4_exp_text_config"]

HC = {"hc_count": 4, "hc_lowrank": 32}
# two n-gram orders x two heads of 16 columns; a small prime base keeps the table a few hundred rows
PLE = {"ple_layer_ids": [1], "ple_embed_dim": 64, "ple_conv_kernel_size": 4, "ngram_size": 3, "heads_per_ngram": 2,
       "ngram_vocab_size_base": 64, "make_ngram_vocab_size_divisible_by": 128, "split_ngram_parts": 2, "seed": 1234}
QSA = {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 32, "indexer_budget": 2048,
       "indexer_compress_ratio": 4}
Linear = Callable[..., None]  # family_layers._linear(out, seed, name, n, k, kind, dtype)
Mlp = Callable[..., None]     # family_layers._mlp(out, seed, base, h, inter, kind, dtype)


def _next_prime(n: int) -> int:
    n += 1
    while n < 2 or any(n % p == 0 for p in range(2, int(n ** 0.5) + 1)):
        n += 1
    return n


def ple_table_rows(ple_index: int) -> int:
    """Rows of the `ple_index`-th PLE layer's table: its heads' primes (the n-th prime above the base for global
    head n, counted over every PLE layer's heads), padded (modeling_qwen4_exp.py Qwen4ExpTextNGramEmbedding)."""
    heads = (PLE["ngram_size"] - 1) * PLE["heads_per_ngram"]
    total = 0
    for head in range(heads):
        prime = PLE["ngram_vocab_size_base"] - 1
        for _ in range(ple_index * heads + head + 1):
            prime = _next_prime(prime)
        total += prime
    divisor = PLE["make_ngram_vocab_size_divisible_by"]
    return -(-total // divisor) * divisor


def ple_layers(d: Dims) -> list[int]:
    """0-based layers with a PLE block: `ple_layer_ids` are one-indexed and must be linear-attention layers."""
    kinds = layer_types(d)
    layers = [i - 1 for i in PLE["ple_layer_ids"] if i <= d.layers]
    assert all(kinds[i] == LINEAR for i in layers), "PLE sits on linear-attention layers only"
    return layers


def qwen4_exp_text_config(d: Dims) -> dict:
    """The text config's Qwen4-Exp keys (beside synth/hybrid.py's linear_config); `full_attention` layers are QSA."""
    kinds = ["indexed_attention" if k != LINEAR else k for k in layer_types(d)]
    return {**HC, **PLE, **QSA, "layer_types": kinds, "mtp_num_hidden_layers": 1, "eos_token_id": d.vocab - 1, "norm_topk_prob": True,
            "hidden_act": "silu", "output_gate_type": "silu"}


def _hyper_connection(out: dict, seed: int, name: str, h: int, dtype: torch.dtype, *, combine: bool = True) -> None:
    hc, r = HC["hc_count"] * h, HC["hc_lowrank"]
    out[f"{name}.hc_norm.weight"] = torch.zeros(hc, dtype=dtype)  # Qwen4ExpTextRMSNorm: 1 + weight, zeros at init
    out[f"{name}.input_mix_weight_down.weight"] = dense(seed, f"{name}.down", (r, hc), dtype=dtype)
    out[f"{name}.input_mix_weight_up.weight"] = dense(seed, f"{name}.up", (hc, r), dtype=dtype)
    if combine:
        out[f"{name}.block_inject_weight.weight"] = dense(seed, f"{name}.inject", (HC["hc_count"], hc), dtype=dtype)


def _ple_table(out: dict, seed: int, base: str, rows: int, table: str, dtype: torch.dtype) -> None:
    """`base.shard_<i>.*` row shards (and the table's one global), `table` "bf16", "fp8" or "nvfp4"."""
    cols = PLE["ple_embed_dim"] // ((PLE["ngram_size"] - 1) * PLE["heads_per_ngram"])
    w = dense(seed, base, (rows, cols), dtype=torch.float32)
    parts = PLE["split_ngram_parts"]
    size = -(-rows // parts)
    if table == "fp8":
        scale = (w.abs().max() / 448.0).float()
        q = (w / scale).to(torch.float8_e4m3fn)
        out[f"{base}.weight_scale"] = scale.reshape(1)
    elif table == "nvfp4":
        packed, block, g = quantize_nvfp4(w, nvfp4_global_for(w.abs().max().item()))
        out[f"{base}.weight_scale_2"] = g.reshape(1)
    for i in range(parts):
        rows_i = slice(i * size, min(rows, (i + 1) * size))
        if table == "fp8":
            out[f"{base}.shard_{i}.weight"] = q[rows_i].contiguous()
        elif table == "nvfp4":
            out[f"{base}.shard_{i}.weight"] = packed[rows_i].contiguous()
            out[f"{base}.shard_{i}.weight_scale"] = block[rows_i].contiguous()
        else:
            out[f"{base}.shard_{i}.weight"] = w[rows_i].to(dtype).contiguous()


def _ple(out: dict, seed: int, p: str, h: int, ple_index: int, table: str, dtype: torch.dtype) -> None:
    hc, dim = HC["hc_count"] * h, PLE["ple_embed_dim"]
    _ple_table(out, seed, f"{p}.ple.ple_embedding.ngram_embedding", ple_table_rows(ple_index), table, dtype)
    out[f"{p}.ple.key_proj.weight"] = dense(seed, f"{p}.ple.key_proj", (hc, dim), dtype=dtype)
    out[f"{p}.ple.value_proj.weight"] = dense(seed, f"{p}.ple.value_proj", (h, dim), dtype=dtype)
    for norm in ("norm_key", "norm_query", "norm_conv"):
        out[f"{p}.ple.{norm}.weight"] = torch.zeros(hc, dtype=dtype)
    out[f"{p}.ple.conv1d.weight"] = dense(seed, f"{p}.ple.conv1d", (hc, 1, PLE["ple_conv_kernel_size"]), dtype=dtype)


def _indexer(out: dict, seed: int, p: str, d: Dims, linear: Linear, kind: str, dtype: torch.dtype) -> None:
    i = f"{p}.self_attn.indexer"
    rows = (QSA["indexer_n_heads"] + QSA["indexer_kv_heads"]) * QSA["indexer_head_dim"]
    linear(out, seed, f"{i}.index_qk_proj", rows, d.hidden, kind, dtype)
    out[f"{i}.q_layernorm.weight"] = torch.zeros(QSA["indexer_head_dim"], dtype=dtype)
    out[f"{i}.k_layernorm.weight"] = torch.zeros(QSA["indexer_head_dim"], dtype=dtype)


def qwen4_exp_layer_extras(out: dict, seed: int, p: str, layer: int, d: Dims, linear: Linear, *, attn: str,
                           big: str, table: str, dtype: torch.dtype) -> None:
    """Layer `layer`'s attention (Gated-DeltaNet or QSA), hyper-connections and PLE block: everything but its MoE."""
    if layer_types(d)[layer] == LINEAR:
        gdn_layer(out, seed, p, d, linear, split=True, big=big, dtype=dtype)
    else:
        gated_attention(out, seed, p, d, linear, kind=attn, dtype=dtype)
        _indexer(out, seed, p, d, linear, attn, dtype)
    for branch in ("attn", "mlp"):
        _hyper_connection(out, seed, f"{p}.{branch}_hyper_connection", d.hidden, dtype)
    if layer in ple_layers(d):
        _ple(out, seed, p, d.hidden, ple_layers(d).index(layer), table, dtype)


def qwen4_exp_top_extras(out: dict, seed: int, root: str, d: Dims, dtype: torch.dtype) -> None:
    """The final stream mixer `<root>.hyper_connection_mixer` (no block_inject_weight: use_combine=False)."""
    _hyper_connection(out, seed, f"{root}.hyper_connection_mixer", d.hidden, dtype, combine=False)


def qwen4_exp_mtp(out: dict, seed: int, d: Dims, mlp: Mlp, linear: Linear, dtype: torch.dtype) -> None:
    """The BF16 MTP block under `mtp.*`, as both engines' drafts read it (vLLM 0.34 nvidia/mtp.py
    Qwen4ExpMultiTokenPredictor, `_remap_mtp_weight_name`; SGLang 0.5.23 qwen4_exp_mtp.py Qwen4ExpForCausalLMMTP):
    `fc_embedding` and `fc_hidden` [H, H] (the residual_linear_shared fusion of hc_count > 1), `pre_fc_norm_embedding`
    [H], `pre_fc_norm_hidden` [hc*H], one QSA layer `mtp.layers.0` with its hyper-connections and a BF16 MoE (the
    routed experts too: excluded `mtp*`, as Qwen3.5's releases keep the draft), and `mtp.hyper_connection_mixer`."""
    h, p = d.hidden, "mtp.layers.0"
    for name in ("fc_embedding", "fc_hidden"):
        out[f"mtp.{name}.weight"] = dense(seed, f"mtp.{name}", (h, h), dtype=dtype)
    out["mtp.pre_fc_norm_embedding.weight"] = torch.zeros(h, dtype=dtype)
    out["mtp.pre_fc_norm_hidden.weight"] = torch.zeros(HC["hc_count"] * h, dtype=dtype)
    gated_attention(out, seed, p, d, linear, kind="bf16", dtype=dtype)
    _indexer(out, seed, p, d, linear, "bf16", dtype)
    for branch in ("attn", "mlp"):
        _hyper_connection(out, seed, f"{p}.{branch}_hyper_connection", h, dtype)
    out[f"{p}.mlp.gate.weight"] = dense(seed, f"{p}.mlp.gate", (d.experts, h), dtype=dtype)
    mlp(out, seed, f"{p}.mlp.shared_expert", h, d.intermediate, "bf16", dtype)
    out[f"{p}.mlp.shared_expert_gate.weight"] = dense(seed, f"{p}.mlp.shared_expert_gate", (1, h), dtype=dtype)
    for e in range(d.experts):
        mlp(out, seed, f"{p}.mlp.experts.{e}", h, d.intermediate, "bf16", dtype)
    _hyper_connection(out, seed, "mtp.hyper_connection_mixer", h, dtype, combine=False)
