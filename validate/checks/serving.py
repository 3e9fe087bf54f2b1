"""Will the engine resolve every layer of this checkpoint to a method that can load it? From the config
files, the tensor headers and the engine-facts table alone (no engine import): the source's own
quantisation block against hf_quant_config.json, and, for a converted checkpoint, the method the target
engine builds for the non-expert layers (core/inner_methods.py mirrors its lookup)."""

from __future__ import annotations

from collections.abc import Iterator

from dsv4_convert.core.converted_config import ConvertedConfigError, converted_record, serving_block
from dsv4_convert.core.engines import ENGINES
from dsv4_convert.core.inner_methods import FP4_METHODS, engine_inner_method
from dsv4_convert.core.tensor_model import SourceFormat
from dsv4_convert.validate.check import Finding, Scope, Severity, check
from dsv4_convert.validate.inputs import CheckpointInput, Options

__all__ = ["inner_method_resolves", "stale_quant_block"]

_FP4_ALGOS = ("NVFP4", "FP4", "W4A16_NVFP4", "NVFP4_AWQ", "MIXED_PRECISION")
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
    if c.checkpoint is not None and c.checkpoint.format is SourceFormat.MARLIN and isinstance(qc, dict):
        return ("quantization_config.original_quantization_config / original_hf_quant_config",
                qc.get("original_quantization_config"), qc.get("original_hf_quant_config"))
    return "config.json quantization_config / hf_quant_config.json", qc, c.hf_quant_config


@check(id="structure.quant_config.stale_block", severity=Severity.ERROR, scope=Scope.CHECKPOINT,
       hint="delete config.json's stale quantization_config (both engines then read hf_quant_config.json), or "
            "replace it with hf_quant_config.json's `quantization` block and quant_method modelopt; then convert again")
def stale_quant_block(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """Both engines read config.json's quantisation block and ignore hf_quant_config.json when it exists; a block left over from the model before FP4 export (nvidia/DeepSeek-V3-0324-FP4 keeps block FP8) makes them build FP8 methods for FP4 layers."""
    where, block, hf = _blocks(c)
    file_algo = _algo(hf)
    if not isinstance(block, dict) or file_algo is None:
        return
    block_algo = _algo(block)
    declared = block_algo or str(block.get("quant_method", "")).upper()
    stale = block_algo != file_algo if block_algo else (
        file_algo in _FP4_ALGOS and not str(block.get("quant_method", "")).lower().startswith(("modelopt", "compressed")))
    if stale:
        yield Finding("config.json", f"{where}: config.json's block says {declared} "
                      f"(quant_method {block.get('quant_method')!r}), hf_quant_config.json says quant_algo {file_algo}. "
                      "vLLM and SGLang use config.json's block and serve every non-expert layer with its method, "
                      "so FP4 layers would be built as FP8 (or the reverse).", file="config.json")


def _proven(engine) -> str:
    return ", ".join(sorted(f"{m} ({t or 'any model'})" for m, t in engine.inner_methods))


def _quantised_linears(c: CheckpointInput) -> list[str]:
    return [t.name for t in c.checkpoint.passthrough
            if t.name.endswith(".weight") and len(t.shape) == 2 and t.dtype in _QUANTISED]


@check(id="marlin.serving_methods", severity=Severity.ERROR, scope=Scope.CHECKPOINT,
       hint="convert from a source whose quantisation block the engine resolves (run `dsv4-convert doctor` on "
            "the launch machine to ask the installed engine itself), or fix the source's block and convert again")
def inner_method_resolves(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """The plugin serves the routed experts and hands every other layer to the method the engine builds from the source's own block; that method must exist in the engine, be one the plugin was proven with, and match the layers' tensors."""
    if c.checkpoint is None or c.checkpoint.format is not SourceFormat.MARLIN:
        return
    try:
        spec = converted_record(c.config)
    except ConvertedConfigError:
        return  # marlin.config reports it
    engine = ENGINES[spec.target_engine]
    block = serving_block(spec)
    method = engine_inner_method(engine.name, block, spec.source_model_type)
    quantised = _quantised_linears(c)
    if method is None:
        if quantised:
            yield Finding(quantised[0], f"{len(quantised)} non-expert linear weights are quantised "
                          f"({', '.join(sorted({t.dtype for t in c.checkpoint.passthrough if t.name in quantised}))}) "
                          "but the source recorded no quantisation block: the engine would build 16-bit layers "
                          "for them.", count=len(quantised))
        return
    if not engine.serves_inner(method, spec.source_model_type):
        yield Finding("config.json", f"{engine.name} resolves the source's block ({spec.source_model_type}) to "
                      f"{method!r}; the plugin hands non-expert layers only to {_proven(engine)} (each proven "
                      f"with {engine.name}'s code), so this checkpoint is not known to load.", file="config.json")
    fp4 = [n for n in quantised if next(t for t in c.checkpoint.passthrough if t.name == n).dtype == "U8"]
    if fp4 and method not in FP4_METHODS:
        yield Finding(fp4[0], f"{len(fp4)} non-expert linear weights are packed FP4, but {engine.name} builds "
                      f"{method!r} for them (an FP8 / 16-bit method): the load fails or reads garbage.",
                      count=len(fp4))
