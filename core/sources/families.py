"""The one table of model families: each architecture, the naming scheme its releases use (core/sources/naming.py) and
the scheme the converted checkpoint keeps (the engine's own weight-name mapping for that architecture must place
every converted tensor). Which source formats of a family the plugins serve is core/targets/served.py. Each entry names
the public source of its facts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..files import MTP_FILE
from .naming import Scheme, scheme_named

__all__ = ["Family", "FAMILIES", "family_named", "family_of", "module_prefix", "outside_index_note"]


@dataclass(frozen=True)
class Family:
    """A model architecture. Whether the plugins serve it is not a field here: core/targets/served.py says which
    source formats of it each engine release is proven to serve (a family without rows there is refused)."""
    name: str
    architectures: tuple[str, ...]
    scheme: str           # the scheme its releases use
    output_scheme: str    # the scheme the converted checkpoint keeps
    examples: str = ""
    outside_index: Mapping[str, str] = field(default_factory=dict)  # file the index does not list -> what it is
    # the experts' activation where the engines clamp it: "swiglu-limit" = SwiGLU with the gate clamped to at most
    # config `swiglu_limit` and the up projection to +-limit (structure.py swiglu_limit; validate --kernel's layer case);
    # "situ" = Kimi's SiTU with config `activation_situ_beta` / `activation_situ_linear_beta` (structure.py situ_betas)
    # "swigluoai-limit" = that clamp on the SwiGLU-OAI gate * sigmoid(swiglu_alpha * gate) * (up + 1) (swiglu_alpha)
    activation: str = "swiglu"

    @property
    def source_scheme(self) -> Scheme:
        return scheme_named(self.scheme)

    @property
    def converted_scheme(self) -> Scheme:
        return scheme_named(self.output_scheme)


FAMILIES: tuple[Family, ...] = (
    Family("deepseek-v4", ("DeepseekV4ForCausalLM",), "deepseek", "deepseek",
           examples="deepseek-ai/DeepSeek-V4-Flash, nvidia/DeepSeek-V4-Flash-NVFP4"),
    # V4's names; DSpark stages mtp.0-2 sized by dspark_n_routed_experts (core/sources/structure.py), Engram, vision copied
    Family("deepseek-v41", ("DeepseekV41ForCausalLM",), "deepseek", "deepseek", examples="deepseek-ai/DeepSeek-V4.1-Flash"),
    Family("gpt-oss", ("GptOssForCausalLM",), "gpt-oss", "hf-mlp", examples="openai/gpt-oss-20b, -120b"),
    Family("qwen3-moe", ("Qwen3MoeForCausalLM",), "hf-mlp", "hf-mlp",
           examples="nvidia/Qwen3-30B-A3B-NVFP4, nvidia/Qwen3-235B-A22B-Instruct-2507-NVFP4, "
                    "RedHatAI/Qwen3-30B-A3B-NVFP4"),
    # Kimi-K2 ships architectures [DeepseekV3ForCausalLM] with model_type kimi_k2 (vLLM 0.33
    # transformers_utils/config.py kimi_k2 -> DeepseekV3Config; SGLang 0.5.23 _KimiK2ConfigAlias)
    Family("deepseek-v3", ("DeepseekV3ForCausalLM",), "hf-mlp", "hf-mlp",
           examples="nvidia/DeepSeek-R1-0528-FP4, nvidia/DeepSeek-V3-0324-FP4, Kimi-K2 NVFP4"),
    # DeepSeek-V3.2: V3's names plus the sparse-attention indexer (vLLM 0.33 deepseek_v2.py DeepseekV32ForCausalLM)
    Family("deepseek-v32", ("DeepseekV32ForCausalLM",), "hf-mlp", "hf-mlp", examples="DeepSeek-V3.2 NVFP4"),
    # GLM-5 / 5.1 / 5.2 / 5.3 (glm_moe_dsa): DeepSeek-V3.2's MLA + sparse-attention indexer with HF expert names;
    # vLLM 0.33 / 0.34 vllm/models/deepseek_v32/__init__.py builds it with the DSA class ("GLM-5.2 (glm_moe_dsa)
    # reuses the CUDA DSA module"), SGLang 0.5.23 glm4_moe.py GlmMoeDsaForCausalLM(DeepseekV2ForCausalLM)
    Family("glm5-moe", ("GlmMoeDsaForCausalLM",), "hf-mlp", "hf-mlp", examples="nvidia/GLM-5.x-NVFP4 (GLM-5 / 5.1 / 5.2 / 5.3)"),
    Family("glm4-moe", ("Glm4MoeForCausalLM",), "hf-mlp", "hf-mlp",
           examples="GLM-4.5 / 4.6 / 4.7 NVFP4 (MTP layer in mtp.safetensors)",
           # GLM-4.6 / 4.7 FP4 releases keep the MTP layer in mtp.safetensors, outside the index; SGLang 0.5.23
           # adds it for Glm4MoeForCausalLM with num_nextn_predict_layers > 0 (model_loader/weight_utils.py
           # maybe_add_mtp_safetensors, citing baseten-admin/glm-4.7-fp4)
           outside_index={MTP_FILE: "GLM's MTP layer (SGLang loads it for speculative decoding)"}),
    # Kimi-K2.5 / K2.6: a DeepSeek-V3 text model (Kimi-K2's) under `language_model.model.layers` beside a MoonViT tower
    # (vLLM 0.33 / 0.34 kimi_k25.py builds `language_model` as DeepseekV2ForCausalLM from text_config; SGLang 0.5.23
    # kimi_k25.py strips `language_model.` and loads the rest with DeepseekV3ForCausalLM's loader)
    Family("kimi-k25", ("KimiK25ForConditionalGeneration",), "hf-language-model", "hf-language-model",
           examples="Kimi-K2.5 / K2.6 NVFP4 (ModelOpt, moonshotai's language_model.model.* names)"),
    # GLM-5.3-Flash (served: core/targets/served.py; replica synth/glm5next.py): HF expert names, text `model.layers`, multimodal `model.language_model.layers`
    # (vLLM 0.34 models/glm5next common/model.py: fused_moe_make_expert_params_mapping gate_proj / up_proj /
    # down_proj, the multimodal mapper `model.language_model.` -> `language_model.model.`; SGLang 0.5.23 glm5_next.py
    # `model.language_model.` -> `model.`); hybrid KDA linear attention + MLA + sparse indexer + mHC, swiglu_limit.
    # Its experts' SwiGLU is clamped at `swiglu_limit` (vLLM 0.34 Glm5NextMoE FusedMoEFactory(swiglu_limit=...),
    # SiluAndMulWithClamp; SGLang 0.5.23 glm5_next.py swiglu_clamped: gate <= limit, |up| <= limit).
    Family("glm5-next", ("Glm5NextForCausalLM",), "hf-mlp", "hf-mlp", examples="GLM-5.3-Flash NVFP4 (text)",
           activation="swiglu-limit"),
    Family("glm5-next-vl", ("Glm5NextForConditionalGeneration",), "hf-language-model", "hf-language-model",
           examples="GLM-5.3-Flash NVFP4 (multimodal)", activation="swiglu-limit"),
    # Qwen3.8-Flash-Next: Qwen3-Next's sparse MoE block (HF expert names) under `model.language_model.layers` (vLLM
    # 0.34 models/qwen4_exp nvidia/model.py Qwen4ExpSparseMoeBlock(Qwen3NextSparseMoeBlock), mapper
    # `model.language_model.` -> `model.`; SGLang 0.5.23 qwen4_exp.py load_weights `model.language_model.` ->
    # `model.`, FusedMoE.make_expert_params_mapping gate_proj / down_proj / up_proj); its per-layer embedding (PLE)
    # tables are no experts (core/sources/side_tables.py). Two rows: SGLang 0.5.23 registers the multimodal class
    # alone (qwen4_exp.py EntryClass = [Qwen4ExpForConditionalGeneration]), vLLM 0.33 and 0.34 both
    Family("qwen4-exp", ("Qwen4ExpForConditionalGeneration",), "hf-language-model", "hf-language-model",
           examples="nvidia's Qwen3.8-Flash-Next NVFP4 (MIXED_PRECISION), ModelOpt NVFP4 releases"),
    Family("qwen4-exp-text", ("Qwen4ExpForCausalLM",), "hf-language-model", "hf-language-model",
           examples="Qwen3.8-Flash-Next NVFP4, text architecture"),
    # MiniMax-M3 / M3.1: MiniMax-M2's `block_sparse_moe.experts.E.w{1,3,2}` (vLLM 0.34 models/minimax_m3/nvidia/model.py
    # MiniMaxM3Model.get_expert_mapping: "Checkpoint experts use w1=gate, w2=down, w3=up"; SGLang 0.5.23 minimax_m3.py
    # load_weights renames `.block_sparse_moe` to `.mlp`), under `language_model.model.layers` in the VL checkpoint (vLLM
    # builds `language_model` = MiniMaxM3SparseForCausalLM, SGLang `self.model` at prefix language_model.model). Expert
    # width `intermediate_size`, every routed expert of every MoE layer `num_local_experts` (both engines' MoE); the
    # activation a clamped SwiGLU-OAI: vLLM `activation="swigluoai_uninterleave"`, `swiglu_limit`, `swiglu_alpha`,
    # beta 1.0 (gate * sigmoid(alpha * gate) * (up + 1), both halves clamped); SGLang `gemm1_alpha`,
    # `gemm1_clamp_limit`. MTP (`model.mtp.layers.i.*`, `num_mtp_modules`) and the DSpark draft (a `dspark/` checkpoint)
    # are skipped by both main-model loaders.
    Family("minimax-m3", ("MiniMaxM3SparseForCausalLM",), "block-sparse-moe", "block-sparse-moe",
           examples="nvidia/MiniMax-M3-NVFP4 (text)", activation="swigluoai-limit"),
    Family("minimax-m3-vl", ("MiniMaxM3SparseForConditionalGeneration",), "block-sparse-moe-lm", "block-sparse-moe-lm",
           examples="MiniMax-M3 / M3.1 NVFP4 (multimodal)", activation="swigluoai-limit"),
    # Kimi-K3: `language_model.layers.L.block_sparse_moe.experts.E.w{1,3,2}.weight_packed` (compressed-tensors MXFP4 /
    # NVFP4), latent MoE at `routed_expert_hidden_size` (core/sources/structure.py model_dims), SiTU activation
    Family("kimi-k3", ("KimiK3ForConditionalGeneration", "KimiK31ForConditionalGeneration"), "block-sparse-moe-lm",
           "block-sparse-moe-lm", examples="Kimi-K3 (compressed-tensors MXFP4 / NVFP4)", activation="situ"),
    Family("qwen3.5-moe", ("Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeForCausalLM"), "hf-language-model",
           "hf-language-model", examples="nvidia/Qwen3.6-35B-A3B-NVFP4, RedHatAI Qwen3.5 NVFP4"),
    # Qwen3-Next / Qwen3-Coder-Next: HF per-expert names under model.layers, shared expert, BF16 mtp.* (vLLM 0.33
    # qwen3_next.py load_weights expert_params_mapping gate_proj/down_proj/up_proj; qwen3_next_mtp.py)
    Family("qwen3-next", ("Qwen3NextForCausalLM",), "hf-mlp", "hf-mlp",
           examples="Qwen3-Next-80B-A3B / Qwen3-Coder-Next NVFP4"),
    Family("nemotron-h", ("NemotronHForCausalLM",), "nemotron-h", "nemotron-h",
           examples="nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4, Nemotron-3 Super / Ultra NVFP4 (LatentMoE)"),
    Family("gemma4-moe", ("Gemma4ForConditionalGeneration",), "gemma4", "gemma4", examples="Gemma-4 MoE NVFP4"),
    Family("minimax-m2", ("MiniMaxM2ForCausalLM",), "block-sparse-moe", "block-sparse-moe",
           examples="MiniMax-M2.x NVFP4"),
    Family("mixtral", ("MixtralForCausalLM",), "block-sparse-moe", "block-sparse-moe", examples="Mixtral-style NVFP4"),
    Family("llama4", ("Llama4ForConditionalGeneration",), "llama4-stacked", "llama4",
           examples="nvidia/Llama-4-Scout-17B-16E-Instruct-FP4"),
)
_FAMILY_BY_NAME = {f.name: f for f in FAMILIES}


def family_named(name: str) -> Family:
    return _FAMILY_BY_NAME[name]


def outside_index_note(config: Mapping, file: str) -> str | None:
    """What a file the index does not list is, when the checkpoint's family ships it so; else None."""
    family = family_of(config)
    return None if family is None else family.outside_index.get(file)


def family_of(config: Mapping) -> Family | None:
    """The family of a checkpoint, from config.json `architectures`; None for an architecture not in the table."""
    archs = config.get("architectures")
    archs = archs if isinstance(archs, list) else []
    return next((f for f in FAMILIES if any(a in f.architectures for a in archs)), None)


def module_prefix(family: Family, layer: int | str, *, converted: bool = True) -> str:
    """The experts module of `layer` in this family's (converted) checkpoint: `model.layers.3.mlp.experts`."""
    scheme = family.converted_scheme if converted else family.source_scheme
    return f"{scheme.layer_prefixes[0]}.{layer}.{scheme.module}"
