"""Tiny checkpoints of real model families (`dsv4-convert synth OUT --family NAME`): the family's real tensor
names (core/naming.py), config.json and quantisation config, at shrunk sizes.

The facts per family, and where they come from:
- qwen3-moe: Qwen3MoeForCausalLM, `model.layers.L.mlp.experts.E.*_proj`, router `mlp.gate`, no shared
  experts (transformers modeling_qwen3_moe.py; nvidia/Qwen3-30B-A3B-NVFP4 ModelOpt NVFP4, config
  `quant_method: modelopt`; RedHatAI/Qwen3-30B-A3B-NVFP4 compressed-tensors nvfp4-pack-quantized).
- deepseek-v3 (DeepSeek-R1/V3, Kimi-K2): DeepseekV3ForCausalLM, `first_k_dense_replace` dense layers with
  NVFP4 `mlp.{gate,up,down}_proj`, NVFP4 `mlp.shared_experts`, BF16 MLA attention; ModelOpt's
  quantize_to_nvfp4.py deletes `quantization_config` from config.json, so only hf_quant_config.json says
  NVFP4 (spec CHECKPOINT_FORMATS.md §4.1, §4.4; nvidia/DeepSeek-R1-0528-FP4 tensor list).
- glm4-moe (GLM-4.5/4.6/4.7): Glm4MoeForCausalLM, `first_k_dense_replace`, `mlp.shared_experts`, router
  `mlp.gate` with `e_score_correction_bias`; the MTP layer `model.layers.<num_hidden_layers>.*` lives in
  `mtp.safetensors`, which model.safetensors.index.json does not list (vLLM 0.33 glm4_moe_mtp.py; the
  GLM-4.6/4.7 NVFP4 releases' file lists).
- qwen3.5-moe (Qwen3.5 / Qwen3.6 MoE): Qwen3_5MoeForConditionalGeneration, text stack under
  `model.language_model.layers`, `mlp.shared_expert` + `mlp.shared_expert_gate`, MTP under `mtp.*`;
  nvidia's ModelOpt export is MIXED_PRECISION (FP8 attention, NVFP4 experts, unquantised MTP), config
  nested under `text_config` (vLLM 0.33 qwen3_5.py, qwen3_5_mtp.py).
- minimax-m2 / mixtral: MiniMaxM2ForCausalLM / MixtralForCausalLM, `model.layers.L.block_sparse_moe.experts.E.
  {w1,w3,w2}`, router `block_sparse_moe.gate` (vLLM 0.33 minimax_m2.py, mixtral.py).
- llama4: Llama4ForConditionalGeneration, text stack under `language_model.model.layers`, `feed_forward.router`,
  `feed_forward.shared_expert`, and ModelOpt's stacked experts `feed_forward.experts.{gate_up_proj,down_proj}`
  K-major with `_weight_scale`, `_weight_scale_2`, `_input_scale` (vLLM 0.33 llama4.py load_moe_expert_weights,
  mllama4.py _rename_weight_for_modelopt_checkpoint; nvidia/Llama-4-Scout-17B-16E-Instruct-FP4). One global and
  one input scale per stack is this generator's assumption (not confirmed from a public tensor list).
Sizes, values and the tokenizer are synthetic; the generator never copies real weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dsv4_convert.core.files import CONFIG, HF_QUANT_CONFIG
from dsv4_convert.core.naming import family_named
from dsv4_convert.formats.nvfp4 import global_to_ct, nvfp4_global_for, quantize_nvfp4
from dsv4_convert.synth.configs import _ct_config, _modelopt_groups
from dsv4_convert.synth.experts import Tweaks, encode_layer_experts
from dsv4_convert.synth.layouts import Dims
from dsv4_convert.synth.seeded import dense, expert_matrix

__all__ = ["FAMILY_SPECS", "FamilySpec", "family_config_files", "family_tensors"]



@dataclass(frozen=True)
class FamilySpec:
    family: str                    # core/naming.py family name
    formats: tuple[str, ...]       # source formats its releases use; the first is the default
    model_type: str
    moe: str                       # the MoE block's module name: mlp, block_sparse_moe
    shared: str | None = None      # shared expert module: shared_experts, shared_expert
    dense_layers: int = 0          # first layers with a dense MLP instead of experts
    mixed: bool = False            # ModelOpt MIXED_PRECISION: FP8 attention, NVFP4 experts
    mtp: str | None = None         # "file": GLM's mtp.safetensors; "unquantised": Qwen3.5's BF16 mtp.*
    hf_quant_only: bool = False    # ModelOpt deleted quantization_config from config.json (DeepSeek-R1 FP4)
    nested: bool = False           # config under text_config (multimodal wrapper)
    router: str = "gate"           # the router's module name under the MoE block
    lm_head: str = "lm_head.weight"
    stacked: bool = False          # all experts of a layer in K-major stacks (Llama-4 by ModelOpt)
    config: dict = field(default_factory=dict)

    @property
    def prefix(self) -> str:
        return family_named(self.family).source_scheme.layer_prefixes[0]


FAMILY_SPECS: dict[str, FamilySpec] = {s.family: s for s in (
    FamilySpec("qwen3-moe", ("nvfp4-modelopt-hf", "nvfp4-ct"), "qwen3_moe", "mlp",
               config={"norm_topk_prob": True, "decoder_sparse_step": 1}),
    FamilySpec("deepseek-v3", ("nvfp4-modelopt-hf",), "deepseek_v3", "mlp", shared="shared_experts",
               dense_layers=1, hf_quant_only=True, config={"n_shared_experts": 1, "topk_method": "noaux_tc"}),
    FamilySpec("glm4-moe", ("nvfp4-modelopt-hf", "nvfp4-ct"), "glm4_moe", "mlp", shared="shared_experts",
               dense_layers=1, mtp="file", config={"n_shared_experts": 1, "num_nextn_predict_layers": 1}),
    FamilySpec("qwen3.5-moe", ("nvfp4-modelopt-hf", "nvfp4-ct"), "qwen3_5_moe", "mlp", shared="shared_expert",
               mixed=True, mtp="unquantised", nested=True, config={"mtp_num_hidden_layers": 1}),
    FamilySpec("minimax-m2", ("nvfp4-modelopt-hf",), "minimax_m2", "block_sparse_moe"),
    FamilySpec("mixtral", ("nvfp4-modelopt-hf",), "mixtral", "block_sparse_moe"),
    FamilySpec("llama4", ("nvfp4-modelopt-hf",), "llama4", "feed_forward", shared="shared_expert", nested=True,
               router="router", lm_head="language_model.lm_head.weight", stacked=True,
               config={"interleave_moe_layer_step": 1}),
)}


def _linear(out: dict, seed: int, name: str, n: int, k: int, kind: str, dtype: torch.dtype) -> None:
    """One linear layer's tensors: BF16, ModelOpt FP8 per-tensor, ModelOpt NVFP4 or compressed-tensors NVFP4."""
    w = dense(seed, name, (n, k), dtype=torch.float32)
    if kind == "bf16":
        out[f"{name}.weight"] = w.to(dtype)
    elif kind == "fp8":
        scale = (w.abs().max() / 448.0).float()
        out[f"{name}.weight"] = (w / scale).to(torch.float8_e4m3fn)
        out[f"{name}.weight_scale"], out[f"{name}.input_scale"] = scale.reshape(()), torch.tensor(0.01)
    else:
        packed, scale, g = quantize_nvfp4(w, nvfp4_global_for(w.abs().max().item()))
        if kind == "nvfp4-ct":
            out[f"{name}.weight_packed"], out[f"{name}.weight_scale"] = packed, scale
            out[f"{name}.weight_global_scale"], out[f"{name}.input_global_scale"] = global_to_ct(g), torch.ones(1)
        else:
            out[f"{name}.weight"], out[f"{name}.weight_scale"] = packed, scale
            out[f"{name}.weight_scale_2"], out[f"{name}.input_scale"] = g.reshape(()), torch.tensor(0.01)


def _mlp(out: dict, seed: int, base: str, h: int, inter: int, kind: str, dtype: torch.dtype) -> None:
    for proj, (n, k) in (("gate_proj", (inter, h)), ("up_proj", (inter, h)), ("down_proj", (h, inter))):
        _linear(out, seed, f"{base}.{proj}", n, k, kind, dtype)


def _layer(out: dict, seed: int, spec: FamilySpec, fmt: str, layer: int, d: Dims, dtype: torch.dtype,
           *, experts_layer: bool = True) -> None:
    p, h, hd = f"{spec.prefix}.{layer}", d.hidden, d.heads * d.head_dim
    quant = "nvfp4-ct" if fmt == "nvfp4-ct" else "nvfp4"
    out[f"{p}.input_layernorm.weight"] = torch.ones(h, dtype=dtype)
    attn = "fp8" if spec.mixed and fmt != "nvfp4-ct" else "bf16"
    for proj, (n, k) in (("q_proj", (hd, h)), ("k_proj", (d.head_dim, h)), ("v_proj", (d.head_dim, h)),
                         ("o_proj", (h, hd))):
        _linear(out, seed, f"{p}.self_attn.{proj}", n, k, attn, dtype)
    out[f"{p}.post_attention_layernorm.weight"] = torch.ones(h, dtype=dtype)
    if layer < spec.dense_layers:
        _mlp(out, seed, f"{p}.mlp", h, 2 * d.intermediate, quant, dtype)
        return
    moe = f"{p}.{spec.moe}"
    out[f"{moe}.{spec.router}.weight"] = dense(seed, f"{moe}.{spec.router}", (d.experts, h), dtype=dtype)
    if spec.family in ("deepseek-v3", "glm4-moe"):
        out[f"{moe}.gate.e_score_correction_bias"] = torch.zeros(d.experts, dtype=torch.float32)
    if spec.shared is not None:
        # ModelOpt quantises shared experts with the rest; the compressed-tensors recipes ignore them
        _mlp(out, seed, f"{moe}.{spec.shared}", h, d.intermediate, "bf16" if fmt == "nvfp4-ct" else quant, dtype)
        if spec.family == "qwen3.5-moe":
            out[f"{moe}.shared_expert_gate.weight"] = dense(seed, f"{moe}.shared_expert_gate", (1, h), dtype=dtype)
    if spec.stacked:
        out.update(_k_major_stacks(seed, f"{moe}.experts", str(layer), d, dtype))
    elif experts_layer:
        scheme = family_named(spec.family).source_scheme
        out.update(encode_layer_experts(fmt, seed, str(layer), experts=d.experts, hidden=h, inter=d.intermediate,
                                        tweaks=Tweaks(), dtype=dtype, scheme=scheme))


def _k_major_stacks(seed: int, base: str, layer: str, d: Dims, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """ModelOpt's stacked NVFP4 experts: per expert [N, K] quantised as nn.Linear would be, then stored K-major,
    `gate_up_proj` [E, K/2, 2I] (gate rows, then up rows) and `down_proj` [E, I/2, H]; one global per stack."""
    h, i = d.hidden, d.intermediate
    mats = [{r: expert_matrix(seed, layer, e, r, *((h, i) if r == "down" else (i, h)), dtype=dtype)
             for r in ("gate", "up", "down")} for e in range(d.experts)]
    out: dict[str, torch.Tensor] = {}
    for name, roles in (("gate_up_proj", ("gate", "up")), ("down_proj", ("down",))):
        g = nvfp4_global_for(max(m[r].abs().max().item() for m in mats for r in roles))
        quantised = [[quantize_nvfp4(m[r], g)[:2] for r in roles] for m in mats]
        out[f"{base}.{name}"] = torch.stack([torch.cat([w for w, _ in q]).t() for q in quantised]).contiguous()
        out[f"{base}.{name}_weight_scale"] = torch.stack([torch.cat([s for _, s in q]).t() for q in quantised]
                                                         ).contiguous()
        out[f"{base}.{name}_weight_scale_2"] = g.reshape(())
        out[f"{base}.{name}_input_scale"] = torch.tensor(0.01)
    return out


def family_tensors(family: str, fmt: str, seed: int, d: Dims,
                   dtype: torch.dtype = torch.bfloat16) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(indexed tensors in file order, tensors of the file outside the index: GLM's mtp.safetensors)."""
    spec = FAMILY_SPECS[family]
    root = spec.prefix.rsplit(".layers", 1)[0]
    out: dict[str, torch.Tensor] = {}
    out[f"{root}.embed_tokens.weight"] = dense(seed, "embed", (d.vocab, d.hidden), dtype=dtype)
    for i in range(d.layers):
        _layer(out, seed, spec, fmt, i, d, dtype)
    out[f"{root}.norm.weight"] = torch.ones(d.hidden, dtype=dtype)
    out[spec.lm_head] = dense(seed, "lm_head", (d.vocab, d.hidden), dtype=dtype)
    outside: dict[str, torch.Tensor] = {}
    if spec.mtp == "file":  # GLM: layer num_hidden_layers, quantised like the others, outside the index
        _layer(outside, seed, spec, fmt, d.layers, d, dtype)
        for name in ("enorm", "hnorm"):
            outside[f"{spec.prefix}.{d.layers}.{name}.weight"] = torch.ones(d.hidden, dtype=dtype)
        outside[f"{spec.prefix}.{d.layers}.eh_proj.weight"] = dense(seed, "eh_proj", (d.hidden, 2 * d.hidden),
                                                                    dtype=dtype)
    elif spec.mtp == "unquantised":  # Qwen3.5: BF16 MTP block under mtp.*, experts included
        mtp = "mtp.layers.0"
        out["mtp.fc.weight"] = dense(seed, "mtp.fc", (d.hidden, 2 * d.hidden), dtype=dtype)
        for e in range(d.experts):
            for proj, shape in (("gate_proj", (d.intermediate, d.hidden)), ("up_proj", (d.intermediate, d.hidden)),
                                ("down_proj", (d.hidden, d.intermediate))):
                name = f"{mtp}.mlp.experts.{e}.{proj}.weight"
                out[name] = dense(seed, name, shape, dtype=dtype)
    return out, outside


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
    experts_key = {"deepseek_v3": "n_routed_experts", "glm4_moe": "n_routed_experts"}.get(
        spec.model_type, "num_experts" if spec.moe == "mlp" else "num_local_experts")
    text[experts_key] = d.experts
    if spec.dense_layers:
        text["first_k_dense_replace"] = spec.dense_layers
    if spec.shared == "shared_expert":
        text["shared_expert_intermediate_size"] = d.intermediate
    config = {"architectures": [family.architectures[0]], "model_type": spec.model_type}
    if spec.nested:
        text["model_type"] = f"{spec.model_type}_text"
        config.update({"text_config": text, "torch_dtype": "bfloat16", "tie_word_embeddings": False})
    else:
        config.update(text)
    return config


def _modelopt(spec: FamilySpec, d: Dims) -> tuple[dict | None, dict]:
    """(config.json quantization_config or None, hf_quant_config.json), as ModelOpt writes them (§4.2-4.3)."""
    producer = {"name": "modelopt", "version": "0.37.0"}
    lp = spec.prefix
    exclude = [spec.lm_head.removesuffix(".weight"), f"{lp}.*.{spec.moe}.{spec.router}",
               "mtp*" if spec.mtp == "unquantised" else None,
               f"{lp}.*.{spec.moe}.shared_expert_gate" if spec.family == "qwen3.5-moe" else None]
    exclude = [e for e in exclude if e]
    if not spec.mixed:
        exclude.append(f"{lp}.*.self_attn*")
        hfq = {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16, "exclude_modules": exclude}
        qc = {"quant_method": "modelopt", "quant_algo": "NVFP4", "config_groups": _modelopt_groups(),
              "ignore": exclude, "producer": producer}
    else:
        layers = {}
        for i in range(d.layers):
            layers |= {f"{lp}.{i}.self_attn.{p}": {"quant_algo": "FP8"} for p in ("q_proj", "k_proj", "v_proj",
                                                                                     "o_proj")}
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
    config = _arch_config(spec, d)
    files = {CONFIG: config}
    if fmt == "nvfp4-ct":
        config["quantization_config"] = qc = _ct_config("nvfp4")
        qc["ignore"] += [f"re:.*{spec.shared}\\..*"] if spec.shared else []
        qc["ignore"] += ["re:.*shared_expert_gate$"] if spec.family == "qwen3.5-moe" else []
        qc["ignore"] += ["re:^mtp\\..*"] if spec.mtp == "unquantised" else []
    else:
        qc, hfq = _modelopt(spec, d)
        if qc is not None:
            config["quantization_config"] = qc
        files[HF_QUANT_CONFIG] = hfq
    return files
