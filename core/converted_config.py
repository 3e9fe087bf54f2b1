"""The one schema of a converted checkpoint's `quantization_config` (docs/FORMAT.md): the writer builds it
here, and validate, `marlin-to-source` and both engine plugins parse it here, so one rule decides for all.

Parsing is strict and lists every problem at once, each with its error id (docs/ERRORS.md, "Converted
config"): a value of the wrong JSON type is refused, never coerced (`"tp": "2"`, `w4a8: 1`), a layout
tag is checked against its engine, and every container the block names elsewhere (`rescale_factors`,
`tp_layout`) must be in the `experts` map, which the plugins route by.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dsv4_convert.core.engines import (
    ACT_DTYPES,
    ENGINES,
    FORMAT_VERSION,
    LAYOUTS,
    QUANT_METHOD,
    READABLE_FORMAT_VERSIONS,
    engine_facts,
)
from dsv4_convert.core.errors import ContentError
from dsv4_convert.formats.tiles import GROUP_SIZE, OK, PAD, RankTiles, moe_rank_tiles

__all__ = [
    "BAD_VALUE", "EXPERTS_MAP", "LAYOUT", "NOT_OURS", "TP_LAYOUT",
    "ContainerLayout", "ConvertedConfigError", "ConvertedQuantConfig", "Problem", "TpLayout",
    "model_config_problems", "read_tp_layout", "serving_block",
]

# error ids of the refusals (docs/ERRORS.md, section "Converted config")
NOT_OURS = "converted_config.not_ours"  # quant_method / format_version: not a block this version reads
BAD_VALUE = "converted_config.bad_value"  # a field of the wrong type or outside its values
LAYOUT = "converted_config.layout"  # marlin_layout, target_engine and w4a8 contradict each other
EXPERTS_MAP = "converted_config.experts_map"  # a container named elsewhere is missing from `experts`
TP_LAYOUT = "converted_config.tp_layout"  # the --tp/--ep record is malformed or contradicts the tile rule

FORMATS = tuple(GROUP_SIZE)
# formats whose model_type is fixed (blocks of dsv4-convert before `model_type` was recorded)
_MODEL_TYPE_OF_FORMAT = {"mxfp4-dsv4": "deepseek_v4", "nvfp4-modelopt-dsv4": "deepseek_v4", "mxfp4-gptoss": "gpt_oss"}
_LAYOUT_KEYS = ("hidden", "intermediate", "i_shard", "i_pad", "h_pad")
_STACKS = (".w13", ".w2")


@dataclass(frozen=True, slots=True)
class Problem:
    error_id: str
    text: str


class ConvertedConfigError(ContentError, ValueError):
    """The block is not one this tool (or its plugin) can use; `problems` lists every reason."""

    def __init__(self, problems: list[Problem], *, file: str = "config.json"):
        self.problems = problems
        text = "quantization_config refused:\n  - " + "\n  - ".join(f"[{p.error_id}] {p.text}" for p in problems)
        super().__init__(text, error_id=problems[0].error_id, file=file,
                         hint="re-convert the source with this dsv4-convert, or restore the config.json it wrote")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclass(frozen=True, slots=True)
class ContainerLayout:
    """One experts container's per-rank sizes at the recorded split."""
    hidden: int
    intermediate: int
    i_shard: int
    i_pad: int
    h_pad: int
    status: str  # OK | PAD

    def as_dict(self) -> dict:
        return {"hidden": self.hidden, "intermediate": self.intermediate, "i_shard": self.i_shard,
                "i_pad": self.i_pad, "h_pad": self.h_pad, "status": self.status}


@dataclass(frozen=True, slots=True)
class TpLayout:
    """`tp_layout`: the one (TP, EP) a `--tp/--ep` conversion was written for."""
    tp: int
    ep: int
    containers: dict[str, ContainerLayout]

    @classmethod
    def from_tiles(cls, tp: int, ep: int, tiles: dict[str, RankTiles]) -> TpLayout:
        return cls(tp, ep, {c: ContainerLayout(v.hidden, v.intermediate, v.i_shard, v.i_pad, v.h_pad, v.status)
                            for c, v in tiles.items()})

    def as_dict(self) -> dict:
        return {"tp": self.tp, "ep": self.ep, "containers": {c: v.as_dict() for c, v in self.containers.items()}}

    @property
    def padded(self) -> bool:
        return any(c.status == PAD for c in self.containers.values())

    def padded_tiles(self, experts: dict[str, str], engine: str) -> dict[str, RankTiles]:
        """container -> RankTiles of the padded containers, each recomputed with the one tile rule."""
        out = {}
        for name, c in self.containers.items():
            if c.status == PAD:
                out[name] = moe_rank_tiles(experts[name], engine_facts(engine).padding, hidden=c.hidden, intermediate=c.intermediate,
                                           tp=self.tp, ep=self.ep)
        return out


@dataclass(frozen=True, slots=True)
class ConvertedQuantConfig:
    """The block a conversion writes into config.json `quantization_config`."""
    marlin_layout: str
    target_engine: str
    act_dtype: str
    w4a8: bool
    weight_format: str
    group_size: int
    experts: dict[str, str]
    rescale_factors: dict[str, float] = field(default_factory=dict)
    original_quantization_config: dict | None = None
    original_hf_quant_config: dict | None = None
    format_version: int = FORMAT_VERSION
    target_engine_version: str | None = None
    source_format: str | None = None
    model_type: str | None = None  # config.json model_type of the source: engines' method lookup reads it
    layouts: tuple[tuple[int, int], ...] = ()
    tp_layout: TpLayout | None = None
    packed_modules: tuple[str, ...] = ()
    producer: dict | None = None

    def format_of(self, container: str) -> str:
        return self.experts[container]

    @property
    def source_model_type(self) -> str | None:
        """The source's model_type; blocks written before it was recorded name it through their format."""
        return self.model_type or _MODEL_TYPE_OF_FORMAT.get(self.source_format)

    @property
    def padded(self) -> bool:
        """True when some experts container was written padded for the one recorded (TP, EP)."""
        return self.tp_layout is not None and self.tp_layout.padded

    def as_dict(self) -> dict:
        """The JSON object, in the order the writer has always used (docs/FORMAT.md)."""
        out = {
            "quant_method": QUANT_METHOD, "format_version": self.format_version, "producer": self.producer,
            "marlin_layout": self.marlin_layout, "target_engine": self.target_engine,
            "target_engine_version": self.target_engine_version, "act_dtype": self.act_dtype, "w4a8": self.w4a8,
            "source_format": self.source_format, **({"model_type": self.model_type} if self.model_type else {}),
            "weight_format": self.weight_format,
            "group_size": self.group_size, "layouts": [{"tp": tp, "ep": ep} for tp, ep in self.layouts],
        }
        if self.tp_layout is not None:
            out["tp_layout"] = self.tp_layout.as_dict()
        out.update({
            "experts": dict(self.experts), "packed_modules": list(self.packed_modules),
            "rescale_factors": dict(self.rescale_factors),
            "original_quantization_config": self.original_quantization_config,
            "original_hf_quant_config": self.original_hf_quant_config,
        })
        return out

    @classmethod
    def parse(cls, cfg, *, file: str = "config.json") -> ConvertedQuantConfig:
        """The one parser: every problem at once, in one ConvertedConfigError."""
        if not isinstance(cfg, dict):
            raise ConvertedConfigError([Problem(NOT_OURS, "quantization_config must be a JSON object, got "
                                                f"{type(cfg).__name__}")], file=file)
        problems = _problems(cfg)
        if problems:
            raise ConvertedConfigError(problems, file=file)
        layout = cfg["marlin_layout"]
        experts = dict(cfg["experts"])
        tl = cfg.get("tp_layout")
        return cls(
            marlin_layout=layout, target_engine=cfg.get("target_engine", LAYOUTS[layout].name),
            act_dtype=cfg["act_dtype"], w4a8=cfg.get("w4a8", False),
            weight_format=cfg.get("weight_format", next(iter(experts.values()))),
            group_size=cfg.get("group_size", GROUP_SIZE[cfg.get("weight_format", next(iter(experts.values())))]),
            experts=experts, rescale_factors={k: float(v) for k, v in (cfg.get("rescale_factors") or {}).items()},
            original_quantization_config=cfg.get("original_quantization_config"),
            original_hf_quant_config=cfg.get("original_hf_quant_config"),
            format_version=cfg["format_version"], target_engine_version=cfg.get("target_engine_version"),
            source_format=cfg.get("source_format"), model_type=cfg.get("model_type"),
            layouts=tuple((d["tp"], d["ep"]) for d in cfg.get("layouts") or ()),
            tp_layout=None if tl is None else TpLayout(tl["tp"], tl["ep"], {
                n: ContainerLayout(**{k: c[k] for k in (*_LAYOUT_KEYS, "status")})
                for n, c in tl["containers"].items()}),
            packed_modules=tuple(cfg.get("packed_modules") or ()), producer=cfg.get("producer"),
        )


def _problems(cfg: dict) -> list[Problem]:
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
    for key in ("target_engine_version", "source_format", "model_type"):
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
    if not isinstance(rescale, dict) or not all(_is_number(v) and v > 0 for v in rescale.values()):
        bad(BAD_VALUE, "rescale_factors must map '<container>.w13' / '.w2' to positive numbers")
        rescale = {}
    for key in rescale:
        container = next((key[: -len(s)] for s in _STACKS if key.endswith(s)), None)
        if container is None:
            bad(BAD_VALUE, f"rescale_factors key {key!r} does not end in .w13 or .w2")
        elif experts and container not in experts:
            bad(EXPERTS_MAP, f"rescale_factors names {container!r}, which experts does not list (the plugins "
                "would serve that container with the engine's own method and misread its Marlin tensors)")
    for key in ("original_quantization_config", "original_hf_quant_config"):
        v = cfg.get(key)
        if v is not None and not isinstance(v, dict):
            bad(BAD_VALUE, f"{key} must be an object or null, got {type(v).__name__}")
    orig = cfg.get("original_quantization_config")
    if isinstance(orig, dict) and not isinstance(orig.get("quant_method"), str):
        bad(BAD_VALUE, "original_quantization_config must be the source's block (with its quant_method) or null")
    if cfg.get("tp_layout") is not None:
        out += _tp_layout_problems(cfg["tp_layout"], experts, LAYOUTS[layout].name if layout in LAYOUTS else None)
    return out


def _tp_layout_problems(tl, experts: dict, engine: str | None) -> list[Problem]:
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
                _is_int(c.get(k)) and c[k] > 0 for k in _LAYOUT_KEYS):
            out.append(Problem(TP_LAYOUT, f"tp_layout.containers[{name!r}] needs status ok|pad and positive "
                               f"integer {', '.join(_LAYOUT_KEYS)}"))
        elif not out and engine is not None and experts[name] in FORMATS:
            v = moe_rank_tiles(experts[name], engine_facts(engine).padding, hidden=c["hidden"], intermediate=c["intermediate"],
                               tp=tl["tp"], ep=tl["ep"])
            got = (c["status"], c["i_shard"], c["i_pad"], c["h_pad"])
            if got != (v.status, v.i_shard, v.i_pad, v.h_pad):
                out.append(Problem(TP_LAYOUT, f"tp_layout.containers[{name!r}] records (status, i_shard, i_pad, "
                                   f"h_pad) = {got}, the tile rule gives {(v.status, v.i_shard, v.i_pad, v.h_pad)}"))
    return out


# the model dimensions this tool reads from config.json: positive integers when present
_DIM_KEYS = ("hidden_size", "moe_intermediate_size", "intermediate_size", "num_hidden_layers", "n_routed_experts",
             "num_local_experts", "num_experts")


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


def serving_block(spec: ConvertedQuantConfig) -> dict | None:
    """The source's quantisation block the engines would have served the non-expert layers from: both
    read config.json's `quantization_config` and, only when config.json has none, hf_quant_config.json
    (ModelOpt <= 0.29 exports, such as the first nvidia/DeepSeek-R1-FP4)."""
    if spec.original_quantization_config is not None:
        return spec.original_quantization_config
    return spec.original_hf_quant_config


def read_tp_layout(block: dict) -> tuple[int, int, dict[str, RankTiles]] | None:
    """(tp, ep, container -> RankTiles of the padded containers) of a converted block, or None without
    `tp_layout`; ConvertedConfigError (a ValueError) when the block does not parse."""
    if not isinstance(block, dict) or block.get("tp_layout") is None:
        return None
    spec = ConvertedQuantConfig.parse(block)
    tl = spec.tp_layout
    return tl.tp, tl.ep, tl.padded_tiles(spec.experts, spec.target_engine)
