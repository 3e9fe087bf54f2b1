"""Source-format detection (ordered detectors, most specific first); grouping of the expert tensors
into FP4 Projections is core/grouping.py. Facts: docs/spec/CHECKPOINT_FORMATS.md §3-§7 and docs/FORMAT.md.

Only headers and config files are used. Grouping decides each projection's quant from the tensors
actually present (a ModelOpt DeepSeek-V4 NVFP4 checkpoint keeps its MTP experts in MXFP4), checks
scale shapes against the weight, and leaves structural gaps (a missing w3, a missing expert) to the
validator. Tensors whose weight is not packed FP4 (FP8 experts of a Base model, shared experts,
attention) are never grouped, so their FP8 `.scale` tensors stay passthrough.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from .dtypes import SCALE_DTYPES, WEIGHT_DTYPES
from .engines import QUANT_METHOD
from .errors import ContentError
from .naming import (
    PER_EXPERT,
    SCHEMES,
    Scheme,
    expert_parser,
    first_expert_like,
    logical_k,
    parse_expert_name,
    unknown_part,
)
from .tensor_model import Quant, SourceFormat, TensorRef

__all__ = ["ALLOWED_QUANTS", "DETECTORS", "declared_group_size", "detect_format"]

_WEIGHT_SUFFIXES = ("weight", "weight_packed")
_NVFP4_ALGOS = {"NVFP4", "W4A16_NVFP4", "NVFP4_AWQ", "W4A8_NVFP4_FP8", "NVFP4_SVD"}
# ModelOpt 0.47 writes its MXFP4 export's algorithm lower-case, `"quant_algo": "mxfp4"`, in both config files
# (modelopt/torch/export/quant_utils.py process_layer_quant_config: `{"quant_algo": v}` for "mxfp4")
_MXFP4_ALGOS = {"MXFP4", "W4A8_MXFP4_FP8"}


# ---------------------------------------------------------------------------------------------- signals
def _qc(config: Mapping) -> dict:
    qc = config.get("quantization_config")
    return qc if isinstance(qc, dict) else {}


def _hfq(hf_quant_config: Mapping | None) -> dict:
    q = (hf_quant_config or {}).get("quantization")
    return q if isinstance(q, dict) else {}


def _lower(x: object) -> str:
    return x.lower() if isinstance(x, str) else ""


def _upper(x: object) -> str:
    return x.upper() if isinstance(x, str) else ""


def _expert_dtype(config: Mapping) -> str:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    for where in (config, _qc(config), text):
        if where.get("expert_dtype") is not None:
            return _lower(where.get("expert_dtype"))
    return ""


def _ct_formats(qc: Mapping) -> set[str]:
    formats = {_lower(qc.get("format"))}
    groups = qc.get("config_groups")
    if isinstance(groups, dict):
        formats |= {_lower(g.get("format")) for g in groups.values() if isinstance(g, dict)}
    return formats - {""}


def declared_group_size(config: Mapping, hf_quant_config: Mapping | None) -> tuple[int, str] | None:
    """The FP4 group size the config files declare, and where, or None."""
    hfq = _hfq(hf_quant_config)
    if isinstance(hfq.get("group_size"), int):
        return hfq["group_size"], "hf_quant_config.json quantization.group_size"
    qc = _qc(config)
    if isinstance(qc.get("group_size"), int):
        return qc["group_size"], "config.json quantization_config.group_size"
    groups = qc.get("config_groups")
    if isinstance(groups, dict):
        for gname, g in groups.items():
            w = g.get("weights") if isinstance(g, dict) else None
            if isinstance(w, dict) and isinstance(w.get("group_size"), int):
                return w["group_size"], f"config.json quantization_config.config_groups.{gname}.weights.group_size"
    return None


def _schemes(*names: str) -> tuple[Scheme, ...]:
    return tuple(s for s in SCHEMES if s.name in names)


_DS = _schemes("deepseek")
_GPTOSS = _schemes("gpt-oss")
_PER_EXPERT = tuple(s for s in SCHEMES if s.layout == PER_EXPERT)
_PARSE_PER_EXPERT = expert_parser(_PER_EXPERT)
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


# -------------------------------------------------------------------------------------------- detectors
def _marlin(config, hfq, tensors) -> str | None:
    if _qc(config).get("quant_method") == QUANT_METHOD:
        return f"config.json quantization_config.quant_method = {QUANT_METHOD} (dsv4-convert output)"
    return _marlin_words(config, tensors)  # a converted checkpoint whose config was lost or edited


def _marlin_words(config, tensors) -> str | None:
    """Marlin output whatever its config says: an expert weight of I32 words [K/16, 2N] with a
    weight_scale [K/g, N] of an FP4 scale dtype. No source format stores its codes so."""
    for name, ref in tensors.items():
        if ref.dtype != "I32" or len(ref.shape) != 2:
            continue
        m = _PARSE_PER_EXPERT(name)  # converted checkpoints always use per-expert names
        if m is None or m.suffix != "weight":
            continue
        scale = tensors.get(f"{m.prefix}.weight_scale")
        k, n = ref.shape[0] * 16, ref.shape[1] // 2
        if scale is not None and len(scale.shape) == 2 and scale.shape[1] == n and n and scale.shape[0] and (
                (scale.dtype == "F8_E4M3" and scale.shape[0] * Quant.NVFP4.group_size == k)
                or (scale.dtype in SCALE_DTYPES["mxfp4"] and scale.shape[0] * Quant.MXFP4.group_size == k)):
            qm = _qc(config).get("quant_method")
            return (f"{name} is Marlin words (I32 {list(ref.shape)}, weight_scale {scale.dtype} "
                    f"{list(scale.shape)}), although config.json quantization_config.quant_method is {qm!r}")
    return None


def _modelopt_dsv4(config, hfq, tensors) -> str | None:
    qc, q = _qc(config), _hfq(hfq)
    in_config = _lower(qc.get("quant_method")) == "fp8" and _upper(qc.get("moe_quant_algo")) == "NVFP4"
    in_hfq = _mixed_nvfp4(q)
    if (in_config or in_hfq) and _has(tensors, _DS, _WEIGHT_SUFFIXES):
        why = "quant_method fp8 + moe_quant_algo NVFP4" if in_config else \
            "hf_quant_config MIXED_PRECISION with NVFP4 quantized_layers"
        return f"{why}, DeepSeek expert names (layers.L.ffn.experts.E.w1/w2/w3)"
    return None


def _modelopt_algo(config, hfq) -> str:
    """quant_algo of a ModelOpt export, upper-cased: config.json's block, else hf_quant_config.json's."""
    qc = _qc(config)
    return _upper(qc.get("quant_algo") if _lower(qc.get("quant_method")) == "modelopt" else _hfq(hfq).get("quant_algo"))


def _modelopt_hf(config, hfq, tensors) -> str | None:
    qc, q = _qc(config), _hfq(hfq)
    signal = None
    if _modelopt_algo(config, hfq) in _MXFP4_ALGOS:
        return None  # _modelopt_mxfp4's
    if _lower(qc.get("quant_method")) == "modelopt":
        signal = f"quant_method modelopt, quant_algo {qc.get('quant_algo')}"
    elif _upper(q.get("quant_algo")) in _NVFP4_ALGOS or _mixed_nvfp4(q):
        signal = f"hf_quant_config quant_algo {q.get('quant_algo')}"
    scheme = signal and _has(tensors, _HF, ("weight",))
    if scheme:
        return f"{signal}, {scheme.name} expert names ({_spelling(scheme)})"
    return None


def _modelopt_mxfp4(config, hfq, tensors) -> str | None:
    """ModelOpt's MXFP4 export (MXFP4_DEFAULT_CFG, MXFP4_MLP_WEIGHT_ONLY_CFG): `<p>.weight` U8 [N, K/2] and
    `<p>.weight_scale` U8 [N, K/32] holding E8M0 exponent bits (modelopt/torch/quantization/qtensor/mxfp4_tensor.py
    MXFP4QTensor.quantize; checked on exports made by ModelOpt 0.47.0, tests/fixtures/producers)."""
    algo = _modelopt_algo(config, hfq)
    scheme = algo in _MXFP4_ALGOS and _has(tensors, _HF, ("weight",))
    if scheme:
        return f"ModelOpt quant_algo {algo.lower()}, {scheme.name} expert names ({_spelling(scheme)})"
    return None


def _mixed_nvfp4(q: Mapping) -> bool:
    layers = q.get("quantized_layers") if isinstance(q.get("quantized_layers"), dict) else {}
    return _upper(q.get("quant_algo")) == "MIXED_PRECISION" and any(
        isinstance(v, dict) and _upper(v.get("quant_algo")) in _NVFP4_ALGOS for v in layers.values())


def _spelling(scheme: Scheme) -> str:
    index = ".E" if scheme.layout == PER_EXPERT else ""
    return f"{scheme.layer_prefixes[0]}.L.{scheme.module}{index}.{'/'.join(scheme.roles)}"


def _ct(fmt: str) -> Callable:
    def detector(config, hfq, tensors) -> str | None:
        qc = _qc(config)
        scheme = _lower(qc.get("quant_method")) == "compressed-tensors" and fmt in _ct_formats(qc) and _has(
            tensors, _PER_EXPERT, ("weight_packed",))
        if scheme:
            return f"quant_method compressed-tensors, format {fmt}, weight_packed expert tensors ({scheme.name} names)"
        return None
    return detector


def _gptoss(config, hfq, tensors) -> str | None:
    if _lower(_qc(config).get("quant_method")) == "mxfp4" and _has(tensors, _GPTOSS):
        return "quant_method mxfp4, stacked *_blocks / *_scales experts (gpt-oss)"
    return None


def _dsv4_native(config, hfq, tensors) -> str | None:
    if _expert_dtype(config) == "fp4" and _has(tensors, _DS, ("weight",)):
        return "expert_dtype fp4, DeepSeek expert names with .scale siblings"
    return None


# Explicit and ordered: most specific first. The first detector that returns a reason wins.
DETECTORS: tuple[tuple[SourceFormat, Callable], ...] = (
    (SourceFormat.MARLIN, _marlin),
    (SourceFormat.NVFP4_MODELOPT_DSV4, _modelopt_dsv4),
    (SourceFormat.NVFP4_MODELOPT_HF, _modelopt_hf),
    (SourceFormat.MXFP4_MODELOPT_HF, _modelopt_mxfp4),
    (SourceFormat.NVFP4_CT, _ct("nvfp4-pack-quantized")),
    (SourceFormat.MXFP4_CT, _ct("mxfp4-pack-quantized")),
    (SourceFormat.MXFP4_GPTOSS, _gptoss),
    (SourceFormat.MXFP4_DSV4, _dsv4_native),
)

# Which FP4 quants each format may hold (ModelOpt DSV4 keeps MTP / excluded experts in MXFP4).
ALLOWED_QUANTS = {
    SourceFormat.MXFP4_DSV4: {Quant.MXFP4}, SourceFormat.NVFP4_MODELOPT_DSV4: {Quant.NVFP4, Quant.MXFP4},
    SourceFormat.NVFP4_MODELOPT_HF: {Quant.NVFP4}, SourceFormat.NVFP4_CT: {Quant.NVFP4},
    SourceFormat.MXFP4_MODELOPT_HF: {Quant.MXFP4},
    SourceFormat.MXFP4_CT: {Quant.MXFP4}, SourceFormat.MXFP4_GPTOSS: {Quant.MXFP4},
    SourceFormat.MARLIN: {Quant.NVFP4, Quant.MXFP4},
}
_TRUNK_QUANT = {SourceFormat.NVFP4_MODELOPT_DSV4: Quant.NVFP4, SourceFormat.NVFP4_MODELOPT_HF: Quant.NVFP4,
                SourceFormat.NVFP4_CT: Quant.NVFP4, SourceFormat.MXFP4_CT: Quant.MXFP4,
                SourceFormat.MXFP4_MODELOPT_HF: Quant.MXFP4,
                SourceFormat.MXFP4_GPTOSS: Quant.MXFP4, SourceFormat.MXFP4_DSV4: Quant.MXFP4}


def _looked_at(config: Mapping, hfq: Mapping | None, tensors: Mapping[str, TensorRef]) -> str:
    qc, q = _qc(config), _hfq(hfq)
    sample = first_expert_like(tensors)
    return (f"config.json quantization_config.quant_method={qc.get('quant_method')!r}, "
            f"moe_quant_algo={qc.get('moe_quant_algo')!r}, format={qc.get('format')!r}, "
            f"expert_dtype={_expert_dtype(config) or None!r}; hf_quant_config.json "
            f"{'quant_algo=' + repr(q.get('quant_algo')) if hfq is not None else 'absent'}; "
            f"{len(tensors)} tensors, first expert-like tensor: {sample!r}")


def detect_format(config: Mapping, hf_quant_config: Mapping | None,
                  tensors: Mapping[str, TensorRef]) -> tuple[SourceFormat, str]:
    """(format, a short reason) from config files and headers; raises ContentError when nothing
    matches (`detect.unknown_format`) or when the tensors contradict the config (`detect.contradiction`)."""
    for fmt, detector in DETECTORS:
        reason = detector(config, hf_quant_config, tensors)
        if reason:
            _check_consistency(fmt, config, hf_quant_config, tensors)
            _check_unparsed(tensors)
            return fmt, reason
    hint = _unknown_hint(config, hf_quant_config, tensors)
    if _expert_dtype(config) == "fp8":
        hint = "this checkpoint's experts are FP8 (expert_dtype fp8, e.g. a -Base model): nothing to repack"
    raise ContentError(f"cannot tell the FP4 expert format; looked at: {_looked_at(config, hf_quant_config, tensors)}",
                       error_id="detect.unknown_format", hint=hint)


def _unknown_hint(config: Mapping, hfq: Mapping | None, tensors: Mapping[str, TensorRef]) -> str:
    """Name the cause: an expert path no naming scheme knows, or else a quantisation config no detector reads."""
    sample = first_expert_like(tensors)
    known = "; ".join(f"{s.name}: {_spelling(s)}" for s in SCHEMES)
    if sample is None:
        return ("no tensor has an `experts` module, so there are no routed experts to repack (dsv4-convert "
                f"converts MoE expert tensors named by one of: {known})")
    if parse_expert_name(sample) is None:
        return (f"the expert tensor {sample!r} is not understood: {unknown_part(sample)}. dsv4-convert reads the "
                f"expert naming schemes {known} (docs/FORMAT.md, Model families)")
    return ("the expert names are known, but the quantization config is not one dsv4-convert reads: DeepSeek-V4 "
            "MXFP4 (expert_dtype fp4), ModelOpt NVFP4 (quant_method modelopt or hf_quant_config.json NVFP4 / "
            "MIXED_PRECISION) or MXFP4 (quant_algo mxfp4), compressed-tensors nvfp4/mxfp4-pack-quantized, gpt-oss mxfp4, or its own Marlin "
            "output")


def _check_unparsed(tensors: Mapping[str, TensorRef]) -> None:
    """An FP4 expert tensor no scheme spells (packed codes in an `experts` module, with an FP4 block scale
    beside it) would be copied unconverted next to its converted siblings: refuse it, naming the part of its
    path not understood (`detect.unknown_expert_name`)."""
    for name in tensors:
        if not name.endswith(_WEIGHT_SUFFIXES) or first_expert_like((name,)) is None or parse_expert_name(name):
            continue
        ref, stem = tensors[name], name.rsplit(".", 1)[0]
        scale = tensors.get(f"{stem}.weight_scale") or tensors.get(f"{stem}.scale")
        if (ref.dtype in WEIGHT_DTYPES and len(ref.shape) == 2 and scale is not None
                and scale.dtype in {*SCALE_DTYPES["nvfp4"], *SCALE_DTYPES["mxfp4"]}):
            raise ContentError(
                f"{name} ({ref.dtype} {list(ref.shape)}, block scale {scale.name} {scale.dtype}) is an FP4 expert "
                f"tensor, but {unknown_part(name)}", error_id="detect.unknown_expert_name", tensor=name,
                file=ref.file, hint="dsv4-convert would copy it unconverted beside its converted siblings; if this "
                                    "is a model family's real naming, report it with the checkpoint's tensor list "
                                    "(docs/FORMAT.md, Model families)")


def _check_consistency(fmt: SourceFormat, config, hfq, tensors) -> None:
    expected = _TRUNK_QUANT.get(fmt)
    if expected is None:
        return
    found = None
    for name, ref in tensors.items():
        parsed = _PARSE_PER_EXPERT(name)
        if parsed and parsed.suffix in _WEIGHT_SUFFIXES and ref.dtype in WEIGHT_DTYPES and not parsed.layer.startswith("mtp."):
            found = _sibling_quant(parsed.prefix, ref, tensors)
            if found:
                break
    if found is None:
        return  # gpt-oss stacks and incomplete checkpoints: group_projections checks them
    quant, scale, group = found
    if quant is not expected:
        raise ContentError(
            f"the config files say {fmt.value} ({expected.value}, group {expected.group_size}) but expert scale "
            f"{scale.name} is {scale.dtype} {list(scale.shape)}, i.e. {quant.value} with groups of {group}",
            error_id="detect.contradiction", tensor=scale.name, file=scale.file,
            hint="the config and the weights disagree: fix quantization_config / hf_quant_config.json "
                 "to describe the weights, or re-export the checkpoint")
    declared = declared_group_size(config, hfq)
    if declared and declared[0] != group and fmt is not SourceFormat.MARLIN:
        raise ContentError(
            f"{declared[1]} = {declared[0]} but expert scale {scale.name} {scale.dtype} {list(scale.shape)} "
            f"has groups of {group} along K", error_id="detect.contradiction", tensor=scale.name,
            file=scale.file, hint=f"set the group size to {group} if the weights are right, else re-export")


def _sibling_quant(prefix: str, weight: TensorRef, tensors) -> tuple[Quant, TensorRef, int] | None:
    k = logical_k(weight)
    for suffix in ("weight_scale", "scale"):
        s = tensors.get(f"{prefix}.{suffix}")
        if s is not None and s.shape and s.shape[-1]:
            quant = Quant.NVFP4 if s.dtype == "F8_E4M3" else Quant.MXFP4 if s.dtype in SCALE_DTYPES["mxfp4"] else None
            return (quant, s, k // s.shape[-1]) if quant else None
    return None


