"""The verdict on one checkpoint, per engine or engine release: served through the plugin, or why not (the one
served table, core/targets/served.py, and what a conversion records). `inspect` shows it per release, `plan` per engine."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..sources.source_formats import FORMATS
from .served import ENGINE_VERSIONS, refusal, source_block

__all__ = ["checkpoint_refusal", "verdict", "verdicts"]


def checkpoint_refusal(config: Mapping, hf_quant_config: Mapping | None, source_format: str, engine: str,
                       tensor_names: Iterable[str] = ()) -> str | None:
    """`refusal` for a source checkpoint or for a conversion (a `converted` row of the format table), whose record names its
    source's format and blocks (core/record/converted_config.py serving_block: config.json's block, else the
    hf_quant_config.json one). `plan` asks this for each engine."""
    qc = config.get("quantization_config")
    row = FORMATS.get(source_format)
    if row is None or not row.converted or not isinstance(qc, dict):
        return refusal(config, source_format, engine, source_block(config, hf_quant_config), tensor_names=tensor_names)
    block = None if qc.get("serves_from") else qc.get("original_quantization_config")  # serving_block's choice
    block = block if block is not None else qc.get("original_hf_quant_config")
    return refusal(config, str(qc.get("source_format") or "unknown"), engine, block, tensor_names=tensor_names)


def verdict(config: Mapping, hf_quant_config: Mapping | None, source_format: str, engine: str,
            tensor_names: Iterable[str] = ()) -> str | None:
    """`checkpoint_refusal`, and for a conversion first its layout: it is served only by the engine it was
    written for (the other plugin refuses its layout). `engine`: a name or a release key. `plan` asks this."""
    qc = config.get("quantization_config")
    row = FORMATS.get(source_format)
    target = qc.get("target_engine") if row is not None and row.converted and isinstance(qc, dict) else None
    name = engine.split(" ", 1)[0]
    if target and name != target:
        return (f"converted for {target}: the {name} plugin refuses another engine's layout "
                f"(convert the source with --target {name})")
    return checkpoint_refusal(config, hf_quant_config, source_format, engine, tensor_names)


def verdicts(config: Mapping, hf_quant_config: Mapping | None, source_format: str,
             tensor_names: Iterable[str] = ()) -> dict[str, str | None]:
    """`verdict` per engine release whose proofs ran (ENGINE_VERSIONS): None where served. `inspect` shows it."""
    names = tuple(tensor_names)
    return {key: verdict(config, hf_quant_config, source_format, key, names) for key in ENGINE_VERSIONS}
