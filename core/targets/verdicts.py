"""The verdict on one checkpoint, per engine or engine release: served through the plugin, or why not (the one
served table, core/targets/served.py, and what a conversion records). `inspect` shows it per release, `plan` per engine."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..record.converted_config import record_or_none, serving_block
from ..sources.source_formats import FORMATS
from .served import ENGINE_VERSIONS, refusal, source_block

__all__ = ["checkpoint_refusal", "verdict", "verdicts"]

# a conversion whose block does not parse: both plugins read it through the same strict parser, and refuse it
UNREADABLE_RECORD = ("its quantization_config is not a dsv4-convert record the plugins accept "
                     "(`dsv4-convert validate` lists every problem)")


def checkpoint_refusal(config: Mapping, hf_quant_config: Mapping | None, source_format: str, engine: str,
                       tensor_names: Iterable[str] = ()) -> str | None:
    """`refusal` for a source checkpoint or for a conversion (a `converted` row of the format table), whose record
    (read by its one parser) names its source's format and the block the engines serve the other layers from
    (core/record/converted_config.py serving_block). `plan` asks this for each engine."""
    row = FORMATS.get(source_format)
    if row is None or not row.converted:
        return refusal(config, source_format, engine, source_block(config, hf_quant_config), tensor_names=tensor_names)
    record = record_or_none(dict(config))
    if record is None:
        return UNREADABLE_RECORD
    return refusal(config, record.source_format or "unknown", engine, serving_block(record), tensor_names=tensor_names)


def verdict(config: Mapping, hf_quant_config: Mapping | None, source_format: str, engine: str,
            tensor_names: Iterable[str] = ()) -> str | None:
    """`checkpoint_refusal`, and for a conversion first its layout: it is served only by the engine it was
    written for (the other plugin refuses its layout). `engine`: a name or a release key. `plan` asks this."""
    row = FORMATS.get(source_format)
    record = record_or_none(dict(config)) if row is not None and row.converted else None
    name = engine.split(" ", 1)[0]
    if record is not None and name != record.target_engine:
        return (f"converted for {record.target_engine}: the {name} plugin refuses another engine's layout "
                f"(convert the source with --target {name})")
    return checkpoint_refusal(config, hf_quant_config, source_format, engine, tensor_names)


def verdicts(config: Mapping, hf_quant_config: Mapping | None, source_format: str,
             tensor_names: Iterable[str] = ()) -> dict[str, str | None]:
    """`verdict` per engine release whose proofs ran (ENGINE_VERSIONS): None where served. `inspect` shows it."""
    names = tuple(tensor_names)
    return {key: verdict(config, hf_quant_config, source_format, key, names) for key in ENGINE_VERSIONS}
