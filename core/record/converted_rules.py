"""The rules of a converted record's config block (docs/FORMAT.md, docs/ERRORS.md "Converted config"):
every problem of a block at once, each with its error id. core/record/converted_config.py parses through them;
nothing else reads a block.

A value of the wrong JSON type is refused, never coerced (`"tp": "2"`, `w4a8: 1`), a layout tag is
checked against its engine, and every container the block names elsewhere (`rescale_factors`,
`tp_layout`) must be in the `experts` map, which the plugins route by.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...formats.tiles import GROUP_SIZE, OK, PAD, moe_rank_tiles
from ..sources.source_formats import engine_padding
from ..targets.engines import ACT_DTYPES, ENGINES, LAYOUTS, QUANT_METHOD, READABLE_FORMAT_VERSIONS

__all__ = ["BAD_VALUE", "EXPERTS_MAP", "FORMATS", "LAYOUT", "LAYOUT_KEYS", "NOT_OURS", "PRODUCER", "RESCALE", "TP_LAYOUT",
           "Problem", "block_problems", "model_config_problems"]

PRODUCER = "dsv4-convert"  # the producer name every record of this tool carries

# error ids of the refusals (docs/ERRORS.md, section "Converted config")
NOT_OURS = "converted_config.not_ours"  # quant_method / format_version: not a block this version reads
BAD_VALUE = "converted_config.bad_value"  # a field of the wrong type or outside its values
LAYOUT = "converted_config.layout"  # marlin_layout, target_engine and w4a8 contradict each other
EXPERTS_MAP = "converted_config.experts_map"  # a container named elsewhere is missing from `experts`
TP_LAYOUT = "converted_config.tp_layout"  # the --tp/--ep record is malformed or contradicts the tile rule
RESCALE = "converted_config.rescale_factor"  # a factor no conversion writes: the plugin would zero or warp scales

FORMATS = tuple(GROUP_SIZE)
LAYOUT_KEYS = ("hidden", "intermediate", "i_shard", "i_pad", "h_pad")
_STACKS = (".w13", ".w2")


@dataclass(frozen=True, slots=True)
class Problem:
    error_id: str
    text: str


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def block_problems(cfg: dict) -> list[Problem]:
    out: list[Problem] = []

    def bad(error_id: str, text: str) -> None:
        out.append(Problem(error_id, text))

    if cfg.get("quant_method") != QUANT_METHOD:
        bad(NOT_OURS, f"quant_method is {cfg.get('quant_method')!r}, expected {QUANT_METHOD!r}")
    version = cfg.get("format_version")
    if not _is_int(version) or version not in READABLE_FORMAT_VERSIONS:
        bad(NOT_OURS, f"format_version is {version!r}; this dsv4-convert reads format_version "
            f"{' or '.join(map(str, READABLE_FORMAT_VERSIONS))} (upgrade dsv4-convert where it runs)")
    layout = cfg.get("marlin_layout")
    if layout is None:
        bad(BAD_VALUE, "marlin_layout is missing (every dsv4-convert checkpoint records it; re-convert)")
    elif layout not in LAYOUTS:
        bad(BAD_VALUE, f"marlin_layout {layout!r} is unknown; known tags: {sorted(LAYOUTS)}")
    engine = cfg.get("target_engine")
    if engine is not None and engine not in ENGINES:
        bad(BAD_VALUE, f"target_engine is {engine!r}, expected one of {sorted(ENGINES)}")
    elif engine is not None and layout in LAYOUTS and LAYOUTS[layout].name != engine:
        bad(LAYOUT, f"target_engine {engine!r} with marlin_layout {layout!r}, which is {LAYOUTS[layout].name}'s")
    if cfg.get("act_dtype") not in ACT_DTYPES:
        bad(BAD_VALUE, f"act_dtype is {cfg.get('act_dtype')!r}, expected one of {ACT_DTYPES}")
    w4a8 = cfg.get("w4a8", False)
    if not isinstance(w4a8, bool):
        bad(BAD_VALUE, f"w4a8 must be true or false, got {w4a8!r}")
    elif w4a8 and layout in LAYOUTS and not LAYOUTS[layout].w4a8:
        bad(LAYOUT, f"w4a8 is true but {layout!r} ({LAYOUTS[layout].name}) has no W4A8 Marlin layout")
    experts = cfg.get("experts")
    if not isinstance(experts, dict) or not experts:
        bad(BAD_VALUE, f"experts must map each experts module to one of {FORMATS}")
        experts = {}
    for name, fmt in experts.items():
        if fmt not in FORMATS:
            bad(BAD_VALUE, f"experts[{name!r}] is {fmt!r}, expected one of {FORMATS}")
    wf = cfg.get("weight_format")
    if wf is not None and wf not in FORMATS:
        bad(BAD_VALUE, f"weight_format is {wf!r}, expected one of {FORMATS}")
    gs = cfg.get("group_size")
    if gs is not None and (not _is_int(gs) or gs not in GROUP_SIZE.values()):
        bad(BAD_VALUE, f"group_size is {gs!r}, expected {' or '.join(map(str, sorted(GROUP_SIZE.values())))}")
    elif gs is not None and wf in GROUP_SIZE and gs != GROUP_SIZE[wf]:
        bad(BAD_VALUE, f"group_size is {gs}, but {wf} blocks are {GROUP_SIZE[wf]} values")
    for key in ("target_engine_version", "source_format", "model_type", "expert_dtype"):
        if cfg.get(key) is not None and not isinstance(cfg[key], str):
            bad(BAD_VALUE, f"{key} must be a string, got {cfg[key]!r}")
    layouts = cfg.get("layouts", [])
    if not isinstance(layouts, list) or not all(
            isinstance(d, dict) and _is_int(d.get("tp")) and _is_int(d.get("ep")) and d["tp"] >= 1 and d["ep"] >= 1
            for d in layouts):
        bad(BAD_VALUE, "layouts must be a list of {tp, ep} with positive integers")
    pm = cfg.get("packed_modules", [])
    if not isinstance(pm, list) or not all(isinstance(p, str) for p in pm):
        bad(BAD_VALUE, "packed_modules must be a list of strings")
    rescale = cfg.get("rescale_factors", {})
    if not isinstance(rescale, dict):
        bad(BAD_VALUE, "rescale_factors must map '<container>.w13' / '.w2' to vLLM's power-of-two factors")
        rescale = {}
    for key, value in rescale.items():
        container = next((key[: -len(s)] for s in _STACKS if key.endswith(s)), None)
        if container is None:
            bad(BAD_VALUE, f"rescale_factors key {key!r} does not end in .w13 or .w2")
        elif experts and container not in experts:
            bad(EXPERTS_MAP, f"rescale_factors names {container!r}, which experts does not list (the plugins "
                "would serve that container with the engine's own method and misread its Marlin tensors)")
        elif why := _rescale_problem(value, experts.get(container), layout, cfg.get("act_dtype")):
            bad(RESCALE, f"rescale_factors[{key!r}] is {value!r}: {why}")
    for key in ("original_quantization_config", "original_hf_quant_config"):
        v = cfg.get(key)
        if v is not None and not isinstance(v, dict):
            bad(BAD_VALUE, f"{key} must be an object or null, got {type(v).__name__}")
    producer = cfg.get("producer")
    if producer is not None and not (isinstance(producer, dict) and producer.get("name") == PRODUCER
                                     and isinstance(producer.get("version"), str)):
        bad(BAD_VALUE, f"producer must be {{\"name\": \"{PRODUCER}\", \"version\": \"...\"}} or absent, got {producer!r}")
    if cfg.get("serves_from") is not None and not (
            cfg["serves_from"] == "hf_quant_config.json" and isinstance(cfg.get("original_hf_quant_config"), dict)):
        bad(BAD_VALUE, "serves_from must be \"hf_quant_config.json\" (with original_hf_quant_config) or absent, got "
            f"{cfg['serves_from']!r}")
    orig = cfg.get("original_quantization_config")
    if isinstance(orig, dict) and not isinstance(orig.get("quant_method"), str):
        bad(BAD_VALUE, "original_quantization_config must be the source's block (with its quant_method) or null")
    if cfg.get("tp_layout") is not None:
        out += _tp_layout_problems(cfg["tp_layout"], experts, LAYOUTS[layout].name if layout in LAYOUTS else None,
                                   cfg.get("source_format"))
    return out


def _rescale_problem(value, fmt: str | None, layout, act_dtype) -> str | None:
    """Why one recorded factor is not one a conversion for this block writes (None: it is). The vLLM plugin
    re-encodes every block scale of the stack by it: an infinite, huge or odd factor zeroes or warps them all."""
    if not _is_number(value) or not math.isfinite(value) or value <= 0:
        return "expected a finite positive number"
    facts = LAYOUTS.get(layout)
    if value == 1 or fmt is None or facts is None or not isinstance(act_dtype, str):
        return None  # the identity (every rescale allows it); else the container, layout or dtype has its own rule
    # imported here: the codec module loads the compiled kernels (~0.8 s), which every command's start-up and
    # both plugins' config parsing would otherwise pay for a record that holds only 1s
    from ...formats.marlin.reference_scales import possible_rescale_factors

    if fmt != "nvfp4":
        allowed, why = frozenset({1.0}), f"{fmt} experts have no rescale"
    elif not facts.rescale:
        allowed, why = frozenset({1.0}), f"{facts.display} has no rescale"
    else:  # bf16: 2**0 .. 2**17; fp16: 1 (formats/marlin/reference_scales.py)
        allowed, why = possible_rescale_factors(act_dtype), f"{facts.display}'s rescale of E4M3 scales, {act_dtype}"
    if value in allowed:
        return None
    exps = sorted(int(math.log2(f)) for f in allowed)
    want = "1" if exps == [0] else f"a power of two from 2**{exps[0]} to 2**{exps[-1]}"
    return f"expected {want} ({why}); re-convert, or restore the config.json the conversion wrote"


def _tp_layout_problems(tl, experts: dict, engine: str | None, source_format=None) -> list[Problem]:
    if not isinstance(tl, dict):
        return [Problem(TP_LAYOUT, "tp_layout must be an object {tp, ep, containers}")]
    out = [Problem(TP_LAYOUT, f"tp_layout.{k} must be a positive integer, got {tl.get(k)!r}")
           for k in ("tp", "ep") if not (_is_int(tl.get(k)) and tl[k] >= 1)]
    containers = tl.get("containers")
    if not isinstance(containers, dict):
        return [*out, Problem(TP_LAYOUT, "tp_layout.containers must map each experts container to its sizes")]
    for name, c in containers.items():
        if name not in experts:
            out.append(Problem(EXPERTS_MAP, f"tp_layout.containers[{name!r}] is not listed in experts"))
        elif not isinstance(c, dict) or c.get("status") not in (OK, PAD) or not all(
                _is_int(c.get(k)) and c[k] > 0 for k in LAYOUT_KEYS) or not isinstance(c.get("gated", True), bool):
            out.append(Problem(TP_LAYOUT, f"tp_layout.containers[{name!r}] needs status ok|pad, positive "
                               f"integer {', '.join(LAYOUT_KEYS)} and gated true|false when present"))
        elif not out and engine is not None and experts[name] in FORMATS:
            v = moe_rank_tiles(experts[name], engine_padding(engine, source_format), hidden=c["hidden"], intermediate=c["intermediate"],
                               tp=tl["tp"], ep=tl["ep"], gated=c.get("gated", True))
            got = (c["status"], c["i_shard"], c["i_pad"], c["h_pad"])
            if got != (v.status, v.i_shard, v.i_pad, v.h_pad):
                out.append(Problem(TP_LAYOUT, f"tp_layout.containers[{name!r}] records (status, i_shard, i_pad, "
                                   f"h_pad) = {got}, the tile rule gives {(v.status, v.i_shard, v.i_pad, v.h_pad)}"))
    return out


# the model dimensions this tool reads from config.json: positive integers when present
_DIM_KEYS = ("hidden_size", "moe_intermediate_size", "intermediate_size", "num_hidden_layers", "n_routed_experts",
             "num_local_experts", "num_experts", "moe_latent_size", "routed_expert_hidden_size")


def model_config_problems(config: dict) -> list[Problem]:
    """config.json's model dimensions of the wrong type (`n_routed_experts: true`) would silently switch
    checks off: each one is a problem (top level and `text_config`)."""
    out = []
    for where, c in (("", config), ("text_config.", config.get("text_config"))):
        if not isinstance(c, dict):
            continue
        for k in _DIM_KEYS:
            if k in c and c[k] is not None and not (_is_int(c[k]) and c[k] > 0):
                out.append(Problem(BAD_VALUE, f"config.json {where}{k} is {c[k]!r}, expected a positive integer"))
    return out
