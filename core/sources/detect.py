"""Source-format detection: the rows of the source-format table (core/sources/source_formats.py) in order, most
specific first, each with its detector (core/sources/detectors.py); grouping of the expert tensors into FP4
Projections is core/sources/grouping.py. Facts: docs/spec/CHECKPOINT_FORMATS.md §3-§7 and docs/FORMAT.md.

Only headers and config files are used. Grouping decides each projection's quant from the tensors
actually present (a ModelOpt DeepSeek-V4 NVFP4 checkpoint keeps its MTP experts in MXFP4), checks
scale shapes against the weight, and leaves structural gaps (a missing w3, a missing expert) to the
validator. Tensors whose weight is not packed FP4 (FP8 experts of a Base model, shared experts,
attention) are never grouped, so their FP8 `.scale` tensors stay passthrough.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..checkpoint.dtypes import SCALE_DTYPES, WEIGHT_DTYPES
from ..checkpoint.tensor_model import Quant, TensorRef
from ..errors import ContentError
from .detectors import expert_dtype, hfq_block, parse_per_expert, qc_block, spelling
from .naming import SCHEMES, first_expert_like, logical_k, parse_expert_name, unknown_part
from .source_formats import FORMATS, SourceFormat, tensor_suffixes

__all__ = ["declared_group_size", "detect_format"]


def declared_group_size(config: Mapping, hf_quant_config: Mapping | None) -> tuple[int, str] | None:
    """The FP4 group size the config files declare, and where, or None."""
    hfq = hfq_block(hf_quant_config)
    if isinstance(hfq.get("group_size"), int):
        return hfq["group_size"], "hf_quant_config.json quantization.group_size"
    qc = qc_block(config)
    if isinstance(qc.get("group_size"), int):
        return qc["group_size"], "config.json quantization_config.group_size"
    groups = qc.get("config_groups")
    if isinstance(groups, dict):
        for gname, g in groups.items():
            w = g.get("weights") if isinstance(g, dict) else None
            if isinstance(w, dict) and isinstance(w.get("group_size"), int):
                return w["group_size"], f"config.json quantization_config.config_groups.{gname}.weights.group_size"
    return None


def _looked_at(config: Mapping, hfq: Mapping | None, tensors: Mapping[str, TensorRef]) -> str:
    qc, q = qc_block(config), hfq_block(hfq)
    sample = first_expert_like(tensors)
    return (f"config.json quantization_config.quant_method={qc.get('quant_method')!r}, "
            f"moe_quant_algo={qc.get('moe_quant_algo')!r}, format={qc.get('format')!r}, "
            f"expert_dtype={expert_dtype(config) or None!r}; hf_quant_config.json "
            f"{'quant_algo=' + repr(q.get('quant_algo')) if hfq is not None else 'absent'}; "
            f"{len(tensors)} tensors, first expert-like tensor: {sample!r}")


def detect_format(config: Mapping, hf_quant_config: Mapping | None,
                  tensors: Mapping[str, TensorRef]) -> tuple[SourceFormat, str]:
    """(format, a short reason) from config files and headers; raises ContentError when nothing
    matches (`detect.unknown_format`) or when the tensors contradict the config (`detect.contradiction`)."""
    for fmt in FORMATS.values():  # the table's order: most specific first; the first reason wins
        reason = fmt.detect(fmt, config, hf_quant_config, tensors)
        if reason:
            _check_consistency(fmt, config, hf_quant_config, tensors)
            _check_unparsed(tensors)
            return fmt, reason
    hint = _unknown_hint(config, hf_quant_config, tensors)
    if expert_dtype(config) == "fp8":
        hint = "this checkpoint's experts are FP8 (expert_dtype fp8, e.g. a -Base model): nothing to repack"
    raise ContentError(f"cannot tell the FP4 expert format; looked at: {_looked_at(config, hf_quant_config, tensors)}",
                       error_id="detect.unknown_format", hint=hint)


def _unknown_hint(config: Mapping, hfq: Mapping | None, tensors: Mapping[str, TensorRef]) -> str:
    """Name the cause: an expert path no naming scheme knows, or else a quantisation config no detector reads."""
    sample = first_expert_like(tensors)
    known = "; ".join(f"{s.name}: {spelling(s)}" for s in SCHEMES)
    if sample is None:
        return ("no tensor has an `experts` module, so there are no routed experts to repack (dsv4-convert "
                f"converts MoE expert tensors named by one of: {known})")
    if parse_expert_name(sample) is None:
        return (f"the expert tensor {sample!r} is not understood: {unknown_part(sample)}. dsv4-convert reads the "
                f"expert naming schemes {known} (docs/FORMAT.md, Model families)")
    read = "; ".join(f"{row.value} ({' or '.join(row.config_blocks)})" for row in FORMATS.values())
    return f"the expert names are known, but the quantization config is not one dsv4-convert reads: {read}"


def _check_unparsed(tensors: Mapping[str, TensorRef]) -> None:
    """An FP4 expert tensor no scheme spells (packed codes in an `experts` module, with an FP4 block scale
    beside it) would be copied unconverted next to its converted siblings: refuse it, naming the part of its
    path not understood (`detect.unknown_expert_name`)."""
    names = tensor_suffixes()
    for name in tensors:
        if not name.endswith(names.weight) or first_expert_like((name,)) is None or parse_expert_name(name):
            continue
        ref, stem = tensors[name], name.rsplit(".", 1)[0]
        scale = next((tensors[f"{stem}.{s}"] for s in names.scale if f"{stem}.{s}" in tensors), None)
        if (ref.dtype in WEIGHT_DTYPES and len(ref.shape) == 2 and scale is not None
                and scale.dtype in {*SCALE_DTYPES["nvfp4"], *SCALE_DTYPES["mxfp4"]}):
            raise ContentError(
                f"{name} ({ref.dtype} {list(ref.shape)}, block scale {scale.name} {scale.dtype}) is an FP4 expert "
                f"tensor, but {unknown_part(name)}", error_id="detect.unknown_expert_name", tensor=name,
                file=ref.file, hint="dsv4-convert would copy it unconverted beside its converted siblings; if this "
                                    "is a model family's real naming, report it with the checkpoint's tensor list "
                                    "(docs/FORMAT.md, Model families)")


def _check_consistency(fmt: SourceFormat, config, hfq, tensors) -> None:
    expected = fmt.trunk
    if expected is None:
        return
    found, names = None, tensor_suffixes()
    for name, ref in tensors.items():
        parsed = parse_per_expert(name)
        if (parsed and parsed.suffix in names.weight and ref.dtype in WEIGHT_DTYPES
                and not parsed.layer.startswith("mtp.")):
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
    if declared and declared[0] != group:
        raise ContentError(
            f"{declared[1]} = {declared[0]} but expert scale {scale.name} {scale.dtype} {list(scale.shape)} "
            f"has groups of {group} along K", error_id="detect.contradiction", tensor=scale.name,
            file=scale.file, hint=f"set the group size to {group} if the weights are right, else re-export")


def _sibling_quant(prefix: str, weight: TensorRef, tensors) -> tuple[Quant, TensorRef, int] | None:
    k = logical_k(weight)
    for suffix in tensor_suffixes().scale:
        s = tensors.get(f"{prefix}.{suffix}")
        if s is not None and s.shape and s.shape[-1]:
            quant = Quant.NVFP4 if s.dtype == "F8_E4M3" else Quant.MXFP4 if s.dtype in SCALE_DTYPES["mxfp4"] else None
            return (quant, s, k // s.shape[-1]) if quant else None
    return None


