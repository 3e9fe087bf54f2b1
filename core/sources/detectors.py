"""How each source format is recognised: one detector per kind of signal, named by the rows of the source-format
table (core/sources/source_formats.py), which also give each detector its facts (the quant_algo spellings, the
compressed-tensors format). A detector reads only config files and headers and returns a short reason, or None.
Facts: docs/spec/CHECKPOINT_FORMATS.md §3-§7 and docs/FORMAT.md.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..checkpoint.dtypes import SCALE_DTYPES
from ..checkpoint.tensor_model import Quant, TensorRef
from ..targets.engines import QUANT_METHOD
from .naming import PER_EXPERT, SCHEMES, Scheme, expert_parser

__all__ = ["WEIGHT_SUFFIXES", "ct", "dsv4_native", "mxfp8_ct_experts", "expert_dtype", "gptoss", "hfq_block", "marlin",
           "modelopt_algo", "modelopt_dsv4", "modelopt_hf", "parse_per_expert", "qc_block", "spelling"]

WEIGHT_SUFFIXES = ("weight", "weight_packed")


# ---------------------------------------------------------------------------------------------- signals
def qc_block(config: Mapping) -> dict:
    qc = config.get("quantization_config")
    return qc if isinstance(qc, dict) else {}


def hfq_block(hf_quant_config: Mapping | None) -> dict:
    q = (hf_quant_config or {}).get("quantization")
    return q if isinstance(q, dict) else {}


def _lower(x: object) -> str:
    return x.lower() if isinstance(x, str) else ""


def _upper(x: object) -> str:
    return x.upper() if isinstance(x, str) else ""


def expert_dtype(config: Mapping) -> str:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    for where in (config, qc_block(config), text):
        if where.get("expert_dtype") is not None:
            return _lower(where.get("expert_dtype"))
    return ""


def _ct_formats(qc: Mapping) -> set[str]:
    formats = {_lower(qc.get("format"))}
    groups = qc.get("config_groups")
    if isinstance(groups, dict):
        formats |= {_lower(g.get("format")) for g in groups.values() if isinstance(g, dict)}
    return formats - {""}


def _schemes(*names: str) -> tuple[Scheme, ...]:
    return tuple(s for s in SCHEMES if s.name in names)


_DS = _schemes("deepseek")
_GPTOSS = _schemes("gpt-oss")
_PER_EXPERT = tuple(s for s in SCHEMES if s.layout == PER_EXPERT)
parse_per_expert = expert_parser(_PER_EXPERT)
# ModelOpt's Hugging Face exports: every scheme but DeepSeek-V4's own names and gpt-oss's MXFP4 stacks
_HF = tuple(s for s in SCHEMES if s not in _DS + _GPTOSS)


def _has(tensors: Mapping[str, TensorRef], schemes: tuple[Scheme, ...],
         suffixes: tuple[str, ...] | None = None) -> Scheme | None:
    """The first scheme of `schemes` that spells some tensor (with one of `suffixes`), or None."""
    parse = expert_parser(schemes)
    for name in tensors:
        parsed = parse(name)
        if parsed is not None and (suffixes is None or parsed.suffix in suffixes):
            return parsed.scheme
    return None


def spelling(scheme: Scheme) -> str:
    index = ".E" if scheme.layout == PER_EXPERT else ""
    return f"{scheme.layer_prefixes[0]}.L.{scheme.module}{index}.{'/'.join(scheme.roles)}"


# -------------------------------------------------------------------------------------------- detectors
# Each takes (the table row, config.json, hf_quant_config.json or None, tensors by name).
def marlin(fmt, config, hfq, tensors) -> str | None:
    if qc_block(config).get("quant_method") == QUANT_METHOD:
        return f"config.json quantization_config.quant_method = {QUANT_METHOD} (dsv4-convert output)"
    return _marlin_words(config, tensors)  # a converted checkpoint whose config was lost or edited


def _marlin_words(config, tensors) -> str | None:
    """Marlin output whatever its config says: an expert weight of I32 words [K/16, 2N] with a
    weight_scale [K/g, N] of an FP4 scale dtype. No source format stores its codes so."""
    for name, ref in tensors.items():
        if ref.dtype != "I32" or len(ref.shape) != 2:
            continue
        m = parse_per_expert(name)  # converted checkpoints always use per-expert names
        if m is None or m.suffix != "weight":
            continue
        scale = tensors.get(f"{m.prefix}.weight_scale")
        k, n = ref.shape[0] * 16, ref.shape[1] // 2
        if scale is not None and len(scale.shape) == 2 and scale.shape[1] == n and n and scale.shape[0] and (
                (scale.dtype == "F8_E4M3" and scale.shape[0] * Quant.NVFP4.group_size == k)
                or (scale.dtype in SCALE_DTYPES["mxfp4"] and scale.shape[0] * Quant.MXFP4.group_size == k)):
            qm = qc_block(config).get("quant_method")
            return (f"{name} is Marlin words (I32 {list(ref.shape)}, weight_scale {scale.dtype} "
                    f"{list(scale.shape)}), although config.json quantization_config.quant_method is {qm!r}")
    return None


def _mixed(q: Mapping, algos: frozenset[str]) -> bool:
    """ModelOpt MIXED_PRECISION whose quantized_layers name one of `algos`."""
    layers = q.get("quantized_layers") if isinstance(q.get("quantized_layers"), dict) else {}
    return _upper(q.get("quant_algo")) == "MIXED_PRECISION" and any(
        isinstance(v, dict) and _upper(v.get("quant_algo")) in algos for v in layers.values())


def modelopt_dsv4(fmt, config, hfq, tensors) -> str | None:
    qc, q = qc_block(config), hfq_block(hfq)
    in_config = _lower(qc.get("quant_method")) == "fp8" and _upper(qc.get("moe_quant_algo")) == "NVFP4"
    if (in_config or _mixed(q, fmt.quant_algos)) and _has(tensors, _DS, WEIGHT_SUFFIXES):
        why = "quant_method fp8 + moe_quant_algo NVFP4" if in_config else \
            "hf_quant_config MIXED_PRECISION with NVFP4 quantized_layers"
        return f"{why}, DeepSeek expert names (layers.L.ffn.experts.E.w1/w2/w3)"
    return None


def _modelopt_algo(config, hfq) -> str:
    """quant_algo of a ModelOpt export, upper-cased: config.json's block, else hf_quant_config.json's."""
    qc = qc_block(config)
    return _upper(qc.get("quant_algo") if _lower(qc.get("quant_method")) == "modelopt"
                  else hfq_block(hfq).get("quant_algo"))


def modelopt_hf(fmt, config, hfq, tensors) -> str | None:
    """ModelOpt's generic Hugging Face export: `quant_method modelopt` whatever its algorithm (rows claiming an
    algorithm come first in the table), or hf_quant_config.json naming one of the row's algorithms."""
    qc, q = qc_block(config), hfq_block(hfq)
    signal = None
    if _lower(qc.get("quant_method")) == "modelopt":
        signal = f"quant_method modelopt, quant_algo {qc.get('quant_algo')}"
    elif _upper(q.get("quant_algo")) in fmt.quant_algos or _mixed(q, fmt.quant_algos):
        signal = f"hf_quant_config quant_algo {q.get('quant_algo')}"
    scheme = signal and _has(tensors, _HF, ("weight",))
    if scheme:
        return f"{signal}, {scheme.name} expert names ({spelling(scheme)})"
    return None


def modelopt_algo(fmt, config, hfq, tensors) -> str | None:
    """A ModelOpt export whose quant_algo is one of the row's spellings (ModelOpt's MXFP4 export: 0.47 writes
    `mxfp4`, 0.48 `W4A16_MXFP4`), with Hugging Face expert names."""
    algo = _modelopt_algo(config, hfq)
    scheme = algo in fmt.quant_algos and _has(tensors, _HF, ("weight",))
    if scheme:
        return f"ModelOpt quant_algo {algo.lower()}, {scheme.name} expert names ({spelling(scheme)})"
    return None


def ct(fmt, config, hfq, tensors) -> str | None:
    qc = qc_block(config)
    scheme = _lower(qc.get("quant_method")) == "compressed-tensors" and fmt.ct_format in _ct_formats(qc) and _has(
        tensors, _PER_EXPERT, (fmt.suffixes.weight,))
    if scheme:
        return (f"quant_method compressed-tensors, format {fmt.ct_format}, {fmt.suffixes.weight} expert tensors "
                f"({scheme.name} names)")
    return None


def mxfp8_ct_experts(fmt, config, hfq, tensors) -> str | None:
    """MiniMax-M3.1: `quant_method mxfp8` (MXFP8 linears) whose routed experts are compressed-tensors NVFP4, named by
    `moe_quant_algo` and `moe_quant_format` (the fields vLLM 0.34's ModelOptMxFp8Config.from_config requires)."""
    qc = qc_block(config)
    scheme = (_lower(qc.get("quant_method")) == "mxfp8" and _upper(qc.get("moe_quant_algo")) in fmt.quant_algos
              and _lower(qc.get("moe_quant_format")) == fmt.ct_format
              and _has(tensors, _PER_EXPERT, (fmt.suffixes.weight,)))
    if scheme:
        return (f"quant_method mxfp8 + moe_quant_algo {_upper(qc.get('moe_quant_algo'))} ({fmt.ct_format}), "
                f"{fmt.suffixes.weight} expert tensors ({scheme.name} names)")
    return None


def gptoss(fmt, config, hfq, tensors) -> str | None:
    if _lower(qc_block(config).get("quant_method")) == "mxfp4" and _has(tensors, _GPTOSS):
        return "quant_method mxfp4, stacked *_blocks / *_scales experts (gpt-oss)"
    return None


def dsv4_native(fmt, config, hfq, tensors) -> str | None:
    if expert_dtype(config) == "fp4" and _has(tensors, _DS, ("weight",)):
        return "expert_dtype fp4, DeepSeek expert names with .scale siblings"
    return None
