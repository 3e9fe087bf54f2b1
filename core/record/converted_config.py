"""The converted record: what a conversion records about its output, in one object
(ConvertedQuantConfig) that renders all three places it is written, each in the spelling its file allows:
config.json's `quantization_config` (as_dict), every output shard's safetensors `__metadata__`
(shard_metadata: strings only) and the manifest's record fields (manifest_fields). The writer builds it
here, and validate, `marlin-to-source`, `inspect`, `doctor`, the launch planner and both engine plugins
read a converted checkpoint's block only through `parse` (or `converted_record`), so one rule decides
for all (docs/FORMAT.md). Parsing is strict and lists every problem at once, each with its error id:
the rules are core/record/converted_rules.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...formats.tiles import GROUP_SIZE, PAD, RankTiles, moe_rank_tiles
from ..errors import ContentError
from ..files import CONFIG
from ..sources.source_formats import FORMATS, engine_padding
from ..targets.engines import FORMAT_VERSION, LAYOUTS, QUANT_METHOD
from ..targets.target import MarlinTarget
from ..version import __version__
from .converted_rules import LAYOUT_KEYS, NOT_OURS, PRODUCER, Problem, block_problems

__all__ = ["ContainerLayout", "ConvertedConfigError", "ConvertedQuantConfig", "TpLayout",
           "converted_record", "record_or_none", "read_tp_layout", "serving_block"]

class ConvertedConfigError(ContentError, ValueError):
    """The block is not one this tool (or its plugin) can use; `problems` lists every reason."""

    def __init__(self, problems: list[Problem], *, file: str = CONFIG):
        self.problems = problems
        text = "quantization_config refused:\n  - " + "\n  - ".join(f"[{p.error_id}] {p.text}" for p in problems)
        super().__init__(text, error_id=problems[0].error_id, file=file,
                         hint="re-convert the source with this dsv4-convert, or restore the config.json it wrote")


@dataclass(frozen=True, slots=True)
class ContainerLayout:
    """One experts container's per-rank sizes at the recorded split."""
    hidden: int
    intermediate: int
    i_shard: int
    i_pad: int
    h_pad: int
    status: str  # OK | PAD
    gated: bool = True  # the tile rule's w13: gate | up; False (written only then): up alone (Nemotron-H)

    def as_dict(self) -> dict:
        return {"hidden": self.hidden, "intermediate": self.intermediate, "i_shard": self.i_shard,
                "i_pad": self.i_pad, "h_pad": self.h_pad, "status": self.status,
                **({} if self.gated else {"gated": False})}


@dataclass(frozen=True, slots=True)
class TpLayout:
    """`tp_layout`: the one (TP, EP) a `--tp/--ep` conversion was written for."""
    tp: int
    ep: int
    containers: dict[str, ContainerLayout]

    @classmethod
    def from_tiles(cls, tp: int, ep: int, tiles: dict[str, RankTiles]) -> TpLayout:
        return cls(tp, ep, {c: ContainerLayout(v.hidden, v.intermediate, v.i_shard, v.i_pad, v.h_pad, v.status, v.gated)
                            for c, v in tiles.items()})

    def as_dict(self) -> dict:
        return {"tp": self.tp, "ep": self.ep, "containers": {c: v.as_dict() for c, v in self.containers.items()}}

    @property
    def padded(self) -> bool:
        return any(c.status == PAD for c in self.containers.values())

    def padded_tiles(self, experts: dict[str, str], engine: str, source_format: str | None = None) -> dict[str, RankTiles]:
        """container -> RankTiles of the padded containers, each recomputed with the one tile rule (the engine's
        rule for experts read from `source_format`)."""
        out = {}
        for name, c in self.containers.items():
            if c.status == PAD:
                out[name] = moe_rank_tiles(experts[name], engine_padding(engine, source_format), hidden=c.hidden, intermediate=c.intermediate,
                                           tp=self.tp, ep=self.ep, gated=c.gated)
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
    # the source block's `expert_dtype`, kept at the top of the block: vLLM 0.34's DeepseekV41Config reads
    # `quantization_config["expert_dtype"]` into hf_config.expert_dtype, which picks its weight mapper and the
    # dense linears' scale names (models/deepseek_v41/nvidia/model.py _linear_scale_param_name)
    expert_dtype: str | None = None
    layouts: tuple[tuple[int, int], ...] = ()
    tp_layout: TpLayout | None = None
    packed_modules: tuple[str, ...] = ()
    producer_version: str | None = __version__  # None: a block written without `producer`
    # "hf_quant_config.json" where the source's config.json block was stale (core/targets/inner_methods.py stale_block):
    # the plugins serve the non-expert layers from original_hf_quant_config instead
    serves_from: str | None = None

    @property
    def producer(self) -> dict | None:
        return None if self.producer_version is None else {"name": PRODUCER, "version": self.producer_version}

    def shard_metadata(self) -> dict[str, str]:
        """Each output shard's safetensors `__metadata__` (str -> str: the format version as text)."""
        return {"format": "pt", "producer": PRODUCER, "producer_version": self.producer_version or "",
                "format_version": str(self.format_version), "marlin_layout": self.marlin_layout}

    def manifest_fields(self) -> dict:
        """The manifest's record of the conversion (runtime/output/tree.py adds the shards and the fingerprint)."""
        return {"format_version": self.format_version, "producer": self.producer,
                "marlin_layout": self.marlin_layout, "source_format": self.source_format}

    @property
    def target(self) -> MarlinTarget:
        """What the checkpoint was converted for, as the converter's one target object (the parser's rules
        are MarlinTarget's: a parsed record always names a valid one)."""
        return MarlinTarget(self.target_engine, self.act_dtype, self.w4a8)

    def format_of(self, container: str) -> str:
        return self.experts[container]

    @property
    def source_model_type(self) -> str | None:
        """The source's model_type; blocks written before it was recorded name it through their format."""
        row = FORMATS.get(self.source_format)
        return self.model_type or (row.model_type if row else None)

    @property
    def padded(self) -> bool:
        """True when some experts container was written padded for the one recorded (TP, EP)."""
        return self.tp_layout is not None and self.tp_layout.padded

    def split(self) -> tuple[int, int, dict[str, RankTiles]] | None:
        """(tp, ep, container -> RankTiles of the padded containers) of a --tp/--ep output, else None."""
        tl = self.tp_layout
        return None if tl is None else (tl.tp, tl.ep, tl.padded_tiles(self.experts, self.target_engine, self.source_format))

    def as_dict(self) -> dict:
        """The JSON object, in the order the writer has always used (docs/FORMAT.md)."""
        out = {
            "quant_method": QUANT_METHOD, "format_version": self.format_version, "producer": self.producer,
            "marlin_layout": self.marlin_layout, "target_engine": self.target_engine,
            "target_engine_version": self.target_engine_version, "act_dtype": self.act_dtype, "w4a8": self.w4a8,
            "source_format": self.source_format, **({"model_type": self.model_type} if self.model_type else {}),
            **({"expert_dtype": self.expert_dtype} if self.expert_dtype else {}),
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
        if self.serves_from is not None:
            out["serves_from"] = self.serves_from
        return out

    @classmethod
    def parse(cls, cfg, *, file: str = CONFIG) -> ConvertedQuantConfig:
        """The one parser: every problem at once, in one ConvertedConfigError."""
        if not isinstance(cfg, dict):
            raise ConvertedConfigError([Problem(NOT_OURS, "quantization_config must be a JSON object, got "
                                                f"{type(cfg).__name__}")], file=file)
        problems = block_problems(cfg)
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
            expert_dtype=cfg.get("expert_dtype"),
            layouts=tuple((d["tp"], d["ep"]) for d in cfg.get("layouts") or ()),
            tp_layout=None if tl is None else TpLayout(tl["tp"], tl["ep"], {
                n: ContainerLayout(**{k: c[k] for k in (*LAYOUT_KEYS, "status")}, gated=c.get("gated", True))
                for n, c in tl["containers"].items()}),
            packed_modules=tuple(cfg.get("packed_modules") or ()),
            producer_version=(cfg.get("producer") or {}).get("version"), serves_from=cfg.get("serves_from"),
        )


def converted_record(config: dict, *, file: str = CONFIG) -> ConvertedQuantConfig:
    """The record of a converted checkpoint, from its config.json: the one way to read it
    (ConvertedConfigError, a ContentError, lists every problem)."""
    return ConvertedQuantConfig.parse(config.get("quantization_config") if isinstance(config, dict) else None,
                                      file=file)


def record_or_none(config: dict) -> ConvertedQuantConfig | None:
    """The record, or None where the block does not parse: for the readers that go on without it
    (validate's marlin.config check names every problem; the launch planner and doctor say it)."""
    try:
        return converted_record(config)
    except ConvertedConfigError:
        return None


def serving_block(spec: ConvertedQuantConfig) -> dict | None:
    """The source's quantisation block the engines would have served the non-expert layers from: both
    read config.json's `quantization_config` and, only when config.json has none, hf_quant_config.json
    (ModelOpt <= 0.29 exports, such as the first nvidia/DeepSeek-R1-FP4), or where the converter found config.json's
    block stale (`serves_from`: nvidia/DeepSeek-V3-0324-FP4), the hf_quant_config.json one."""
    if spec.original_quantization_config is not None and spec.serves_from is None:
        return spec.original_quantization_config
    return spec.original_hf_quant_config


def read_tp_layout(config: dict) -> tuple[int, int, dict[str, RankTiles]] | None:
    """(tp, ep, container -> RankTiles of the padded containers) of a converted checkpoint's config.json,
    or None when its block records no `tp_layout`; ConvertedConfigError (a ValueError) when the block
    does not parse."""
    block = config.get("quantization_config") if isinstance(config, dict) else None
    if not isinstance(block, dict) or block.get("tp_layout") is None:
        return None
    return converted_record(config).split()
