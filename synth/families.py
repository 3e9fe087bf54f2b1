"""Tiny checkpoints of real model families (`dsv4-convert synth OUT --family NAME`): the family's real tensor
names (core/naming.py), config.json and quantisation config, at shrunk sizes.

The facts per family, and where they come from:
- qwen3-moe: Qwen3MoeForCausalLM, `model.layers.L.mlp.experts.E.*_proj`, router `mlp.gate`, no shared
  experts (transformers modeling_qwen3_moe.py; nvidia/Qwen3-30B-A3B-NVFP4 ModelOpt NVFP4, config
  `quant_method: modelopt`; RedHatAI/Qwen3-30B-A3B-NVFP4 compressed-tensors nvfp4-pack-quantized).
- deepseek-v3 (nvidia/DeepSeek-R1-0528-FP4, R1-FP4): DeepseekV3ForCausalLM, `first_k_dense_replace` dense
  layers with NVFP4 `mlp.{gate,up,down}_proj`, NVFP4 `mlp.shared_experts`, BF16 MLA attention (synth/mla.py;
  the model card of nvidia/DeepSeek-R1-0528-FP4-v2: "additionally quantizes the wo module in attention layers",
  so v1 keeps attention unquantised); ModelOpt's quantize_to_nvfp4.py deletes `quantization_config` from
  config.json, so only hf_quant_config.json says NVFP4 (spec CHECKPOINT_FORMATS.md §4.1, §4.4;
  nvidia/DeepSeek-R1-0528-FP4 tensor list `model.layers.0.mlp.down_proj.weight U8`).
  Replicas of the same family: deepseek-v3-0324 (nvidia/DeepSeek-V3-0324-FP4: config.json keeps DeepSeek-V3's
  block-FP8 `quantization_config` {quant_method fp8, fmt e4m3, activation_scheme dynamic, weight_block_size
  [128, 128]} beside hf_quant_config.json; spec CHECKPOINT_FORMATS.md §4.4, validate's
  structure.quant_config.stale_block); kimi-k2 (`model_type: kimi_k2`, see synth/mla.py; ModelOpt NVFP4 on
  the routed experts only: attention, shared experts, the dense layer-0 MLP and lm_head stay BF16, the split
  the model cards of nvidia/Kimi-K2.6-NVFP4 reproductions describe); deepseek-v32 (DeepseekV32ForCausalLM,
  `model_type: deepseek_v32`, MLA plus the sparse-attention indexer, synth/mla.py; the NVFP4 release's
  attention precision is this generator's assumption: BF16, as R1-FP4).
- glm4-moe (GLM-4.5/4.6/4.7): Glm4MoeForCausalLM, `first_k_dense_replace`, `mlp.shared_experts`, router
  `mlp.gate` with `e_score_correction_bias`; the MTP layer `model.layers.<num_hidden_layers>.*` lives in
  `mtp.safetensors`, which model.safetensors.index.json does not list (vLLM 0.33 glm4_moe_mtp.py; the
  GLM-4.6/4.7 NVFP4 releases' file lists).
- qwen3.5-moe (Qwen3.5 / Qwen3.6 MoE): Qwen3_5MoeForConditionalGeneration, text stack under
  `model.language_model.layers`, hybrid Gated-DeltaNet / gated full attention (synth/hybrid.py),
  `mlp.shared_expert` + `mlp.shared_expert_gate`, MTP under `mtp.*` (`mtp.fc`, `mtp.pre_fc_norm_{embedding,
  hidden}`, `mtp.layers.0.*` a full-attention MoE layer, `mtp.norm`: vLLM 0.33 qwen3_5_mtp.py); nvidia's
  ModelOpt export is MIXED_PRECISION (FP8 attention and linear-attention projections, NVFP4 experts,
  unquantised MTP: sgl-project/sglang PR #27906, atlas PR #121), config nested under `text_config`;
  llm-compressor's compressed-tensors recipe quantises self_attn and the shared expert and skips the router,
  the shared-expert gate and the linear attention (llm-compressor PR #2740, docs/key-models/qwen3.6).
  Not modelled: the release's W4A16_NVFP4 `lm_head` (SGLang PR #27906) and its vision tower.
- qwen3-next (Qwen3-Next / Qwen3-Coder-Next): Qwen3NextForCausalLM, `model.layers.L` with fused
  `linear_attn.in_proj_qkvz` / `in_proj_ba`, `mlp.shared_expert` + `mlp.shared_expert_gate`, MTP under `mtp.*`
  with `num_nextn_predict_layers` (vLLM 0.33 qwen3_next.py, qwen3_next_mtp.py). Which layers the NVFP4
  releases quantise besides the experts is this generator's assumption (attention and linear attention kept
  BF16, as ModelOpt's Qwen3-Next recipe keeps QKV out of NVFP4: NVIDIA/Model-Optimizer PR #735).
- minimax-m2 / mixtral: MiniMaxM2ForCausalLM / MixtralForCausalLM, `model.layers.L.block_sparse_moe.experts.E.
  {w1,w3,w2}`, router `block_sparse_moe.gate` (vLLM 0.33 minimax_m2.py, mixtral.py). MiniMax-M2 adds
  `block_sparse_moe.e_score_correction_bias` (F32, sigmoid scoring, `use_routing_bias`), per-layer
  `self_attn.{q_norm,k_norm}` over all heads, partial rotary `rotary_dim` = head_dim / 2 (MiniMaxAI/MiniMax-M2
  config.json: head_dim 128, rotary_dim 64, scoring_func sigmoid, use_qk_norm, qk_norm_type per_layer; vLLM 0.33
  minimax_m2.py MiniMaxM2MoE, MiniMaxM2Attention). Attention precision of the NVFP4 releases (BF16 here) is
  this generator's assumption.
- llama4: Llama4ForConditionalGeneration, text stack under `language_model.model.layers`, `feed_forward.router`,
  `feed_forward.shared_expert`, and ModelOpt's stacked experts `feed_forward.experts.{gate_up_proj,down_proj}`
  K-major with `_weight_scale`, `_weight_scale_2`, `_input_scale` (vLLM 0.33 llama4.py load_moe_expert_weights,
  mllama4.py _rename_weight_for_modelopt_checkpoint; nvidia/Llama-4-Scout-17B-16E-Instruct-FP4). One global and
  one input scale per stack is this generator's assumption (not confirmed from a public tensor list). The replica
  has Maverick's layout, experts on every other layer (`interleave_moe_layer_step: 2`, a dense NVFP4
  `feed_forward.{gate,up,down}_proj` of `intermediate_size_mlp` between: vLLM 0.33 llama4.py is_moe_layer;
  Scout has step 1); the dense layers' NVFP4 quantisation is this generator's assumption.
MTP / draft layers (DeepSeek `model.layers.<N>`, MiniMax-M2 declared only, Qwen `mtp.*`): synth/mtp.py.
Sizes, values and the tokenizer are synthetic; the generator never copies real weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..core.files import CONFIG, HF_QUANT_CONFIG
from ..core.naming import family_named
from ..formats.nvfp4 import global_to_ct, nvfp4_global_for, quantize_nvfp4
from .configs import _ct_config, _modelopt_groups
from .experts import Tweaks, encode_layer_experts
from .gemma4 import gemma4_tensors, gemma4_text_config
from .hybrid import LINEAR, gated_attention, gdn_layer, layer_types, linear_config
from .layouts import Dims
from .mla import mla_config, mla_tensors
from .mtp import MINIMAX_MTP_CONFIG, deepseek_mtp_layer, qwen_mtp_block
from .nemotron import BF16 as NEMOTRON_BF16
from .nemotron import nemotron_config, nemotron_tensors
from .seeded import dense, expert_matrix

__all__ = ["FAMILY_SPECS", "FamilySpec", "family_config_files", "family_tensors"]



@dataclass(frozen=True)
class FamilySpec:
    family: str                    # core/naming.py family name
    formats: tuple[str, ...]       # source formats its releases use; the first is the default
    model_type: str
    moe: str                       # the MoE block's module name: mlp, block_sparse_moe
    shared: str | None = None      # shared expert module: shared_experts, shared_expert
    dense_layers: int = 0          # first layers with a dense MLP instead of experts
    moe_every: int = 1             # experts on every n-th layer, dense MLPs between (Llama-4 Maverick: 2)
    mixed: bool = False            # ModelOpt MIXED_PRECISION: FP8 attention, NVFP4 experts
    mtp: str | None = None         # "file": GLM's mtp.safetensors; "unquantised": Qwen3.5's BF16 mtp.*;
    #                                "layer": DeepSeek's BF16 layer num_hidden_layers (synth/mtp.py)
    hf_quant_only: bool = False    # ModelOpt deleted quantization_config from config.json (DeepSeek-R1 FP4)
    nested: bool = False           # config under text_config (multimodal wrapper)
    router: str = "gate"           # the router's module name under the MoE block
    lm_head: str = "lm_head.weight"
    stacked: bool = False          # all experts of a layer in K-major stacks (Llama-4 by ModelOpt)
    shared_gate: bool = False      # a sigmoid gate over the shared expert, `shared_expert_gate` (Qwen)
    linear: str | None = None      # hybrid linear attention: "split" (Qwen3.5) or "fused" (Qwen3-Next) in_proj
    bf16: tuple[str, ...] = ()     # further modules the NVFP4 export keeps BF16 (globs under the layer prefix;
                                   # one starting with a layer index names that layer's module)
    layer_prefix: str | None = None  # the layers' prefix where the naming table has no scheme for it yet
    config: dict = field(default_factory=dict)
    name: str = ""                 # the replica's own name when it is a release of `family` (kimi-k2)
    attention: str = "gqa"         # gqa, mla, mla-indexer (synth/mla.py)
    architecture: str = ""         # config.json `architectures` when not the family's first
    routed_only: bool = False      # NVFP4 on the routed experts only (dense MLP and shared experts BF16)
    stale_block: bool = False      # config.json keeps the pre-FP4 block-FP8 block (DeepSeek-V3-0324-FP4)
    examples: str = ""             # the releases a replica stands for, when not all of its family's

    @property
    def key(self) -> str:
        return self.name or self.family

    @property
    def prefix(self) -> str:
        return self.layer_prefix or family_named(self.family).source_scheme.layer_prefixes[0]


_DEEPSEEK = {"n_shared_experts": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid", "n_group": 1,
             "topk_group": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": True, "moe_layer_freq": 1,
             "hidden_act": "silu", "num_nextn_predict_layers": 0}
_DEEPSEEK_MTP = {**_DEEPSEEK, "num_nextn_predict_layers": 1}  # DeepSeek-R1 / V3 / V3.2 (synth/mtp.py); Kimi-K2 0
_BLOCK_FP8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}

FAMILY_SPECS: dict[str, FamilySpec] = {s.key: s for s in (
    FamilySpec("qwen3-moe", ("nvfp4-modelopt-hf", "nvfp4-ct"), "qwen3_moe", "mlp",
               config={"norm_topk_prob": True, "decoder_sparse_step": 1}),
    FamilySpec("deepseek-v3", ("nvfp4-modelopt-hf",), "deepseek_v3", "mlp", shared="shared_experts",
               dense_layers=1, hf_quant_only=True, attention="mla", config=_DEEPSEEK_MTP, mtp="layer",
               examples="nvidia/DeepSeek-R1-0528-FP4, nvidia/DeepSeek-R1-FP4 (no block in config.json)"),
    FamilySpec("deepseek-v3", ("nvfp4-modelopt-hf",), "deepseek_v3", "mlp", shared="shared_experts",
               dense_layers=1, stale_block=True, attention="mla", config=_DEEPSEEK_MTP, mtp="layer",
               name="deepseek-v3-0324",
               examples="nvidia/DeepSeek-V3-0324-FP4 (stale block-FP8 quantization_config in config.json)"),
    FamilySpec("deepseek-v3", ("nvfp4-modelopt-hf",), "kimi_k2", "mlp", shared="shared_experts", dense_layers=1,
               routed_only=True, attention="mla", name="kimi-k2", architecture="DeepseekV3ForCausalLM",
               examples="Kimi-K2 NVFP4 (DeepseekV3ForCausalLM, model_type kimi_k2)",
               config={**_DEEPSEEK, "routed_scaling_factor": 2.827, "rope_theta": 50000}),
    FamilySpec("deepseek-v32", ("nvfp4-modelopt-hf",), "deepseek_v32", "mlp", shared="shared_experts",
               dense_layers=1, attention="mla-indexer", config=_DEEPSEEK_MTP, mtp="layer"),
    FamilySpec("glm4-moe", ("nvfp4-modelopt-hf", "nvfp4-ct"), "glm4_moe", "mlp", shared="shared_experts",
               dense_layers=1, mtp="file", config={"n_shared_experts": 1, "num_nextn_predict_layers": 1}),
    FamilySpec("qwen3.5-moe", ("nvfp4-modelopt-hf", "nvfp4-ct"), "qwen3_5_moe", "mlp", shared="shared_expert",
               mixed=True, mtp="unquantised", nested=True, linear="split", shared_gate=True,
               # Qwen3.5's interleaved M-RoPE over a quarter of the head (mrope_section [11, 11, 10] of head_dim 256 in
               # the releases; scaled to this head_dim's 16 rotary dims)
               config={"mtp_num_hidden_layers": 1, "rope_parameters": {
                   "rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                   "mrope_section": [3, 3, 2], "mrope_interleaved": True}}),
    FamilySpec("qwen3-next", ("nvfp4-modelopt-hf", "nvfp4-ct"), "qwen3_next", "mlp", shared="shared_expert",
               mtp="unquantised", linear="fused", shared_gate=True,
               config={"num_nextn_predict_layers": 1, "norm_topk_prob": True, "decoder_sparse_step": 1}),
    # Nemotron-H (synth/nemotron.py): Mamba-2 / attention / MoE layers, non-gated experts
    FamilySpec("nemotron-h", ("nvfp4-modelopt-hf",), "nemotron_h", "mixer", shared="shared_experts",
               layer_prefix="backbone.layers", bf16=NEMOTRON_BF16),
    # Gemma-4 MoE (synth/gemma4.py): experts and router beside a dense MLP in every layer
    # compressed-tensors: RedHatAI/gemma-4-26B-A4B-it-NVFP4 (llm-compressor; its ignore list is assumed to be the
    # router, attention, vision tower and lm_head, as RedHatAI's Gemma-4 FP8 recipe lists them)
    FamilySpec("gemma4-moe", ("nvfp4-modelopt-hf", "nvfp4-ct"), "gemma4", "", router="router", nested=True),
    FamilySpec("minimax-m2", ("nvfp4-modelopt-hf",), "minimax_m2", "block_sparse_moe",
               config={"scoring_func": "sigmoid", "use_routing_bias": True, "use_qk_norm": True,
                       "qk_norm_type": "per_layer", "rotary_dim": 32, "rope_theta": 5000000, "rms_norm_eps": 1e-6,
                       **MINIMAX_MTP_CONFIG}),  # declared, no weights shipped (synth/mtp.py)
    FamilySpec("mixtral", ("nvfp4-modelopt-hf",), "mixtral", "block_sparse_moe"),
    FamilySpec("llama4", ("nvfp4-modelopt-hf",), "llama4", "feed_forward", shared="shared_expert", nested=True,
               router="router", lm_head="language_model.lm_head.weight", stacked=True,
               moe_every=2, config={"interleave_moe_layer_step": 2}),
)}


def peak(seed: int, group: list[tuple[str, int, int]]) -> float:
    """The largest |value| over layers the engines fuse (q/k/v, gate/up): both producers give such a group one
    NVFP4 global (llm-compressor's fused global scales; SGLang's W4A16 NVFP4 linear refuses anything else)."""
    return max(dense(seed, name, (n, k), dtype=torch.float32).abs().max().item() for name, n, k in group)


def _linear(out: dict, seed: int, name: str, n: int, k: int, kind: str, dtype: torch.dtype,
            group_peak: float | None = None) -> None:
    """One linear layer's tensors: BF16, ModelOpt FP8 per-tensor, ModelOpt NVFP4 or compressed-tensors NVFP4."""
    w = dense(seed, name, (n, k), dtype=torch.float32)
    if kind == "bf16":
        out[f"{name}.weight"] = w.to(dtype)
    elif kind == "fp8":
        scale = (w.abs().max() / 448.0).float()
        out[f"{name}.weight"] = (w / scale).to(torch.float8_e4m3fn)
        out[f"{name}.weight_scale"], out[f"{name}.input_scale"] = scale.reshape(()), torch.tensor(0.01)
    else:
        packed, scale, g = quantize_nvfp4(w, nvfp4_global_for(group_peak or w.abs().max().item()))
        if kind == "nvfp4-ct":
            out[f"{name}.weight_packed"], out[f"{name}.weight_scale"] = packed, scale
            out[f"{name}.weight_global_scale"], out[f"{name}.input_global_scale"] = global_to_ct(g), torch.ones(1)
        else:
            out[f"{name}.weight"], out[f"{name}.weight_scale"] = packed, scale
            out[f"{name}.weight_scale_2"], out[f"{name}.input_scale"] = g.reshape(()), torch.tensor(0.01)


def _mlp(out: dict, seed: int, base: str, h: int, inter: int, kind: str, dtype: torch.dtype) -> None:
    fused = peak(seed, [(f"{base}.{proj}", inter, h) for proj in ("gate_proj", "up_proj")])
    for proj, (n, k) in (("gate_proj", (inter, h)), ("up_proj", (inter, h)), ("down_proj", (h, inter))):
        _linear(out, seed, f"{base}.{proj}", n, k, kind, dtype, fused if proj != "down_proj" else None)


def _attn_kind(spec: FamilySpec, fmt: str) -> str:
    """Attention's quantisation: FP8 in ModelOpt's MIXED_PRECISION, NVFP4 in llm-compressor's Qwen3.5 recipe."""
    if spec.mixed:
        return "nvfp4-ct" if fmt == "nvfp4-ct" else "fp8"
    return "bf16"


def _shared_kind(spec: FamilySpec, fmt: str) -> str:
    """ModelOpt quantises shared experts with the rest; the compressed-tensors recipes ignore them, except
    llm-compressor's Qwen3.5 / 3.6 one (it skips only the shared-expert gate)."""
    if fmt == "nvfp4-ct":
        return "nvfp4-ct" if spec.mixed else "bf16"
    return "nvfp4"


def _layer(out: dict, seed: int, spec: FamilySpec, fmt: str, layer: int, d: Dims, dtype: torch.dtype,
           *, experts_layer: bool = True) -> None:
    p, h, hd = f"{spec.prefix}.{layer}", d.hidden, d.heads * d.head_dim
    quant = "nvfp4-ct" if fmt == "nvfp4-ct" else "nvfp4"
    out[f"{p}.input_layernorm.weight"] = torch.ones(h, dtype=dtype)
    attn = _attn_kind(spec, fmt)
    if spec.attention.startswith("mla"):
        mla_tensors(out, seed, p, h, d.heads, d.q_lora_rank, dtype, indexer=spec.attention == "mla-indexer")
    elif spec.linear is not None:  # hybrid: Gated-DeltaNet or gated full attention (synth/hybrid.py)
        if layer < d.layers and layer_types(d)[layer] == LINEAR:
            gdn_layer(out, seed, p, d, _linear, split=spec.linear == "split", dtype=dtype,
                      big="fp8" if spec.mixed and fmt != "nvfp4-ct" else "bf16")
        else:
            gated_attention(out, seed, p, d, _linear, kind=attn, dtype=dtype)
    else:
        projs = (("q_proj", (hd, h)), ("k_proj", (d.head_dim, h)), ("v_proj", (d.head_dim, h)), ("o_proj", (h, hd)))
        qkv = peak(seed, [(f"{p}.self_attn.{proj}", n, k) for proj, (n, k) in projs[:3]])
        for proj, (n, k) in projs:
            _linear(out, seed, f"{p}.self_attn.{proj}", n, k, attn, dtype, qkv if proj != "o_proj" else None)
    if spec.config.get("use_qk_norm"):  # MiniMax-M2: one norm over all heads
        out[f"{p}.self_attn.q_norm.weight"] = torch.ones(hd, dtype=dtype)
        out[f"{p}.self_attn.k_norm.weight"] = torch.ones(d.head_dim, dtype=dtype)
    out[f"{p}.post_attention_layernorm.weight"] = torch.ones(h, dtype=dtype)
    if layer < spec.dense_layers or (layer + 1) % spec.moe_every:
        _mlp(out, seed, f"{p}.{spec.moe}", h, 2 * d.intermediate, "bf16" if spec.routed_only else quant, dtype)
        return
    moe = f"{p}.{spec.moe}"
    out[f"{moe}.{spec.router}.weight"] = dense(seed, f"{moe}.{spec.router}", (d.experts, h), dtype=dtype)
    if spec.family in ("deepseek-v3", "deepseek-v32", "glm4-moe"):
        out[f"{moe}.gate.e_score_correction_bias"] = torch.zeros(d.experts, dtype=torch.float32)
    elif spec.config.get("use_routing_bias"):  # MiniMax-M2
        out[f"{moe}.e_score_correction_bias"] = torch.zeros(d.experts, dtype=torch.float32)
    if spec.shared is not None:
        # ModelOpt quantises shared experts with the rest; the compressed-tensors recipes ignore them (but Qwen3.5's)
        _mlp(out, seed, f"{moe}.{spec.shared}", h, d.intermediate,
             "bf16" if spec.routed_only else _shared_kind(spec, fmt), dtype)
        if spec.shared_gate:
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
    if family == "nemotron-h":
        return nemotron_tensors(fmt, seed, d, _linear, dtype), {}
    if family == "gemma4-moe":
        return gemma4_tensors(fmt, seed, d, _linear, family_named(family).source_scheme, dtype), {}
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
    elif spec.mtp == "unquantised":  # Qwen3.5 / Qwen3-Next: a BF16 MTP block under mtp.*, experts included
        qwen_mtp_block(out, seed, d, _mlp, _linear, dtype)
    elif spec.mtp == "layer":  # DeepSeek: layer num_hidden_layers in the index, BF16, excluded (synth/mtp.py)
        deepseek_mtp_layer(out, seed, spec.prefix, d, _mlp, dtype, indexer=spec.attention == "mla-indexer")
    return out, outside


_N_ROUTED = ("deepseek_v3", "deepseek_v32", "kimi_k2", "glm4_moe")


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
    config = {"architectures": [spec.architecture or family.architectures[0]], "model_type": spec.model_type}
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
    exclude = [spec.lm_head.removesuffix(".weight"), f"{lp}.*.{spec.moe + '.' if spec.moe else ''}{spec.router}",
               "mtp*" if spec.mtp == "unquantised" else None,
               f"{lp}.{d.layers}*" if spec.mtp == "layer" else None,  # ModelOpt's DeepSeek ptq.py (synth/mtp.py)
               f"{lp}.*.{spec.moe}.shared_expert_gate" if spec.shared_gate else None]
    exclude = [e for e in exclude if e]
    if spec.routed_only:  # Kimi-K2 NVFP4: only the routed experts are FP4
        exclude += [f"{lp}.*.{spec.moe}.{spec.shared}*", *(f"{lp}.{i}.{spec.moe}*" for i in range(spec.dense_layers))]
    if spec.stacked:  # Llama-4's vision tower and projector stay BF16 (an assumption: not from a public list)
        exclude += ["vision_model*", "multi_modal_projector*"]
    exclude += [f"{lp}.{glob}" if glob[0].isdigit() else f"{lp}.*.{glob}" for glob in spec.bf16]  # "3.x": layer 3
    if spec.mixed and spec.linear:  # ModelOpt's qwen3_5 recipe keeps in_proj_a / in_proj_b unquantised
        exclude += [f"{lp}.*.linear_attn.in_proj_a", f"{lp}.*.linear_attn.in_proj_b"]
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
    config = nemotron_config(d) if family == "nemotron-h" else _arch_config(spec, d)
    if family == "gemma4-moe":
        config = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4", "torch_dtype": "bfloat16",
                  "text_config": gemma4_text_config(d), "tie_word_embeddings": True,
                  "vision_config": {"model_type": "gemma4_vision", "hidden_size": 64, "intermediate_size": 128,
                                    "num_hidden_layers": 1, "num_attention_heads": 1}}  # no tensors: served text-only
    files = {CONFIG: config}
    if fmt == "nvfp4-ct":
        config["quantization_config"] = qc = _ct_config("nvfp4")
        if spec.mixed:  # llm-compressor's Qwen3.5 recipe quantises self_attn and the shared expert
            qc["ignore"] = [i for i in qc["ignore"] if "self_attn" not in i and "shared_experts" not in i]
        elif spec.shared:
            qc["ignore"] += [f"re:.*{spec.shared}\\..*"]
        qc["ignore"] += ["re:.*shared_expert_gate$"] if spec.shared_gate else []
        qc["ignore"] += ["re:.*linear_attn.*"] if spec.linear else []
        qc["ignore"] += ["re:^mtp\\..*"] if spec.mtp == "unquantised" else []
        qc["ignore"] += ["re:.*visual.*"] if spec.nested else []  # the vision tower (llm-compressor PR #2740)
        qc["ignore"] += ["re:.*router.*", "re:.*vision_tower.*"] if family == "gemma4-moe" else []
    else:
        qc, hfq = _modelopt(spec, d)
        if spec.stale_block:  # the pre-FP4 model's block, left in config.json (DeepSeek-V3-0324-FP4)
            config["quantization_config"] = dict(_BLOCK_FP8)
        elif qc is not None:
            config["quantization_config"] = qc
        files[HF_QUANT_CONFIG] = hfq
    return files
