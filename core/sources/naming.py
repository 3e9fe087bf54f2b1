"""The one table of expert naming schemes.

A *scheme* says where a checkpoint keeps its routed experts: one tensor per expert projection
(`per-expert`) or all experts of a layer in one tensor (`stacked`), under which layer prefixes and
experts module, with which projection (role) names, and in which orientation. A *family* is a model
architecture (core/sources/families.py): the scheme its releases use and the scheme the converted checkpoint keeps. Detection, grouping, the writer's index, validate, reverse and the
plugins all read names through this module (`parse_expert_name`, `converted_expert`).

Each entry names the public source of its facts.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from ..checkpoint.tensor_model import Role, TensorRef

__all__ = [
    "PER_EXPERT", "STACKED", "N_MAJOR", "K_MAJOR", "Scheme", "SCHEMES", "scheme_named", "ExpertName",
    "parse_expert_name", "expert_parser", "expert_key", "per_expert_key", "converted_expert", "first_expert_like",
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


def scheme_named(name: str) -> Scheme:
    return _BY_NAME[name]


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
