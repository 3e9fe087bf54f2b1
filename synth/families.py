"""Tiny checkpoints of real model families (`dsv4-convert synth OUT --family NAME`): the family's real tensor
names (core/sources/naming.py), config.json and quantisation config, at shrunk sizes. This module holds what each
family is (FamilySpec, FAMILY_SPECS); synth/family_layers.py writes its tensors, synth/family_configs.py its
config files.

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
- glm5-moe (GLM-5 / 5.1 / 5.2 / 5.3, nvidia/GLM-5.x-NVFP4): GlmMoeDsaForCausalLM, `model_type: glm_moe_dsa`, DeepSeek-
  V3.2's MLA + sparse-attention indexer (synth/mla.py) with GLM-5's head sizes (qk_nope_head_dim 192, v_head_dim 256,
  index_n_heads 32: transformers 5 configuration_glm_moe_dsa.py GlmMoeDsaConfig, whose defaults are zai-org/GLM-5's;
  the GLM-5 technical report's table), `first_k_dense_replace` dense layers, one shared expert, sigmoid router with
  `e_score_correction_bias` (`n_routed_experts`, HF expert names `mlp.experts.E.{gate,up,down}_proj`), one MTP layer
  `model.layers.<num_hidden_layers>` (NeMo Megatron-Bridge GLM-5 notes). vLLM 0.33 / 0.34 build it with the DSA class
  of DeepSeek-V3.2 (vllm/models/deepseek_v32/__init__.py), SGLang 0.5.23 with glm4_moe.py GlmMoeDsaForCausalLM, a
  DeepseekV2ForCausalLM. The NVFP4 release's precision split (BF16 attention and MTP layer, NVFP4 MLPs and experts)
  is assumed to follow DeepSeek-V3.2's recipe (not confirmed from its file list).
- kimi-k25 (Kimi-K2.5 / K2.6): KimiK25ForConditionalGeneration, `model_type: kimi_k25`, the Kimi-K2 text model
  (`text_config` of model_type kimi_k2, read as DeepseekV3Config: transformers 5 configuration_kimi_k25.py, SGLang
  0.5.23 configs/kimi_k25.py) under `language_model.model.*` and `language_model.lm_head` (moonshotai's names: vLLM
  0.33 / 0.34 kimi_k25.py builds `language_model` as DeepseekV2ForCausalLM; SGLang 0.5.23 kimi_k25.py strips
  `language_model.`), a MoonViT tower `vision_tower.*` and `mm_projector.*` (not written: the replica is served
  text-only), ModelOpt NVFP4 on the routed experts only, as the Kimi-K2 replica. nvidia/Kimi-K2.5-NVFP4's config
  names the layers `language_model.layers.*` in its exclude lists: serving_tests/differential.py's `nvidia-names` edit.
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
- glm5-next / glm5-next-vl (GLM-5.3-Flash, text and multimodal; NVIDIA ModelOpt NVFP4 and compressed-tensors NVFP4
  releases): hybrid KDA linear attention + MLA with the kpool sparse indexer + mHC, DeepSeek-V3's MoE block with a
  clamped SwiGLU (`swiglu_limit`), one MTP layer: synth/glm5next.py names every fact and its source.
- qwen4-exp (Qwen3.8-Flash-Next: hyper-connections, QSA, PLE n-gram tables, its MTP block), qwen4-exp-text (its text
  class), qwen4-exp-nvfp4 / qwen4-exp-ple-nvfp4 (plain ModelOpt NVFP4; NVFP4 n-gram tables): synth/qwen4_exp.py.
- minimax-m3 / minimax-m3-vl (MiniMax-M3 / M3.1): MiniMaxM3SparseForCausalLM (`model.layers`) and
  MiniMaxM3SparseForConditionalGeneration (`language_model.model.layers`, config under `text_config`), MiniMax-M2's
  `block_sparse_moe.experts.E.{w1,w3,w2}` with `block_sparse_moe.gate` (F32 router: vLLM 0.34 GateLinear
  params_dtype float32), `block_sparse_moe.e_score_correction_bias` and `block_sparse_moe.shared_experts.
  {gate,up,down}_proj` of `intermediate_size` (vLLM 0.34 models/minimax_m3/nvidia/model.py MiniMaxM3MoE; SGLang
  0.5.23 minimax_m3.py MiniMaxM3MoE: intermediate_size x n_shared_experts), per-head Gemma q/k norms
  (`qk_norm_type per_head`, `use_gemma_norm`: SGLang 0.5.23 MiniMaxM3Attention; vLLM MiniMAXGemmaRMSNorm(head_dim)),
  the clamped SwiGLU-OAI `hidden_act swigluoai`, `swiglu_alpha` 1.702, `swiglu_limit` 7.0 (transformers 5.20
  MiniMaxM3VLTextConfig defaults; vLLM's experts run `swigluoai_uninterleave` with them). The text config's
  `model_type` is `minimax_m2` (SGLang 0.5.23 configs/minimax_vl.py: "M3's `minimax_m2`"), so the fields vLLM
  reads from transformers' MiniMaxM3VLTextConfig (`layer_types`, `mlp_layer_types`) are written out, with SGLang's
  `moe_layer_freq`. The replica has every layer MoE with full attention (no sparse-attention indexer, no dense
  MLP: both engines build those from fields this generator leaves at "all sparse, all full attention").
  Formats: nvidia/MiniMax-M3-NVFP4 (ModelOpt MIXED_PRECISION: FP8 attention here, MXFP8 in the release) and
  M3.1's `nvfp4-ct-mxfp8` (quant_method mxfp8: MXFP8 attention and shared experts, `weight` E4M3 + `weight_scale_inv`
  E8M0 per 32 (vLLM 0.34 minimax_m3 load_weights renames it `weight_scale`), compressed-tensors NVFP4 experts,
  `ignored_layers` the head).
MTP / draft layers (DeepSeek `model.layers.<N>`, MiniMax-M2 declared only, Qwen `mtp.*`): synth/mtp.py.
DeepSeek-V4.1 (Engram, vision tower, DSpark stages; V4's native names, no FamilySpec): synth/dsv41.py.
Kimi-K3 (KDA + NoPE MLA, latent MoE, SiTU; compressed-tensors MXFP4 / NVFP4 experts): synth/kimi_k3.py.
Sizes, values and the tokenizer are synthetic; the generator never copies real weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.sources.families import family_named
from .glm5next import GLM5_NEXT
from .mtp import MINIMAX_MTP_CONFIG
from .nemotron import BF16 as NEMOTRON_BF16
from .nemotron import LATENT_BF16 as NEMOTRON_LATENT_BF16

__all__ = ["FAMILY_SPECS", "FamilySpec"]


@dataclass(frozen=True)
class FamilySpec:
    family: str                    # core/sources/families.py family name
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
    attention: str = "gqa"         # gqa, mla, mla-indexer (synth/mla.py), kda-mla (synth/glm5next.py)
    architecture: str = ""         # config.json `architectures` when not the family's first
    routed_only: bool = False      # NVFP4 on the routed experts only (dense MLP and shared experts BF16)
    stale_block: bool = False      # config.json keeps the pre-FP4 block-FP8 block (DeepSeek-V3-0324-FP4)
    examples: str = ""             # the releases a replica stands for, when not all of its family's
    latent_moe: bool = False       # routed experts at `moe_latent_size` (Nemotron-3 Super / Ultra: synth/nemotron.py)
    text_model_type: str = ""      # a nested text_config's model_type when not `<model_type>_text` (Kimi-K2.5: kimi_k2)
    ple: str = ""                  # Qwen4-Exp (synth/qwen4_exp.py): its n-gram tables' precision, bf16 / fp8 / nvfp4

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

# GLM-5 / 5.1 (zai-org/GLM-5 config.json as transformers 5 GlmMoeDsaConfig's defaults keep it: qk_nope_head_dim 192,
# v_head_dim 256, index_n_heads 32; no YaRN scaling, rope_theta 1e6 is this generator's assumption)
_GLM5_ATTENTION = {"qk_nope_head_dim": 192, "v_head_dim": 256, "index_n_heads": 32, "rope_theta": 1000000,
                   "rope_scaling": None, "rms_norm_eps": 1e-5}

# MiniMax-M3 / M3.1's text config beyond the dimensions (transformers 5.20 MiniMaxM3VLTextConfig defaults; the
# per-head Gemma q/k norms SGLang 0.5.23 minimax_m3.py reads; rotary_dim half the head, as MiniMax-M2's)
_MINIMAX_M3 = {"scoring_func": "sigmoid", "use_routing_bias": True, "routed_scaling_factor": 2.0, "n_shared_experts": 1,
               "hidden_act": "swigluoai", "swiglu_alpha": 1.702, "swiglu_limit": 7.0, "use_qk_norm": True,
               "qk_norm_type": "per_head", "use_gemma_norm": True, "rotary_dim": 32, "rope_theta": 5000000,
               "rms_norm_eps": 1e-6, "max_position_embeddings": 4096}

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
    FamilySpec("kimi-k25", ("nvfp4-modelopt-hf",), "kimi_k25", "mlp", shared="shared_experts", dense_layers=1,
               routed_only=True, attention="mla", nested=True, text_model_type="kimi_k2", layer_prefix="language_model.model.layers",
               lm_head="language_model.lm_head.weight",
               config={**_DEEPSEEK, "routed_scaling_factor": 2.827, "rope_theta": 50000,
                       "architectures": ["DeepseekV3ForCausalLM"]}),  # the text config's, as Kimi-K2's (SGLang reads it)
    FamilySpec("deepseek-v32", ("nvfp4-modelopt-hf",), "deepseek_v32", "mlp", shared="shared_experts",
               dense_layers=1, attention="mla-indexer", config=_DEEPSEEK_MTP, mtp="layer"),
    # GLM-5.x: DeepSeek-V3.2's layout with GLM-5's head sizes (the docstring names the sources)
    FamilySpec("glm5-moe", ("nvfp4-modelopt-hf",), "glm_moe_dsa", "mlp", shared="shared_experts",
               dense_layers=1, attention="mla-indexer", mtp="layer", config={**_DEEPSEEK_MTP, **_GLM5_ATTENTION}),
    # GLM-5.3-Flash (synth/glm5next.py): text (flat config.json, `model.layers`) and multimodal (`text_config`,
    # `model.language_model.layers`); its config.json is glm5next_text_config's, not the generic one
    FamilySpec("glm5-next", ("nvfp4-modelopt-hf", "nvfp4-ct"), "glm5_next", "mlp", shared="shared_experts",
               dense_layers=1, attention="kda-mla", mtp="layer", config=dict(GLM5_NEXT)),
    FamilySpec("glm5-next-vl", ("nvfp4-modelopt-hf", "nvfp4-ct"), "glm5_next", "mlp", shared="shared_experts",
               dense_layers=1, attention="kda-mla", mtp="layer", nested=True, config=dict(GLM5_NEXT)),
    FamilySpec("glm4-moe", ("nvfp4-modelopt-hf", "nvfp4-ct"), "glm4_moe", "mlp", shared="shared_experts",
               dense_layers=1, mtp="file", config={"n_shared_experts": 1, "num_nextn_predict_layers": 1}),
    FamilySpec("qwen3.5-moe", ("nvfp4-modelopt-hf", "nvfp4-ct"), "qwen3_5_moe", "mlp", shared="shared_expert",
               mixed=True, mtp="unquantised", nested=True, linear="split", shared_gate=True,
               # Qwen3.5's interleaved M-RoPE over a quarter of the head (mrope_section [11, 11, 10] of head_dim 256 in
               # the releases; scaled to this head_dim's 16 rotary dims)
               config={"mtp_num_hidden_layers": 1, "rope_parameters": {
                   "rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                   "mrope_section": [3, 3, 2], "mrope_interleaved": True}}),
    # Qwen3.8-Flash-Next (synth/qwen4_exp.py): Qwen3.5's layout with hyper-connections, QSA and PLE tables; nvidia's
    # MIXED_PRECISION release (FP8 n-gram tables), its text architecture, the plain ModelOpt NVFP4 form and the
    # MIXED_PRECISION form with NVFP4 n-gram tables
    *(FamilySpec(family, ("nvfp4-modelopt-hf",), "qwen4_exp", "mlp", shared="shared_expert", mixed=mixed,
                 nested=family == "qwen4-exp", linear="split", shared_gate=True, ple=ple, name=name, mtp="unquantised",
                 architecture=family_named(family).architectures[0], text_model_type="qwen4_exp_text",
                 config={"rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                                             "mrope_section": [3, 3, 2], "mrope_interleaved": True}}, examples=examples)
      for family, name, mixed, ple, examples in (
          ("qwen4-exp", "", True, "fp8", "nvidia's Qwen3.8-Flash-Next NVFP4 (MIXED_PRECISION, FP8 n-gram tables)"),
          ("qwen4-exp-text", "", True, "fp8", ""),
          ("qwen4-exp", "qwen4-exp-nvfp4", False, "bf16", "Qwen3.8-Flash-Next in plain ModelOpt NVFP4"),
          ("qwen4-exp", "qwen4-exp-ple-nvfp4", True, "nvfp4", "Qwen3.8-Flash-Next MIXED_PRECISION, NVFP4 n-gram tables"))),
    FamilySpec("qwen3-next", ("nvfp4-modelopt-hf", "nvfp4-ct"), "qwen3_next", "mlp", shared="shared_expert",
               mtp="unquantised", linear="fused", shared_gate=True,
               config={"num_nextn_predict_layers": 1, "norm_topk_prob": True, "decoder_sparse_step": 1}),
    # Nemotron-H (synth/nemotron.py): Mamba-2 / attention / MoE layers, non-gated experts
    FamilySpec("nemotron-h", ("nvfp4-modelopt-hf",), "nemotron_h", "mixer", shared="shared_experts",
               layer_prefix="backbone.layers", bf16=NEMOTRON_BF16),
    FamilySpec("nemotron-h", ("nvfp4-modelopt-hf",), "nemotron_h", "mixer", shared="shared_experts",
               layer_prefix="backbone.layers", bf16=(*NEMOTRON_BF16, *NEMOTRON_LATENT_BF16), latent_moe=True,
               name="nemotron-3-super", examples="Nemotron-3 Super / Ultra NVFP4 (LatentMoE, moe_latent_size)"),
    # Gemma-4 MoE (synth/gemma4.py): experts and router beside a dense MLP in every layer
    # compressed-tensors: RedHatAI/gemma-4-26B-A4B-it-NVFP4 (llm-compressor; its ignore list is assumed to be the
    # router, attention, vision tower and lm_head, as RedHatAI's Gemma-4 FP8 recipe lists them)
    FamilySpec("gemma4-moe", ("nvfp4-modelopt-hf", "nvfp4-ct"), "gemma4", "", router="router", nested=True),
    FamilySpec("minimax-m2", ("nvfp4-modelopt-hf",), "minimax_m2", "block_sparse_moe",
               config={"scoring_func": "sigmoid", "use_routing_bias": True, "use_qk_norm": True,
                       "qk_norm_type": "per_layer", "rotary_dim": 32, "rope_theta": 5000000, "rms_norm_eps": 1e-6,
                       **MINIMAX_MTP_CONFIG}),  # declared, no weights shipped (synth/mtp.py)
    # MiniMax-M3 / M3.1 (the docstring names the sources); the VL checkpoint nests the text model
    FamilySpec("minimax-m3", ("nvfp4-ct-mxfp8", "nvfp4-modelopt-hf"), "minimax_m2", "block_sparse_moe",
               shared="shared_experts", mixed=True, config=_MINIMAX_M3),
    FamilySpec("minimax-m3-vl", ("nvfp4-ct-mxfp8", "nvfp4-modelopt-hf"), "minimax_m3_vl", "block_sparse_moe",
               shared="shared_experts", mixed=True,
               nested=True, text_model_type="minimax_m2", lm_head="language_model.lm_head.weight",
               config=_MINIMAX_M3),
    FamilySpec("mixtral", ("nvfp4-modelopt-hf", "nvfp4-ct"), "mixtral", "block_sparse_moe"),
    # Kimi-K3 (synth/kimi_k3.py): KDA + NoPE MLA, latent MoE with SiTU experts, compressed-tensors on the experts only
    FamilySpec("kimi-k3", ("mxfp4-ct", "nvfp4-ct"), "kimi_k3", "block_sparse_moe", shared="shared_experts",
               dense_layers=1, nested=True, layer_prefix="language_model.layers", lm_head="language_model.lm_head.weight",
               latent_moe=True),
    FamilySpec("llama4", ("nvfp4-modelopt-hf",), "llama4", "feed_forward", shared="shared_expert", nested=True,
               router="router", lm_head="language_model.lm_head.weight", stacked=True,
               moe_every=2, config={"interleave_moe_layer_step": 2}),
)}
