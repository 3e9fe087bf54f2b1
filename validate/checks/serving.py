"""Will the engine resolve every layer of this checkpoint to a method that can load it? From the config
files, the tensor headers and the engine-facts table alone (no engine import): the source's own
quantisation block against hf_quant_config.json, and, for a converted checkpoint, the method the target
engine builds for the non-expert layers (core/targets/inner_methods.py mirrors its lookup)."""

from __future__ import annotations

from collections.abc import Iterator

from ...core.record.converted_config import ConvertedConfigError, converted_record, serving_block
from ...core.sources.source_formats import FORMATS
from ...core.targets.engine_config import fix_hint, source_load_refusal
from ...core.targets.engines import ENGINES, engine_inner_method
from ...core.targets.inner_methods import FP4_METHODS, HF_QUANT_CONFIG_BLOCK, stale_block
from ...core.targets.served import refusal
from ..check import Finding, Scope, Severity, check
from ..inputs import CheckpointInput, Options

__all__ = ["engine_config_keys", "inner_method_resolves", "stale_quant_block", "w4a8_releases"]

_QUANTISED = {"U8", "I8", "F8_E4M3", "F8_E5M2"}  # a 2-D `.weight` of these dtypes is not 16-bit


def _algo(block) -> str | None:
    if not isinstance(block, dict):
        return None
    inner = block.get("quantization") if isinstance(block.get("quantization"), dict) else block
    algo = inner.get("quant_algo")
    return str(algo).upper() if algo else None


def _blocks(c: CheckpointInput) -> tuple[str, dict | None, dict | None]:
    """(where, config.json's block, hf_quant_config.json) of the source; for a converted checkpoint,
    the ones it recorded from its source."""
    qc = c.config.get("quantization_config")
    if c.checkpoint is not None and c.checkpoint.format.converted and isinstance(qc, dict):
        return ("quantization_config.original_quantization_config / original_hf_quant_config",
                qc.get("original_quantization_config"), qc.get("original_hf_quant_config"))
    return "config.json quantization_config / hf_quant_config.json", qc, c.hf_quant_config


@check(id="structure.quant_config.stale_block", severity=Severity.ERROR, scope=Scope.CHECKPOINT,
       hint="delete config.json's stale quantization_config (both engines then read hf_quant_config.json), or "
            "replace it with hf_quant_config.json's `quantization` block and quant_method modelopt; then convert again")
def stale_quant_block(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """Both engines read config.json's quantisation block and ignore hf_quant_config.json when it exists; a block left over from the model before FP4 export (nvidia/DeepSeek-V3-0324-FP4 keeps block FP8) makes them build FP8 methods for FP4 layers."""
    where, block, hf = _blocks(c)
    qc = c.config.get("quantization_config")
    if isinstance(qc, dict) and qc.get("serves_from") == HF_QUANT_CONFIG_BLOCK:
        return  # a conversion that serves from hf_quant_config.json (the converter replaced the stale block)
    file_algo = _algo(hf)
    if not isinstance(block, dict) or file_algo is None:
        return
    declared = _algo(block) or str(block.get("quant_method", "")).upper()
    stale = stale_block(block, hf)
    if stale:
        yield Finding("config.json", f"{where}: config.json's block says {declared} "
                      f"(quant_method {block.get('quant_method')!r}), hf_quant_config.json says quant_algo {file_algo}. "
                      "vLLM and SGLang use config.json's block and serve every non-expert layer with its method, "
                      "so FP4 layers would be built as FP8 (or the reverse).", file="config.json")


def _record(c: CheckpointInput):
    """A converted checkpoint's record, or None: not converted, or a record marlin.config reports."""
    if c.checkpoint is None or not c.checkpoint.format.converted:
        return None
    try:
        return converted_record(c.config)
    except ConvertedConfigError:
        return None


def _quantised_linears(c: CheckpointInput) -> list[str]:
    return [t.name for t in c.checkpoint.passthrough
            if t.name.endswith(".weight") and len(t.shape) == 2 and t.dtype in _QUANTISED]


@check(id="marlin.serving_methods", severity=Severity.ERROR, scope=Scope.CHECKPOINT,
       hint="serve the source unconverted, or convert a source the README's support matrix lists as served (run "
            "`dsv4-convert doctor` on the launch machine to ask the installed engine itself); a wrong block in the "
            "source: fix it and convert again")
def inner_method_resolves(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """The plugin serves the routed experts and hands every other layer to the method the engine builds from the source's own block; the family, source format and that method must be proven for the engine (core/targets/served.py), and the method must match the layers' tensors."""
    if (spec := _record(c)) is None:
        return
    engine = ENGINES[spec.target_engine]
    block = serving_block(spec)
    method = engine_inner_method(engine.name, block, spec.source_model_type)
    why = refusal(c.config, spec.source_format or "unknown", engine.name, block, tensor_names=c.checkpoint.tensors)
    if why is not None:
        row = FORMATS.get(spec.source_format)  # its routed experts' FP4 format names the converter that refuses it
        quant = row.trunk or (next(iter(row.quants)) if len(row.quants) == 1 else None) if row else None
        command = f"`dsv4-convert {quant.convert_command}`" if quant else "the converter"
        yield Finding("config.json", f"the {engine.name} plugin is not proven to serve this checkpoint: {why} "
                      f"(core/targets/served.py; {command} refuses the same source).", file="config.json")
    quantised = _quantised_linears(c)
    if method is None:
        if quantised:
            yield Finding(quantised[0], f"{len(quantised)} non-expert linear weights are quantised "
                          f"({', '.join(sorted({t.dtype for t in c.checkpoint.passthrough if t.name in quantised}))}) "
                          "but the source recorded no quantisation block: the engine would build 16-bit layers "
                          "for them.", count=len(quantised))
        return
    fp4 = [n for n in quantised if next(t for t in c.checkpoint.passthrough if t.name == n).dtype == "U8"]
    if fp4 and method not in FP4_METHODS:
        yield Finding(fp4[0], f"{len(fp4)} non-expert linear weights are packed FP4, but {engine.name} builds "
                      f"{method!r} for them (an FP8 / 16-bit method): the load fails or reads garbage.",
                      count=len(fp4))


@check(id="marlin.w4a8_releases", severity=Severity.WARNING, scope=Scope.CHECKPOINT,
       hint="serve it with a release listed, or convert the source again without --w4a8 (W4A16 serves on every "
            "release)")
def w4a8_releases(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """A W4A8 (fp8 activations) checkpoint is served only by the engine releases with W4A8 Marlin (the engine table: vLLM 0.33, not 0.34, which removed it); the others refuse it at load."""
    if (spec := _record(c)) is None:
        return
    engine = ENGINES[spec.target_engine]
    if spec.w4a8:
        refused = [r.key for r in engine.releases if not r.w4a8]
        yield Finding("config.json", f"W4A8 checkpoint: served only by {engine.w4a8_versions()}; "
                      f"{', '.join(refused) or 'no release'} refuse{'s' if len(refused) == 1 else ''} it at load "
                      "(no W4A8 Marlin).", file="config.json")


@check(id="source.engine_config", severity=Severity.ERROR, scope=Scope.CHECKPOINT,
       hint="add the missing keys to config.json with the values of the model's release (the finding names them), "
            "then validate again; a model pruned per layer: the finding says what to serve instead")
def engine_config_keys(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """An engine that cannot build the source's model from its config.json serves neither the source nor any conversion of it (which keeps that config): some producers' exports lack keys the engines read (core/targets/engine_config.py)."""
    names = c.checkpoint.tensors if c.checkpoint is not None else ()
    # a source, for every engine; a conversion, for its target engine alone
    for engine in ENGINES if (spec := _record(c)) is None else (spec.target_engine,):
        if why := source_load_refusal(c.config, engine, names):
            yield Finding("config.json", f"{engine} cannot build or load this model: {why}. "
                          f"{fix_hint(c.config, engine, names)}.", file="config.json")
