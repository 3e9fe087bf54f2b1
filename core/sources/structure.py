"""The structure rules of an MoE checkpoint, from config and headers alone: one home for both the
converter's planning pass (convert/plan.py refuses the first rule that fails) and validate
(validate/checks/structure.py reports every violation), so the two can never disagree.

Each rule is a pure function over the Checkpoint model that yields `Violation`s; `RULES` names, for
each, validate's check id, the converter's error id and the fix. The tile rule is not here: it
belongs to formats/tiles.py.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..checkpoint.tensor_model import Checkpoint, Projection, Quant, Role
from ..record.converted_config import read_tp_layout
from .families import family_of
from .naming import parse_expert_name, scheme_roles

__all__ = ["RULES", "Rule", "Violation", "empty_projections", "expert_dims", "experts_beyond_config", "padded_containers",
           "situ_betas", "swiglu_limit", "experts_incomplete", "foreign_experts", "head_missing", "input_scales_partial", "layer_experts",
           "model_dims", "substituted_experts", "unreadable_tensors"]


@dataclass(frozen=True, slots=True)
class Violation:
    tensor: str  # the tensor (or experts container) the problem is about
    message: str
    file: str | None = None
    layer: str | None = None
    expert: int | None = None
    count: int = 1


@dataclass(frozen=True)
class Rule:
    check_id: str  # validate's finding id (exit 1)
    error_id: str  # the converter's refusal id (ContentError, exit 4)
    hint: str  # the fix, printed by both
    fn: Callable[[Checkpoint], Iterator[Violation]]

    def __call__(self, ckpt: Checkpoint) -> Iterator[Violation]:
        return self.fn(ckpt)


# The width the routed experts run at, by the config field the engines read, before `hidden_size`: latent MoE
# projects the hidden state down before the experts and back after them. Nemotron-3 Super / Ultra:
# `moe_latent_size` (vLLM 0.33 / 0.34 and SGLang 0.5.23 nemotron_h.py: `self.moe_hidden_size = config.moe_latent_size
# if self.use_latent_moe else config.hidden_size`, the FusedMoE's hidden_size); Kimi-K3: `routed_expert_hidden_size`
# (vLLM 0.34 models/kimi_k3 `use_latent_moe = routed_expert_hidden_size is not None`).
EXPERT_WIDTH_KEYS = ("moe_latent_size", "routed_expert_hidden_size", "hidden_size")


def model_dims(config: dict) -> dict:
    """hidden / intermediate / experts / layers from a DeepSeek-V4 or Hugging Face config (None when absent);
    a nested `text_config` (multimodal configs) wins over the top level. `hidden` is the width the routed experts
    run at (EXPERT_WIDTH_KEYS: the latent width of a latent MoE), the one home of that fact for the structure
    check, validate and `plan`'s tiles."""
    def get(*keys):
        for c in (config.get("text_config") or {}, config):
            for k in keys:
                if isinstance(c.get(k), int) and not isinstance(c.get(k), bool):
                    return c[k]
        return None
    return {"hidden": get(*EXPERT_WIDTH_KEYS), "intermediate": get("moe_intermediate_size", "intermediate_size"),
            "experts": get("n_routed_experts", "num_local_experts", "num_experts"),
            "layers": get("num_hidden_layers"), "draft_experts": get(_DRAFT_EXPERTS)}


def swiglu_limit(config: dict) -> float | None:
    """The clamp of the experts' SwiGLU for a family whose engines clamp it (core/sources/families.py `activation`
    "swiglu-limit"): config `swiglu_limit` (a nested `text_config` wins); None where the family's activation is not
    the clamped SwiGLU (gpt-oss's own swiglu_limit belongs to another activation) or the config has no limit."""
    family = family_of(config)
    if family is None or family.activation != "swiglu-limit":
        return None
    for c in (config.get("text_config") or {}, config):
        v = c.get("swiglu_limit") if isinstance(c, dict) else None
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            return float(v)
    return None


def situ_betas(config: dict) -> tuple[float, float | None] | None:
    """(beta, linear_beta or None) of the experts' SiTU for a family whose engines apply it (families.py `activation`
    "situ": Kimi-K3): `activation_situ_beta` (1.0 when unset) and `activation_situ_linear_beta`, as vLLM 0.34's KimiMoE
    hands them to its FusedMoE (a nested `text_config` wins); None for any other family."""
    family = family_of(config)
    if family is None or family.activation != "situ":
        return None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    beta, linear = text.get("activation_situ_beta"), text.get("activation_situ_linear_beta")
    return float(beta or 1.0), (float(linear) if linear else None)


# DeepSeek-V4.1's DSpark draft stages size their MoE with this field, not n_routed_experts (vLLM 0.34
# models/deepseek_v41/nvidia/model.py DeepseekV4MoE: a layer index >= num_hidden_layers takes
# `getattr(config, "dspark_n_routed_experts", 0) or n_routed_experts`; dspark.py load_weights the same)
_DRAFT_EXPERTS = "dspark_n_routed_experts"


def layer_experts(config: dict, layer: str) -> tuple[int | None, str]:
    """(the experts the engine allocates for `layer`, the config field that says so): a draft layer (`mtp.N`, or a
    layer numbered num_hidden_layers or more) takes the draft's own count where the config has one."""
    dims = model_dims(config)
    draft = layer.startswith("mtp") or (layer.isdecimal() and dims["layers"] is not None
                                        and int(layer) >= dims["layers"])
    if draft and dims["draft_experts"]:
        return dims["draft_experts"], _DRAFT_EXPERTS
    return dims["experts"], "n_routed_experts"


# Per-layer expert pruning (MoNE: llm-compressor PR #2906's saved checkpoints): a layer's pruned experts are
# listed by decoder layer and stored as no weights; the retained ones keep their logical ids. vLLM 0.33 / 0.34
# fused_moe/expert_substitution.py get_expert_substitution_spec reads `approximate_experts` ({layer: [ids]}, config or
# text config) or `compression_config.transform_config.expert_substitution` (version 1: `targets`, one decoder-layer
# path each, whose `replacements` are keyed by expert id); no other producer's per-layer form was found public.
_SUBSTITUTED = ("approximate_experts", "compression_config.transform_config.expert_substitution")


def substituted_experts(config: dict, layer: str) -> tuple[frozenset[int], str | None]:
    """(the experts of `layer` that a per-layer pruning replaced, which therefore have no weights; the config field
    that says so), as vLLM reads them; (empty, None) for a layer, or a config, without any."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    listed = text.get(_SUBSTITUTED[0], config.get(_SUBSTITUTED[0]))
    if isinstance(listed, dict):
        ids = listed.get(layer)
        return (frozenset(int(i) for i in ids), _SUBSTITUTED[0]) if isinstance(ids, list) and ids else (frozenset(), None)
    declared = ((config.get("compression_config") or {}).get("transform_config") or {}).get("expert_substitution")
    targets = declared.get("targets") if isinstance(declared, dict) else None
    for path, target in (targets.items() if isinstance(targets, dict) else ()):
        indices = [part for part in str(path).split(".") if part.isdigit()]  # the decoder layer: its one index
        if indices == [layer] and isinstance(target, dict) and isinstance(target.get("replacements"), dict):
            return frozenset(int(i) for i in target["replacements"]), _SUBSTITUTED[1]
    return frozenset(), None


def _implied(p: Projection) -> tuple[int, int]:
    """(H, I) as this projection's [N, K] implies them: gate/up are [I, H], down is [H, I]."""
    return (p.n, p.k) if p.role is Role.DOWN else (p.k, p.n)


def empty_projections(ckpt: Checkpoint) -> Iterator[Violation]:
    """A projection with 0 rows or columns holds no expert: the engine's fused tensor cannot take it."""
    for p in ckpt.projections:
        if p.n == 0 or p.k == 0:
            yield Violation(p.weight.name, f"{p.key} has [N, K] = [{p.n}, {p.k}]: an expert projection with no "
                            "weights.", file=p.weight.file, layer=p.layer, expert=p.expert)


def unreadable_tensors(ckpt: Checkpoint) -> set[str]:
    """Names of the tensors of empty projections: nothing to read, and per-block code would divide by 0."""
    bad = {v.tensor for v in empty_projections(ckpt)}
    return {r.name for p in ckpt.projections if p.weight.name in bad for r in p.source_refs}


def padded_containers(ckpt: Checkpoint) -> dict:
    """container -> RankTiles of a converted checkpoint's padded containers (quantization_config.tp_layout;
    validate's structure.tile.tp reports a record that does not parse)."""
    if not ckpt.format.converted:
        return {}
    try:
        layout = read_tp_layout(ckpt.config)
    except ValueError:
        return {}
    return layout[2] if layout else {}


def expert_dims(ckpt: Checkpoint) -> Iterator[Violation]:
    """Every projection's [N, K] must be what the experts' width (model_dims) / moe_intermediate_size imply (gate/up [I, H],
    down [H, I]); without them, what the rest of its layer implies. A reshaped or transposed tensor
    reads as another matrix."""
    dims = model_dims(ckpt.config)
    padded = padded_containers(ckpt)
    by_container: dict[str, list[Projection]] = defaultdict(list)
    for p in ckpt.projections:
        if p.n and p.k:  # empty ones: empty_projections
            by_container[p.container].append(p)
    bad: dict[str, list[Projection]] = defaultdict(list)
    for container, ps in by_container.items():
        if dims["hidden"] and dims["intermediate"]:
            want, source = (dims["hidden"], dims["intermediate"]), "config.json"
        else:
            want, source = Counter(_implied(p) for p in ps).most_common(1)[0][0], "the rest of its layer"
        t = padded.get(container)
        if t is not None and want == (t.hidden, t.intermediate):  # a --tp/--ep output: the padded per-rank layout
            want, source = (t.h_pad, t.moe_tp * t.i_pad), f"{source} padded for TP {t.tp} / EP {t.ep} (tp_layout)"
        for p in ps:
            if _implied(p) != want:
                n_want, k_want = (want[0], want[1]) if p.role is Role.DOWN else (want[1], want[0])
                bad[f"{p.role.value}: [N, K] = [{p.n}, {p.k}], {source} implies [{n_want}, {k_want}] "
                    f"(H={want[0]}, I={want[1]})"].append(p)
    for text, ps in bad.items():
        yield Violation(ps[0].weight.name, f"{len(ps)} projections: {text}; first {ps[0].key}.", file=ps[0].weight.file,
                        layer=ps[0].layer, expert=ps[0].expert, count=len(ps))


def _experts(ckpt: Checkpoint) -> dict[str, dict[int, set[Role]]]:
    have: dict[str, dict[int, set[Role]]] = {}
    for p in ckpt.projections:
        have.setdefault(p.container, {}).setdefault(p.expert, set()).add(p.role)
    return have


def _layer(ckpt: Checkpoint, container: str) -> str:
    return next(p.layer for p in ckpt.projections if p.container == container)


def _roles(ckpt: Checkpoint, container: str) -> set[Role]:
    """The projections each expert of `container` has in its naming scheme: gate, up and down, or for
    non-gated experts (Nemotron-H) the two its scheme names (core/sources/naming.py)."""
    weight = next(p.weight.name for p in ckpt.projections if p.container == container)
    parsed = parse_expert_name(weight)
    return set(scheme_roles(parsed.scheme)) if parsed is not None else set(Role)


_MAX_LISTED = 1 << 16  # no MoE has more experts a layer; a larger index or count is reported, never enumerated


def experts_incomplete(ckpt: Checkpoint) -> Iterator[Violation]:
    """The engine allocates n_routed_experts per layer (a draft layer: its own count, layer_experts), each with every projection of its scheme (gate, up and down; up and down for non-gated experts); a missing one fails the load or serves zeros."""
    for container, experts in _experts(ckpt).items():
        layer = _layer(ckpt, container)
        want, field_name = layer_experts(ckpt.config, layer)
        count = want or max(experts) + 1
        pruned, pruned_by = substituted_experts(ckpt.config, layer)  # per-layer pruning: no weights, by design
        expected = (set(range(count)) if count <= _MAX_LISTED else set(experts)) - pruned
        missing = sorted(expected - set(experts))
        if missing:
            also = f", {len(pruned)} pruned by {pruned_by}" if pruned else ""
            yield Violation(container, f"{container} has {len(set(experts) & expected)} of {len(expected)} experts "
                            f"({field_name}={want}{also}); missing experts {_ranges(missing)}.", count=len(missing),
                            file=ckpt.index_file, layer=layer, expert=missing[0])
        roles = _roles(ckpt, container)
        for e in sorted(e for e, have in experts.items() if have != roles):
            lacking = sorted(r.value for r in roles - experts[e]) or ["(it has one its scheme does not name)"]
            yield Violation(f"{container}.{e}", f"expert {e} of {container} lacks projection(s) {', '.join(lacking)}.",
                            file=ckpt.index_file, layer=layer, expert=e)


def experts_beyond_config(ckpt: Checkpoint) -> Iterator[Violation]:
    """Experts numbered n_routed_experts or more have no slot in the engine's stacked tensors: the load fails or drops them."""
    for container, experts in _experts(ckpt).items():
        want, field_name = layer_experts(ckpt.config, _layer(ckpt, container))
        if not want:
            continue
        extra = sorted(e for e in experts if e >= want)
        if extra:
            first = next(p for p in ckpt.projections if p.container == container and p.expert == extra[0])
            yield Violation(first.weight.name, f"{container} has experts {_ranges(extra)}, beyond "
                            f"{field_name}={want} (config.json).", file=first.weight.file, layer=first.layer,
                            expert=extra[0], count=len(extra))


def _ranges(xs: list[int]) -> str:
    out, start = [], xs[0]
    for a, b in zip(xs, xs[1:] + [None]):
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return ", ".join(out[:8]) + (" ..." if len(out) > 8 else "")


def foreign_experts(ckpt: Checkpoint) -> Iterator[Violation]:
    """The family's engine mapping places experts only under its own experts module (core/sources/families.py FAMILIES):
    a second set under another scheme's module (a Qwen3-MoE with `block_sparse_moe.experts.E.w1`) has no home."""
    family = family_of(ckpt.config)
    if family is None:
        return
    homes = sorted({(lp, s.module) for s in (family.source_scheme, family.converted_scheme) for lp in s.layer_prefixes})
    home = re.compile("^(?:" + "|".join(rf"{re.escape(lp)}\.\d+\.{re.escape(m)}" for lp, m in homes) + ")$")
    foreign = [p for p in ckpt.projections if not home.match(p.container)]
    if foreign:
        f = foreign[0]
        yield Violation(f.weight.name, f"{len(foreign)} expert projections are outside the {family.name} experts "
                        f"module(s) {', '.join(f'{lp}.<L>.{m}' for lp, m in homes)} ({', '.join(family.architectures)} in "
                        f"config.json); first {f.weight.name}.", file=f.weight.file, layer=f.layer, expert=f.expert,
                        count=len(foreign))


_HEAD = re.compile(r"^(?:head|(?:[\w.]+\.)?lm_head)\.weight(?:_packed)?$")  # the model's head, not an MTP block's


def head_missing(ckpt: Checkpoint) -> Iterator[Violation]:
    """The model's own output head: DeepSeek-V4 checkpoints ship `head.weight` (its model has its own head, spec
    CHECKPOINT_FORMATS.md §3.3); any other model whose config says tie_word_embeddings: false needs `lm_head.weight`.
    Without it the engine's load fails or leaves the head uninitialised."""
    cfg = ckpt.config
    family = family_of(cfg)
    v4 = family is not None and family.scheme == "deepseek"
    tied = [c["tie_word_embeddings"] for c in (cfg.get("text_config") or {}, cfg) if "tie_word_embeddings" in c]
    if not (v4 or (tied and tied[0] is False)) or any(_HEAD.match(n) for n in ckpt.tensors):
        return
    want = "head.weight" if v4 else "lm_head.weight"
    why = "DeepSeek-V4 checkpoints ship it (vLLM's V4 mapper loads it as lm_head.weight)" if v4 else "config.json says tie_word_embeddings: false"
    yield Violation(want, f"no output head tensor ({want}) although {why}.", file=ckpt.index_file)


def input_scales_partial(ckpt: Checkpoint) -> Iterator[Violation]:
    """An NVFP4 export with its input quantizer on writes an input scale for every expert projection (ModelOpt
    `input_scale`, compressed-tensors `input_global_scale`; none at all for W4A16): some with and some without means
    tensors were lost."""
    nv = [p for p in ckpt.projections if p.quant is Quant.NVFP4]
    have = [p for p in nv if p.input_scale is not None]
    lacking = [p for p in nv if p.input_scale is None]
    if have and lacking:
        f = lacking[0]
        name = f"{f.key}.{'input_global_scale' if have[0].input_scale.name.endswith('input_global_scale') else 'input_scale'}"
        yield Violation(name, f"{len(lacking)} of {len(nv)} NVFP4 expert projections have no input scale while "
                        f"{len(have)} have one (e.g. {have[0].input_scale.name}); first lacking {f.key}.",
                        file=f.weight.file, layer=f.layer, expert=f.expert, count=len(lacking))


RULES = (
    Rule(check_id="structure.experts.scheme", error_id="convert.foreign_experts",
         hint="the checkpoint holds experts under another model's naming scheme: remove that second set (keep only "
              "the names the family's engine mapping loads), or fix `architectures` in config.json", fn=foreign_experts),
    Rule(check_id="structure.experts.empty", error_id="convert.empty_expert",
         hint="re-export the checkpoint: every expert projection needs its full [N, K] weight", fn=empty_projections),
    Rule(check_id="structure.experts.missing", error_id="convert.incomplete_experts",
         hint="re-download the shards that hold these experts; every expert of every layer must be present",
         fn=experts_incomplete),
    Rule(check_id="structure.experts.extra", error_id="convert.extra_experts",
         hint="fix n_routed_experts in config.json, or remove the stray experts' tensors", fn=experts_beyond_config),
    Rule(check_id="structure.experts.dims", error_id="convert.expert_dims",
         hint="fix hidden_size / moe_intermediate_size in config.json, or re-export the tensors with the right "
              "shape", fn=expert_dims),
    Rule(check_id="structure.head", error_id="convert.missing_head",
         hint="re-download the shard that holds the output head (the index lists it), or set tie_word_embeddings to "
              "true in config.json if the model really shares it with the embedding", fn=head_missing),
    Rule(check_id="structure.experts.input_scale", error_id="convert.partial_input_scales",
         hint="re-download or re-export the checkpoint: every NVFP4 expert projection of an export with input scales "
              "has one", fn=input_scales_partial),
)
