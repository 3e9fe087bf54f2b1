"""The one table of expert naming schemes and model families.

A *scheme* says where a checkpoint keeps its routed experts: one tensor per expert projection
(`per-expert`) or all experts of a layer in one tensor (`stacked`), under which layer prefixes and
experts module, with which projection (role) names, and in which orientation. A *family* is a model
architecture: the scheme its releases use and the scheme the converted checkpoint keeps (the engine's
own weight-name mapping for that architecture must place every converted tensor); which of its formats
the plugins serve is core/served.py. Detection, grouping, the writer's index, validate, reverse and the
plugins all read names through this module (`parse_expert_name`, `converted_expert`).

Each entry names the public source of its facts.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from .files import MTP_FILE
from .tensor_model import Role, TensorRef

__all__ = [
    "PER_EXPERT", "STACKED", "N_MAJOR", "K_MAJOR", "Scheme", "SCHEMES", "Family", "FAMILIES", "ExpertName",
    "outside_index_note", "parse_expert_name", "expert_parser", "expert_key", "per_expert_key", "converted_expert", "family_of", "family_named", "module_prefix", "first_expert_like",
    "unknown_part", "scheme_roles", "ROLE_ORDER", "logical_k",
]

PER_EXPERT, STACKED = "per-expert", "stacked"
N_MAJOR = "N-major"  # a projection is [N, K/2] (rows = output features), as nn.Linear stores it
K_MAJOR = "K-major"  # a stacked projection is [E, K/2, N]: transposed relative to the per-expert layout

ROLE_ORDER = {Role.GATE: 0, Role.UP: 1, Role.DOWN: 2}
_HF_ROLES = {"gate_proj": Role.GATE, "up_proj": Role.UP, "down_proj": Role.DOWN}
_HF_NAMES = {role: name for name, role in _HF_ROLES.items()}
_W_ROLES = {"w1": Role.GATE, "w3": Role.UP, "w2": Role.DOWN}  # w1 = gate, w3 = up, w2 = down


def logical_k(weight: TensorRef) -> int:
    return weight.shape[-1] if weight.dtype == "F4" else 2 * weight.shape[-1]


@dataclass(frozen=True)
class Scheme:
    """How one naming scheme spells an expert tensor.

    Per-expert: `<layer prefix>.<L>.<module>.<E>.<role>.<suffix>`. Stacked: `<layer prefix>.<L>.<module>.<role>`
    plus a scheme-specific tail (`_blocks`, `_weight_scale`, ...); `roles` maps a stacked role name to the
    roles it holds, in the order of its rows (`interleaved`: gate and up rows alternate, else they are halves).
    A layer prefix "mtp" gives the layer name `mtp.<L>` (DeepSeek's MTP blocks)."""
    name: str
    layout: str
    layer_prefixes: tuple[str, ...]
    module: str
    roles: Mapping[str, tuple[Role, ...]]
    orientation: str = N_MAJOR
    interleaved: bool = False
    tails: Mapping[str, str] = field(default_factory=dict)  # stacked: name tail -> part ("" = the weight)
    source: str = ""

    @functools.cached_property  # built once: parse_expert_name runs for every tensor of a checkpoint
    def pattern(self) -> re.Pattern:
        return re.compile(f"^{self.regex()}$")

    def regex(self, tag: str = "") -> str:
        """The unanchored expression of a name in this scheme; `tag` ends every group name (one expression may
        hold several schemes' groups: _Parser)."""
        prefixes = "|".join(re.escape(p) for p in self.layer_prefixes)
        roles = "|".join(re.escape(r) for r in self.roles)
        head = rf"(?P<lp{tag}>{prefixes})\.(?P<layer{tag}>\d+)\.{re.escape(self.module)}"
        if self.layout == PER_EXPERT:
            return (rf"(?P<prefix{tag}>{head}\.(?P<expert{tag}>\d+)\.(?P<proj{tag}>{roles}))"
                    rf"\.(?P<part{tag}>[A-Za-z0-9_]+)")
        tails = "|".join(re.escape(t) for t in sorted(self.tails, key=len, reverse=True) if t)
        bare = "?" if "" in self.tails else ""  # a name without a tail is a part only where "" is one
        return rf"(?P<prefix{tag}>{head}\.(?P<proj{tag}>{roles}))(?P<part{tag}>{tails}){bare}"


def _per_expert(name, prefixes, module, roles, source) -> Scheme:
    return Scheme(name, PER_EXPERT, prefixes, module, {k: (v,) for k, v in roles.items()}, source=source)


SCHEMES: tuple[Scheme, ...] = (
    # DeepSeek-V4 releases: `layers.L.ffn.experts.E.w1.weight`, MTP `mtp.0.ffn.experts.E.w2.scale`
    # (spec CHECKPOINT_FORMATS.md §3.3; deepseek-ai/DeepSeek-V4-Flash inference/model.py; ModelOpt
    # examples/deepseek/deepseek_v4/quantize_to_nvfp4.py keeps these names).
    _per_expert("deepseek", ("layers", "mtp"), "ffn.experts", _W_ROLES,
                "CHECKPOINT_FORMATS.md §3.3, §4.4; vLLM 0.33 vllm/models/deepseek_v4"),
    # Hugging Face `model.layers.L.mlp.experts.E.{gate,up,down}_proj.*`: Qwen3 MoE, DeepSeek-V3/R1 and
    # Kimi-K2 (HF names, ModelOpt quantize_to_nvfp4.py renames ffn->mlp, w1->gate_proj...), GLM-4.5/4.6/4.7
    # (also its MTP layer `model.layers.<num_hidden_layers>.*`), and gpt-oss once converted. vLLM 0.33
    # qwen3_moe.py / deepseek_v2.py / glm4_moe.py load them with FusedMoE.make_expert_params_mapping(
    # ckpt_gate_proj_name="gate_proj", ckpt_down_proj_name="down_proj", ckpt_up_proj_name="up_proj").
    _per_expert("hf-mlp", ("model.layers",), "mlp.experts", _HF_ROLES,
                "vLLM 0.33 qwen3_moe.py, deepseek_v2.py, glm4_moe.py expert_params_mapping"),
    # Multimodal wrappers keep the text stack under `model.language_model.layers` (Qwen3.5 / Qwen3.6 MoE,
    # Gemma-4 MoE: vLLM 0.33 qwen3_5.py and gemma4.py hf_to_vllm_mapper `"model.language_model." -> "model."`);
    # community exports write `language_model.model.layers` (the transformers <4.52 module path).
    _per_expert("hf-language-model", ("model.language_model.layers", "language_model.model.layers"), "mlp.experts",
                _HF_ROLES, "vLLM 0.33 qwen3_5.py, gemma4.py WeightsMapper orig_to_new_prefix"),
    # Gemma-4 MoE: vLLM 0.33 gemma4.py builds the experts as `{decoder layer}.experts` (a sibling of the dense
    # `mlp`, routed by `{decoder layer}.router`) and loads `model.language_model.*` through its hf_to_vllm_mapper,
    # so per-expert names are `model.language_model.layers.L.experts.E.*_proj` (from the module tree; no
    # released Gemma-4 NVFP4 tensor list was available to confirm it).
    _per_expert("gemma4", ("model.language_model.layers",), "experts", _HF_ROLES,
                "vLLM 0.33 gemma4.py Gemma4DecoderLayer (experts, router), routed_experts.py load_weights"),
    # Mixtral and MiniMax-M2.x: `model.layers.L.block_sparse_moe.experts.E.{w1,w3,w2}.*` (vLLM 0.33 mixtral.py
    # and minimax_m2.py: ckpt_names=("w1", "w2", "w3"); transformers modeling_mixtral.py MixtralBlockSparseTop2MLP).
    _per_expert("block-sparse-moe", ("model.layers",), "block_sparse_moe.experts", _W_ROLES,
                "vLLM 0.33 mixtral.py, minimax_m2.py ckpt_names=(w1, w2, w3)"),
    # The same experts module with Hugging Face projection names: llm-compressor 0.14 under transformers 5 writes
    # Mixtral as `model.layers.L.block_sparse_moe.experts.E.{gate,up,down}_proj.*` (its per-expert calibration
    # modules; tests/fixtures/producers). vLLM 0.33 mixtral.py hf_to_vllm_mapper maps `.gate_proj.` -> `.w1.`,
    # `.up_proj.` -> `.w3.`, `.down_proj.` -> `.w2.` for them.
    _per_expert("block-sparse-moe-hf", ("model.layers",), "block_sparse_moe.experts", _HF_ROLES,
                "vLLM 0.33 mixtral.py hf_to_vllm_mapper orig_to_new_substr; llm-compressor 0.14 Mixtral export"),
    # The `block_sparse_moe` experts of a text model nested in a multimodal wrapper: MiniMax-M3 / M3.1's VL checkpoint
    # `language_model.model.layers.L.block_sparse_moe.experts.E.w{1,3,2}` (vLLM 0.34 models/minimax_m3 nvidia/model.py
    # builds `language_model` and maps no prefix; get_expert_mapping ckpt w1 / w2 / w3), Kimi-K3's
    # `language_model.layers.L.block_sparse_moe.experts.E.w{1,3,2}` (vLLM 0.34 models/kimi_k3 nvidia/model.py
    # hf_to_vllm_mapper `language_model.layers.` -> `language_model.model.layers.`; ckpt_gate_proj_name="w1").
    _per_expert("block-sparse-moe-lm", ("language_model.model.layers", "language_model.layers"),
                "block_sparse_moe.experts", _W_ROLES,
                "vLLM 0.34 models/minimax_m3/nvidia/model.py, models/kimi_k3/nvidia/model.py expert mappings"),
    # Llama-4 per-expert names: what a converted Llama-4 keeps (vLLM 0.33 llama4.py load_weights: the
    # non-fused expert_params_mapping with gate_proj / up_proj / down_proj places them).
    _per_expert("llama4", ("language_model.model.layers",), "feed_forward.experts", _HF_ROLES,
                "vLLM 0.33 llama4.py load_weights expert_params_mapping (non-fused)"),
    # Nemotron-H / Nemotron-3-Nano (NemotronHForCausalLM): non-gated ReLU-squared experts
    # `backbone.layers.L.mixer.experts.E.{up_proj,down_proj}` (nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4).
    # vLLM 0.33 nemotron_h.py loads `up_proj` as the MoE's w1 (ckpt_gate_proj_name="up_proj", no up shard:
    # "up_proj ... is what the activation is applied to"), so here it is the gate role: w13 holds it alone.
    Scheme("nemotron-h", PER_EXPERT, ("backbone.layers",), "mixer.experts",
           {"up_proj": (Role.GATE,), "down_proj": (Role.DOWN,)},
           source="vLLM 0.33 nemotron_h.py NemotronHMoE ckpt_names=(up_proj, down_proj, None), get_expert_mapping"),
    # gpt-oss: `model.layers.L.mlp.experts.gate_up_proj_blocks` U8 [E, 2I, H/32, 16] with gate and up rows
    # interleaved (2i = gate, 2i+1 = up), `_scales` U8 [E, 2I, H/32] (spec CHECKPOINT_FORMATS.md §6;
    # openai/gpt-oss-20b tensor list; vLLM 0.33 gpt_oss.py).
    Scheme("gpt-oss", STACKED, ("model.layers",), "mlp.experts",
           {"gate_up_proj": (Role.GATE, Role.UP), "down_proj": (Role.DOWN,)}, interleaved=True,
           tails={"_blocks": "weight", "_scales": "scale"}, source="CHECKPOINT_FORMATS.md §6; vLLM 0.33 gpt_oss.py"),
    # Llama-4 by ModelOpt (nvidia/Llama-4-Scout-17B-16E-Instruct-FP4): all experts of a layer in
    # `language_model.model.layers.L.feed_forward.experts.gate_up_proj` [E, K/2, 2I] (K-major: vLLM 0.33
    # llama4.py load_moe_expert_weights transposes the last two dims, then chunks gate | up in halves) with
    # `_weight_scale` [E, K/16, 2I], `_weight_scale_2` and `_input_scale` (mllama4.py
    # _rename_weight_for_modelopt_checkpoint; spec CHECKPOINT_FORMATS.md §4.1 "BMM-style experts").
    Scheme("llama4-stacked", STACKED, ("language_model.model.layers",), "feed_forward.experts",
           {"gate_up_proj": (Role.GATE, Role.UP), "down_proj": (Role.DOWN,)}, orientation=K_MAJOR,
           tails={"": "weight", "_weight_scale": "scale", "_weight_scale_2": "global_scale",
                  "_input_scale": "input_scale"},
           source="vLLM 0.33 llama4.py load_moe_expert_weights, mllama4.py _rename_weight_for_modelopt_checkpoint"),
)
_BY_NAME = {s.name: s for s in SCHEMES}


class ExpertName(NamedTuple):
    """One expert tensor name, understood. `role` is None for a stacked gate+up tensor. A named tuple, not a
    frozen dataclass: one is made per expert tensor (10^5 in a real checkpoint), at a third of the cost."""
    scheme: Scheme
    prefix: str      # per-expert: the projection key (`model.layers.3.mlp.experts.7.gate_proj`); stacked: the base
    layer: str       # "3", or "mtp.0"
    expert: int | None
    proj: str        # the role name as spelled (`w1`, `gate_proj`, `gate_up_proj`)
    suffix: str      # per-expert: `weight`, `weight_scale`, ...; stacked: the part (`weight`, `scale`, ...)

    @property
    def role(self) -> Role | None:
        roles = self.scheme.roles[self.proj]
        return roles[0] if len(roles) == 1 else None

    @property
    def container(self) -> str:
        """The experts module: `model.layers.3.mlp.experts`."""
        return self.prefix.rsplit(".", 2 if self.scheme.layout == PER_EXPERT else 1)[0]


def parse_expert_name(name: str, schemes: Iterable[Scheme] | None = None) -> ExpertName | None:
    """The expert tensor `name` as the table understands it (the first scheme, in table order or in the order
    of `schemes`, that spells it), or None when none does. A loop over every name of a checkpoint calls
    expert_parser(schemes) once instead."""
    return (_FULL if schemes is None else expert_parser(tuple(schemes)))(name)


def expert_parser(schemes: tuple[Scheme, ...] = SCHEMES) -> Callable[[str], ExpertName | None]:
    """parse_expert_name(name, schemes) as one function: one regular expression for all of `schemes` (its
    alternatives in their order, so the first scheme that spells a name wins, as in a loop over them), run
    once per name; detection, grouping and inspect read each of a checkpoint's 10^5 names with it."""
    key = tuple(map(id, schemes))
    parser = _PARSERS.get(key)
    if parser is None:
        parser = _PARSERS[key] = _Parser(schemes)
    return parser


class _Parser:
    def __init__(self, schemes: tuple[Scheme, ...]):
        self.schemes = schemes  # kept: the cache is keyed by their ids
        body = "|".join(f"{s.regex(f'_{i}')}(?P<end_{i}>)" for i, s in enumerate(schemes))
        pattern = re.compile(f"^(?:{body})$")
        self._match = pattern.match
        # per alternative (by the index of its closing group, the last one a match closes): the scheme and
        # the indices of its groups prefix, lp, layer, expert (per-expert only), proj, part
        self._by_end = {
            pattern.groupindex[f"end_{i}"]: (s, s.layout == PER_EXPERT, tuple(
                pattern.groupindex[f"{g}_{i}"] for g in ("prefix", "lp", "layer", "expert", "proj", "part")
                if g != "expert" or s.layout == PER_EXPERT))
            for i, s in enumerate(schemes)}

    def __call__(self, name: str) -> ExpertName | None:
        m = self._match(name)
        if m is None:
            return None
        scheme, per_expert, groups = self._by_end[m.lastindex]
        if per_expert:
            prefix, lp, layer, expert, proj, part = m.group(*groups)
            return ExpertName(scheme, prefix, f"mtp.{layer}" if lp == "mtp" else layer, int(expert), proj, part)
        prefix, lp, layer, proj, tail = m.group(*groups)
        return ExpertName(scheme, prefix, f"mtp.{layer}" if lp == "mtp" else layer, None, proj,
                          scheme.tails[tail or ""])


_PARSERS: dict[tuple[int, ...], _Parser] = {}
_FULL = expert_parser(SCHEMES)


def scheme_roles(scheme: Scheme) -> frozenset[Role]:
    """Every projection an expert has in `scheme`: gate, up and down, or gate (the activated half) and down
    for non-gated experts."""
    return frozenset(r for roles in scheme.roles.values() for r in roles)


def expert_key(scheme: Scheme, layer: int | str, expert: int, role: Role) -> str:
    """The projection key of a per-expert scheme: `model.layers.3.block_sparse_moe.experts.7.w1`."""
    name = next(n for n, roles in scheme.roles.items() if roles == (role,))
    return f"{scheme.layer_prefixes[0]}.{layer}.{scheme.module}.{expert}.{name}"


def per_expert_key(container: str, expert: int, role: Role) -> str:
    """The per-expert key a stacked projection converts to: the same experts module, Hugging Face role names
    (`model.layers.3.mlp.experts.7.gate_proj`), which the engines' non-fused expert mapping places."""
    return f"{container}.{expert}.{_HF_NAMES[role]}"


def converted_expert(name: str) -> tuple[str, int, Role] | None:
    """(layer, expert, role) of a converted checkpoint's expert tensor (always per-expert names), or None:
    what the serving plugins need to place a tensor."""
    parsed = parse_expert_name(name, (s for s in SCHEMES if s.layout == PER_EXPERT))
    return None if parsed is None else (parsed.layer, parsed.expert, parsed.role)


# ------------------------------------------------------------------------------------------------ families
@dataclass(frozen=True)
class Family:
    """A model architecture. Whether the plugins serve it is not a field here: core/served.py says which
    source formats of it each engine release is proven to serve (a family without rows there is refused)."""
    name: str
    architectures: tuple[str, ...]
    scheme: str           # the scheme its releases use
    output_scheme: str    # the scheme the converted checkpoint keeps
    examples: str = ""
    outside_index: Mapping[str, str] = field(default_factory=dict)  # file the index does not list -> what it is

    @property
    def source_scheme(self) -> Scheme:
        return _BY_NAME[self.scheme]

    @property
    def converted_scheme(self) -> Scheme:
        return _BY_NAME[self.output_scheme]


FAMILIES: tuple[Family, ...] = (
    Family("deepseek-v4", ("DeepseekV4ForCausalLM",), "deepseek", "deepseek",
           examples="deepseek-ai/DeepSeek-V4-Flash, nvidia/DeepSeek-V4-Flash-NVFP4"),
    # V4's names; DSpark stages mtp.0-2 sized by dspark_n_routed_experts (core/structure.py), Engram, vision copied
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
    # Recognised, not yet proven (no serving test loads them: core/served.py has no rows, so the gate refuses them
    # with that reason). GLM-5.3-Flash: HF expert names, text `model.layers`, multimodal `model.language_model.layers`
    # (vLLM 0.34 models/glm5next common/model.py: fused_moe_make_expert_params_mapping gate_proj / up_proj /
    # down_proj, the multimodal mapper `model.language_model.` -> `language_model.model.`; SGLang 0.5.23 glm5_next.py
    # `model.language_model.` -> `model.`); hybrid KDA linear attention + MLA + sparse indexer + mHC, swiglu_limit.
    Family("glm5-next", ("Glm5NextForCausalLM",), "hf-mlp", "hf-mlp", examples="GLM-5.3-Flash NVFP4 (text)"),
    Family("glm5-next-vl", ("Glm5NextForConditionalGeneration",), "hf-language-model", "hf-language-model",
           examples="GLM-5.3-Flash NVFP4 (multimodal)"),
    # Qwen3.8-Flash-Next: Qwen3-Next's sparse MoE block (HF expert names) under `model.language_model.layers` (vLLM
    # 0.34 models/qwen4_exp nvidia/model.py Qwen4ExpSparseMoeBlock(Qwen3NextSparseMoeBlock), mapper
    # `model.language_model.` -> `model.`); its per-layer embedding (PLE) tables are no experts
    Family("qwen4-exp", ("Qwen4ExpForCausalLM", "Qwen4ExpForConditionalGeneration"), "hf-language-model",
           "hf-language-model", examples="Qwen3.8-Flash-Next NVFP4"),
    # MiniMax-M3 / M3.1: MiniMax-M2's `block_sparse_moe.experts.E.w{1,3,2}` (text), under `language_model.model.layers`
    # in the VL checkpoint; clamped SwiGLU
    Family("minimax-m3", ("MiniMaxM3SparseForCausalLM",), "block-sparse-moe", "block-sparse-moe",
           examples="nvidia/MiniMax-M3-NVFP4 (text)"),
    Family("minimax-m3-vl", ("MiniMaxM3SparseForConditionalGeneration",), "block-sparse-moe-lm", "block-sparse-moe-lm",
           examples="MiniMax-M3 / M3.1 NVFP4 (multimodal)"),
    # Kimi-K3: `language_model.layers.L.block_sparse_moe.experts.E.w{1,3,2}.weight_packed` (compressed-tensors MXFP4 /
    # NVFP4), latent MoE at `routed_expert_hidden_size` (core/structure.py model_dims), SiTU activation
    Family("kimi-k3", ("KimiK3ForConditionalGeneration", "KimiK31ForConditionalGeneration"), "block-sparse-moe-lm",
           "block-sparse-moe-lm", examples="Kimi-K3 (compressed-tensors MXFP4 / NVFP4)"),
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


# --------------------------------------------------------------------------------------- unknown names
_EXPERTISH = re.compile(r"(^|\.)experts?(\.|_|$)")


def first_expert_like(names: Iterable[str]) -> str | None:
    """The first tensor whose path has an `experts` module (the routed experts, in whatever scheme)."""
    return next((n for n in names if _EXPERTISH.search(n)), None)


def unknown_part(name: str) -> str:
    """Which part of an expert-like tensor's path no scheme understands, in words."""
    prefixes = sorted({p for s in SCHEMES for p in s.layer_prefixes})
    m = re.match(rf"^(?P<lp>{'|'.join(map(re.escape, prefixes))})\.(?P<layer>\d+)\.(?P<rest>.+)$", name)
    if m is None:
        head = name.split(".experts")[0]
        return (f"its layer path {head!r} is not a known layer prefix (known: "
                f"{', '.join(p + '.<L>' for p in prefixes)})")
    modules = sorted({s.module for s in SCHEMES if m["lp"] in s.layer_prefixes})
    module = next((mod for mod in modules if m["rest"].startswith(mod + ".")), None)
    if module is None:
        found = m["rest"].split(".experts")[0] + ".experts" if ".experts" in m["rest"] else m["rest"]
        return (f"its experts module {found!r} after {m['lp']}.{m['layer']} is not known there (known: "
                f"{', '.join(modules)})")
    tail = m["rest"][len(module) + 1:]
    roles = sorted({r for s in SCHEMES if m["lp"] in s.layer_prefixes and s.module == module for r in s.roles})
    return (f"the part after {module!r} ({tail!r}) is not an expert index and projection name known for "
            f"{m['lp']}.<L>.{module} (known projections: {', '.join(roles)})")
