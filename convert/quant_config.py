"""The converted record of a conversion (core/record/converted_config.py renders it: the config block, the
shards' metadata, the manifest's fields) and the config rewrites."""

from __future__ import annotations

import json

from ..core.checkpoint.index import natural_key
from ..core.checkpoint.tensor_model import Quant
from ..core.record.converted_config import ConvertedQuantConfig, TpLayout
from ..core.targets.inner_methods import HF_QUANT_CONFIG_BLOCK, stale_block
from .plan import ConvertPlan

__all__ = ["build_record", "rewrite_config", "rewrite_hf_quant_config"]


def _pattern(key: str) -> str:
    return ".".join("*" if part.isdigit() else part for part in key.split("."))


def build_record(plan: ConvertPlan, rescale_factors: dict[str, float]) -> ConvertedQuantConfig:
    """The record of this conversion, built once per run (before the shards: their metadata is part of it)."""
    original = plan.checkpoint.config.get("quantization_config")
    original_hf = plan.checkpoint.hf_quant_config
    projections = plan.projections
    experts = {p.container: p.quant.value for p in projections}
    main = plan.checkpoint.routed_quant or Quant.NVFP4
    t = plan.target
    by_name = lambda kv: natural_key(kv[0])  # noqa: E731 - the sort key of every map in the block
    block = ConvertedQuantConfig(
        marlin_layout=t.layout_tag, target_engine=t.engine, target_engine_version=t.engine_version,
        act_dtype=t.act_dtype, w4a8=t.w4a8, source_format=plan.checkpoint.format.value,
        model_type=plan.checkpoint.config.get("model_type") if isinstance(plan.checkpoint.config.get("model_type"), str)
        else None,
        expert_dtype=original.get("expert_dtype") if isinstance(original, dict)
        and isinstance(original.get("expert_dtype"), str) else None,
        weight_format=main.value, group_size=main.group_size,
        # the (TP, EP) splits whose per-rank shapes the engine does not pad: the plugin slices them (format 2)
        layouts=tuple(plan.layouts),
        # --tp/--ep: the one split written for, and each container's per-rank sizes (docs/FORMAT.md)
        tp_layout=None if plan.tp_layout is None else TpLayout.from_tiles(
            *plan.tp_layout, dict(sorted(plan.rank_tiles.items(), key=by_name))),
        experts=dict(sorted(experts.items(), key=by_name)),
        packed_modules=tuple(sorted({_pattern(p.key) for p in projections})),
        rescale_factors=dict(sorted(rescale_factors.items(), key=by_name)),
        original_quantization_config=original, original_hf_quant_config=original_hf,
        serves_from=HF_QUANT_CONFIG_BLOCK if stale_block(original, original_hf) else None,
    )
    return block


def rewrite_config(config: dict, record: ConvertedQuantConfig, *, ple_storage: str | None = None) -> str:
    """config.json with the converted record; `ple_storage` (core/sources/side_tables.py) is written as the text
    config's `ple_embedding_dtype` where the source leaves it to the quantisation config's class."""
    out = dict(config)
    out["quantization_config"] = record.as_dict()
    if ple_storage is not None:
        text = dict(out["text_config"]) if isinstance(out.get("text_config"), dict) else out
        if text.get("ple_embedding_dtype") is None:
            text["ple_embedding_dtype"] = ple_storage
        if text is not out:
            out["text_config"] = text
    return json.dumps(out, indent=2) + "\n"


def rewrite_hf_quant_config(hf: dict, record: ConvertedQuantConfig) -> str:
    return json.dumps({"producer": record.producer, "quantization": record.as_dict(), "original": hf},
                      indent=2) + "\n"
