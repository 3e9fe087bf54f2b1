"""config.json and, for ModelOpt, hf_quant_config.json of a family replica (synth/families.py names the families
and the facts behind them), as each producer writes them (spec CHECKPOINT_FORMATS.md §4.2-4.4, §5)."""

from __future__ import annotations

import re

from ..core.files import CONFIG, HF_QUANT_CONFIG
from ..core.sources.families import family_named
from ..core.sources.source_formats import source_format
from .configs import _ct_config, _modelopt_groups
from .families import FAMILY_SPECS, FamilySpec
from .gemma4 import gemma4_text_config
from .glm5next import glm5next_text_config, glm5next_vision_config
from .hybrid import LINEAR, layer_types, linear_config
from .kimi_k3 import kimi_k3_config, kimi_k3_ignore
from .layouts import Dims
from .minimax import minimax_m3_layers, minimax_m3_vision, mxfp8_ct_block
from .mla import mla_config
from .nemotron import nemotron_config
from .qwen4_exp import ple_layers, qwen4_exp_text_config

__all__ = ["family_config_files"]

_BLOCK_FP8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}

# the VL config's media token ids (transformers 5 Glm5NextConfig), placed inside the replica's small vocabulary
_GLM5_NEXT_MEDIA_TOKENS = ("image_token_id", "video_token_id", "image_start_token_id", "image_end_token_id",
                           "video_start_token_id", "video_end_token_id")

_N_ROUTED = ("deepseek_v3", "deepseek_v32", "kimi_k2", "glm4_moe", "glm_moe_dsa", "kimi_k25")


def _arch_config(spec: FamilySpec, d: Dims) -> dict:
    family = family_named(spec.family)
    text = {
        "model_type": spec.model_type, "hidden_size": d.hidden, "num_hidden_layers": d.layers,
        "num_attention_heads": d.heads, "num_key_value_heads": 1, "head_dim": d.head_dim,
        "intermediate_size": d.intermediate if spec.moe != "mlp" else 2 * d.intermediate,
        "vocab_size": d.vocab, "num_experts_per_tok": d.top_k, "torch_dtype": "bfloat16",
        "tie_word_embeddings": False, **spec.config,
    }
    if spec.moe == "mlp":
        text["moe_intermediate_size"] = d.intermediate
    if spec.stacked:  # Llama-4: intermediate_size is the experts', intermediate_size_mlp the dense MLPs'
        text["intermediate_size_mlp"] = 2 * d.intermediate
    if spec.attention.startswith("mla"):  # no head_dim: MLA's head sizes are its own (synth/mla.py)
        del text["head_dim"]
        text.update(mla_config(d.heads, d.q_lora_rank, indexer=spec.attention == "mla-indexer"), **spec.config)
    experts_key = "n_routed_experts" if spec.model_type in _N_ROUTED else (
        "num_experts" if spec.moe == "mlp" else "num_local_experts")
    text[experts_key] = d.experts
    if spec.dense_layers:
        text["first_k_dense_replace"] = spec.dense_layers
    if spec.shared == "shared_expert":
        text["shared_expert_intermediate_size"] = d.intermediate
    if spec.linear is not None:
        text.update(linear_config(d))
    if spec.ple:  # Qwen4-Exp: hyper-connections, PLE, QSA (synth/qwen4_exp.py)
        text.update(qwen4_exp_text_config(d))
    if spec.architecture and not spec.nested and spec.text_model_type:
        text["model_type"] = spec.text_model_type  # a text architecture of a multimodal family (Qwen4ExpForCausalLM)
    if spec.family.startswith("minimax-m3"):  # every layer MoE, full attention, in both engines' fields
        text.update(minimax_m3_layers(d))
    config = {"architectures": [spec.architecture or family.architectures[0]], "model_type": text["model_type"]}
    if spec.nested:
        text["model_type"] = spec.text_model_type or f"{spec.model_type}_text"
        config.update({"text_config": text, "torch_dtype": "bfloat16", "tie_word_embeddings": False})
    else:
        config.update(text)
    return config


def _modelopt(spec: FamilySpec, d: Dims) -> tuple[dict | None, dict]:
    """(config.json quantization_config or None, hf_quant_config.json), as ModelOpt writes them (§4.2-4.3)."""
    producer = {"name": "modelopt", "version": "0.37.0"}
    lp = spec.prefix
    exclude = [spec.lm_head.removesuffix(".weight"), f"{lp}.*.{spec.moe + '.' if spec.moe else ''}{spec.router}",
               "mtp*" if spec.mtp == "unquantised" else None,
               f"{lp}.{d.layers}*" if spec.mtp == "layer" else None,  # ModelOpt's DeepSeek ptq.py (synth/mtp.py)
               f"{lp}.*.{spec.moe}.shared_expert_gate" if spec.shared_gate else None]
    exclude = [e for e in exclude if e]
    if spec.routed_only:  # Kimi-K2 NVFP4: only the routed experts are FP4
        exclude += [f"{lp}.*.{spec.moe}.{spec.shared}*", *(f"{lp}.{i}.{spec.moe}*" for i in range(spec.dense_layers))]
    if spec.stacked:  # Llama-4's vision tower and projector stay BF16 (an assumption: not from a public list)
        exclude += ["vision_model*", "multi_modal_projector*"]
    if spec.family == "kimi-k25":  # its MoonViT tower and projector
        exclude += ["vision_tower*", "mm_projector*"]
    exclude += [f"{lp}.{glob}" if glob[0].isdigit() else f"{lp}.*.{glob}" for glob in spec.bf16]  # "3.x": layer 3
    if spec.mixed and spec.linear:  # ModelOpt's qwen3_5 recipe keeps in_proj_a / in_proj_b unquantised
        exclude += [f"{lp}.*.linear_attn.in_proj_a", f"{lp}.*.linear_attn.in_proj_b"]
    if spec.ple:  # Qwen4-Exp: hyper-connections (the engines build them unquantised) and the PLE projections BF16
        root = lp.rsplit(".layers", 1)[0]
        exclude += [f"{lp}.*.attn_hyper_connection*", f"{lp}.*.mlp_hyper_connection*", f"{root}.hyper_connection_mixer*",
                    f"{lp}.*.ple.key_proj", f"{lp}.*.ple.value_proj"]
        exclude += [] if spec.mixed else [f"{lp}.*.ple*"]
    if not spec.mixed:
        exclude += [f"{lp}.*.self_attn*"] + ([f"{lp}.*.linear_attn*"] if spec.linear else [])
        hfq = {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16, "exclude_modules": exclude}
        qc = {"quant_method": "modelopt", "quant_algo": "NVFP4", "config_groups": _modelopt_groups(),
              "ignore": exclude, "producer": producer}
    else:
        layers = {}
        kinds = layer_types(d) if spec.linear else ["full_attention"] * d.layers
        for i in range(d.layers):
            attn = (("linear_attn", ("in_proj_qkv", "in_proj_z", "out_proj")) if kinds[i] == LINEAR else
                    ("self_attn", ("q_proj", "k_proj", "v_proj", "o_proj")))
            layers |= {f"{lp}.{i}.{attn[0]}.{p}": {"quant_algo": "FP8"} for p in attn[1]}
            if spec.ple:  # Qwen4-Exp: the QSA indexer as its attention, the n-gram table as synth/qwen4_exp.py writes it
                layers |= {f"{lp}.{i}.self_attn.indexer.index_qk_proj": {"quant_algo": "FP8"}} if kinds[i] != LINEAR else {}
                if i in ple_layers(d):
                    layers[f"{lp}.{i}.ple.ple_embedding.ngram_embedding"] = (
                        {"quant_algo": "FP8"} if spec.ple == "fp8" else {"quant_algo": "NVFP4", "group_size": 16})
            layers |= {f"{lp}.{i}.{spec.moe}.{spec.shared}.{p}": {"quant_algo": "NVFP4", "group_size": 16}
                       for p in ("gate_proj", "up_proj", "down_proj")}
            layers |= {f"{lp}.{i}.{spec.moe}.experts.{e}.{p}": {"quant_algo": "NVFP4", "group_size": 16}
                       for e in range(d.experts) for p in ("gate_proj", "up_proj", "down_proj")}
        hfq = {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": None, "quantized_layers": layers,
               "exclude_modules": exclude}
        qc = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "quantized_layers": layers,
              "ignore": exclude, "producer": producer}
    return (None if spec.hf_quant_only else qc), {"producer": producer, "quantization": hfq}


def family_config_files(family: str, fmt: str, d: Dims) -> dict[str, dict]:
    """config.json and, for ModelOpt, hf_quant_config.json of a family checkpoint."""
    spec = FAMILY_SPECS[family]
    config = nemotron_config(d, latent=spec.latent_moe) if spec.family == "nemotron-h" else _arch_config(spec, d)
    if spec.attention == "kda-mla":  # GLM-5.3-Flash (synth/glm5next.py): flat for the text model, nested for the VL
        text = glm5next_text_config(d, spec.dense_layers)
        config = {"architectures": list(family_named(family).architectures), "model_type": spec.model_type}
        if spec.nested:
            config |= {"text_config": {**text, "model_type": "glm5_next_text"}, "vision_config": glm5next_vision_config(d),
                       "torch_dtype": "bfloat16", "tie_word_embeddings": False,
                       **{k: d.vocab - 2 - i for i, k in enumerate(_GLM5_NEXT_MEDIA_TOKENS)}}
        else:
            config |= text
    if family == "gemma4-moe":
        config = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4", "torch_dtype": "bfloat16",
                  "text_config": gemma4_text_config(d), "tie_word_embeddings": True,
                  "vision_config": {"model_type": "gemma4_vision", "hidden_size": 64, "intermediate_size": 128,
                                    "num_hidden_layers": 1, "num_attention_heads": 1}}  # no tensors: served text-only
    if family == "kimi-k25":  # MoonViT's config, no tensors (served text-only): transformers 5 KimiK25VisionConfig's
        # fields and the hub's remote-code schema SGLang 0.5.23 kimi_k25.py reads (vt_hidden_size, text_hidden_size,
        # init_pos_emb_*; vLLM 0.34 transformers_utils/config.py: "hub remote code uses old schema")
        config["vision_config"] = {"model_type": "kimi_k25_vision", "patch_size": 14, "num_attention_heads": 2,
                                   "num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 128,
                                   "vt_hidden_size": 64, "vt_num_attention_heads": 2, "vt_num_hidden_layers": 1,
                                   "vt_intermediate_size": 128, "init_pos_emb_height": 64, "init_pos_emb_width": 64,
                                   "init_pos_emb_time": 4, "pos_emb_type": "divided_fixed",
                                   "video_attn_type": "spatial_temporal", "merge_type": "sd2_tpool",
                                   "merge_kernel_size": [2, 2], "text_hidden_size": d.hidden}
    if family == "kimi-k3":
        config = kimi_k3_config(d)
    if family == "minimax-m3-vl":  # its vision tower's config, no tensors (served text-only): synth/minimax.py
        config.update(minimax_m3_vision(d))
    files = {CONFIG: config}
    row = source_format(fmt)
    if row.synth.config == "mxfp8-ct":
        config["quantization_config"] = mxfp8_ct_block(spec, d)
    elif row.synth.config == "ct":
        config["quantization_config"] = qc = _ct_config(row.trunk.value)
        if family == "kimi-k3":  # the routed experts alone (synth/kimi_k3.py)
            qc["ignore"] = kimi_k3_ignore()
        elif spec.mixed:  # llm-compressor's Qwen3.5 recipe quantises self_attn and the shared expert
            qc["ignore"] = [i for i in qc["ignore"] if "self_attn" not in i and "shared_experts" not in i]
        elif spec.shared:
            qc["ignore"] += [f"re:.*{spec.shared}\\..*"]
        qc["ignore"] += ["re:.*shared_expert_gate$"] if spec.shared_gate else []
        qc["ignore"] += ["re:.*linear_attn.*"] if spec.linear else []
        qc["ignore"] += ["re:^mtp\\..*"] if spec.mtp == "unquantised" else []
        # DeepSeek's BF16 MTP layer num_hidden_layers (GLM-5.3-Flash's compressed-tensors release; synth/glm5next.py)
        qc["ignore"] += [f"re:^{re.escape(spec.prefix)}\\.{d.layers}\\..*"] if spec.mtp == "layer" else []
        qc["ignore"] += ["re:.*visual.*"] if spec.nested and family != "kimi-k3" else []  # the vision tower (llm-compressor PR #2740)
        qc["ignore"] += ["re:.*router.*", "re:.*vision_tower.*"] if family == "gemma4-moe" else []
    else:
        qc, hfq = _modelopt(spec, d)
        if spec.stale_block:  # the pre-FP4 model's block, left in config.json (DeepSeek-V3-0324-FP4)
            config["quantization_config"] = dict(_BLOCK_FP8)
        elif qc is not None:
            config["quantization_config"] = qc
        files[HF_QUANT_CONFIG] = hfq
    return files
