"""Source-format detection (ordered detectors, most specific first) and grouping of expert tensors
into FP4 Projections. Facts: spec CHECKPOINT_FORMATS.md §3-§7 and docs/FORMAT.md.

Only headers and config files are used. Grouping decides each projection's quant from the tensors
actually present (a ModelOpt DeepSeek-V4 NVFP4 checkpoint keeps its MTP experts in MXFP4), checks
scale shapes against the weight, and leaves structural gaps (a missing w3, a missing expert) to the
validator. Tensors whose weight is not packed FP4 (FP8 experts of a Base model, shared experts,
attention) are never grouped, so their FP8 `.scale` tensors stay passthrough.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from dsv4_convert.core.engines import QUANT_METHOD
from dsv4_convert.core.errors import ContentError
from dsv4_convert.core.tensor_model import Projection, Quant, Role, SourceFormat, TensorRef

__all__ = ["DETECTORS", "declared_group_size", "detect_format", "group_projections"]

# `layers.3.ffn.experts.17.w1.weight`, `mtp.0.ffn.experts.5.w2.scale`
_DS_NAME = re.compile(r"^(?P<prefix>(?:layers\.(?P<layer>\d+)|mtp\.(?P<mtp>\d+))\.ffn\.experts\.(?P<expert>\d+)"
                      r"\.(?P<proj>w[123]))\.(?P<suffix>[A-Za-z0-9_]+)$")
# `model.layers.3.mlp.experts.17.gate_proj.weight`
_HF_NAME = re.compile(r"^(?P<prefix>model\.layers\.(?P<layer>\d+)\.mlp\.experts\.(?P<expert>\d+)"
                      r"\.(?P<proj>gate_proj|up_proj|down_proj))\.(?P<suffix>[A-Za-z0-9_]+)$")
# gpt-oss: `model.layers.3.mlp.experts.gate_up_proj_blocks`
_GPTOSS_NAME = re.compile(r"^model\.layers\.(?P<layer>\d+)\.mlp\.experts\.(?P<proj>gate_up_proj|down_proj)"
                          r"_(?P<kind>blocks|scales)$")
_ROLES = {"w1": Role.GATE, "w3": Role.UP, "w2": Role.DOWN,
          "gate_proj": Role.GATE, "up_proj": Role.UP, "down_proj": Role.DOWN}
_ROLE_ORDER = {Role.GATE: 0, Role.UP: 1, Role.DOWN: 2}
_PACKED = {"I8", "U8", "F4"}           # packed E2M1 codes
_E8M0 = {"F8_E8M0", "U8"}              # E8M0 scale bytes (compressed-tensors stores them as U8)
_WEIGHT_SUFFIXES = ("weight", "weight_packed")
_NVFP4_ALGOS = {"NVFP4", "W4A16_NVFP4", "NVFP4_AWQ", "W4A8_NVFP4_FP8", "NVFP4_SVD"}


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


def _has(tensors: Mapping[str, TensorRef], pattern: re.Pattern, suffixes: tuple[str, ...] | None = None) -> bool:
    for name in tensors:
        m = pattern.match(name)
        if m and (suffixes is None or m.group("suffix") in suffixes):
            return True
    return False


# -------------------------------------------------------------------------------------------- detectors
def _marlin(config, hfq, tensors) -> str | None:
    if _qc(config).get("quant_method") == QUANT_METHOD:
        return f"config.json quantization_config.quant_method = {QUANT_METHOD} (dsv4-convert output)"
    return None


def _modelopt_dsv4(config, hfq, tensors) -> str | None:
    qc, q = _qc(config), _hfq(hfq)
    in_config = _lower(qc.get("quant_method")) == "fp8" and _upper(qc.get("moe_quant_algo")) == "NVFP4"
    layers = q.get("quantized_layers") if isinstance(q.get("quantized_layers"), dict) else {}
    in_hfq = _upper(q.get("quant_algo")) == "MIXED_PRECISION" and any(
        isinstance(v, dict) and _upper(v.get("quant_algo")) in _NVFP4_ALGOS for v in layers.values())
    if (in_config or in_hfq) and _has(tensors, _DS_NAME, _WEIGHT_SUFFIXES):
        why = "quant_method fp8 + moe_quant_algo NVFP4" if in_config else \
            "hf_quant_config MIXED_PRECISION with NVFP4 quantized_layers"
        return f"{why}, DeepSeek expert names (layers.L.ffn.experts.E.w1/w2/w3)"
    return None


def _modelopt_hf(config, hfq, tensors) -> str | None:
    qc, q = _qc(config), _hfq(hfq)
    signal = None
    if _lower(qc.get("quant_method")) == "modelopt":
        signal = f"quant_method modelopt, quant_algo {qc.get('quant_algo')}"
    elif _upper(q.get("quant_algo")) in _NVFP4_ALGOS:
        signal = f"hf_quant_config quant_algo {q.get('quant_algo')}"
    if signal and _has(tensors, _HF_NAME, ("weight",)):
        return f"{signal}, Hugging Face expert names (model.layers.L.mlp.experts.E.*_proj)"
    return None


def _ct(fmt: str) -> Callable:
    def detector(config, hfq, tensors) -> str | None:
        qc = _qc(config)
        if _lower(qc.get("quant_method")) == "compressed-tensors" and fmt in _ct_formats(qc) and (
                _has(tensors, _HF_NAME, ("weight_packed",)) or _has(tensors, _DS_NAME, ("weight_packed",))):
            return f"quant_method compressed-tensors, format {fmt}, weight_packed expert tensors"
        return None
    return detector


def _gptoss(config, hfq, tensors) -> str | None:
    if _lower(_qc(config).get("quant_method")) == "mxfp4" and any(_GPTOSS_NAME.match(n) for n in tensors):
        return "quant_method mxfp4, stacked *_blocks / *_scales experts (gpt-oss)"
    return None


def _dsv4_native(config, hfq, tensors) -> str | None:
    if _expert_dtype(config) == "fp4" and _has(tensors, _DS_NAME, ("weight",)):
        return "expert_dtype fp4, DeepSeek expert names with .scale siblings"
    return None


# Explicit and ordered: most specific first. The first detector that returns a reason wins.
DETECTORS: tuple[tuple[SourceFormat, Callable], ...] = (
    (SourceFormat.MARLIN, _marlin),
    (SourceFormat.NVFP4_MODELOPT_DSV4, _modelopt_dsv4),
    (SourceFormat.NVFP4_MODELOPT_HF, _modelopt_hf),
    (SourceFormat.NVFP4_CT, _ct("nvfp4-pack-quantized")),
    (SourceFormat.MXFP4_CT, _ct("mxfp4-pack-quantized")),
    (SourceFormat.MXFP4_GPTOSS, _gptoss),
    (SourceFormat.MXFP4_DSV4, _dsv4_native),
)

# Which FP4 quants each format may hold (ModelOpt DSV4 keeps MTP / excluded experts in MXFP4).
_ALLOWED = {
    SourceFormat.MXFP4_DSV4: {Quant.MXFP4}, SourceFormat.NVFP4_MODELOPT_DSV4: {Quant.NVFP4, Quant.MXFP4},
    SourceFormat.NVFP4_MODELOPT_HF: {Quant.NVFP4}, SourceFormat.NVFP4_CT: {Quant.NVFP4},
    SourceFormat.MXFP4_CT: {Quant.MXFP4}, SourceFormat.MXFP4_GPTOSS: {Quant.MXFP4},
    SourceFormat.MARLIN: {Quant.NVFP4, Quant.MXFP4},
}
_TRUNK_QUANT = {SourceFormat.NVFP4_MODELOPT_DSV4: Quant.NVFP4, SourceFormat.NVFP4_MODELOPT_HF: Quant.NVFP4,
                SourceFormat.NVFP4_CT: Quant.NVFP4, SourceFormat.MXFP4_CT: Quant.MXFP4,
                SourceFormat.MXFP4_GPTOSS: Quant.MXFP4, SourceFormat.MXFP4_DSV4: Quant.MXFP4}


def _looked_at(config: Mapping, hfq: Mapping | None, tensors: Mapping[str, TensorRef]) -> str:
    qc, q = _qc(config), _hfq(hfq)
    sample = next((n for n in tensors if ".experts." in n), None)
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
            return fmt, reason
    hint = "dsv4-convert reads DeepSeek-V4 MXFP4, ModelOpt NVFP4, compressed-tensors NVFP4/MXFP4, " \
           "gpt-oss MXFP4 and its own Marlin output"
    if _expert_dtype(config) == "fp8":
        hint = "this checkpoint's experts are FP8 (expert_dtype fp8, e.g. a -Base model): nothing to repack"
    raise ContentError(f"cannot tell the FP4 expert format; looked at: {_looked_at(config, hf_quant_config, tensors)}",
                       error_id="detect.unknown_format", hint=hint)


def _check_consistency(fmt: SourceFormat, config, hfq, tensors) -> None:
    expected = _TRUNK_QUANT.get(fmt)
    if expected is None:
        return
    found = None
    for name, ref in tensors.items():
        m = _DS_NAME.match(name) or _HF_NAME.match(name)
        if m and m.group("suffix") in _WEIGHT_SUFFIXES and ref.dtype in _PACKED and not name.startswith("mtp."):
            found = _sibling_quant(m.group("prefix"), ref, tensors)
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
    k = _logical_k(weight)
    for suffix in ("weight_scale", "scale"):
        s = tensors.get(f"{prefix}.{suffix}")
        if s is not None and s.shape and s.shape[-1]:
            quant = Quant.NVFP4 if s.dtype == "F8_E4M3" else Quant.MXFP4 if s.dtype in _E8M0 else None
            return (quant, s, k // s.shape[-1]) if quant else None
    return None


def _logical_k(weight: TensorRef) -> int:
    return weight.shape[-1] if weight.dtype == "F4" else 2 * weight.shape[-1]


# --------------------------------------------------------------------------------------------- grouping
@dataclass(frozen=True)
class _Parts:
    prefix: str
    layer: str
    expert: int
    role: Role
    refs: dict


def group_projections(fmt: SourceFormat, config: Mapping,
                      tensors: Mapping[str, TensorRef]) -> tuple[Projection, ...]:
    """Every FP4 expert projection, sorted by (trunk layers, MTP layers), expert, gate/up/down."""
    if fmt is SourceFormat.MXFP4_GPTOSS:
        projections = _group_gptoss(tensors)
    else:
        projections = [p for parts in _collect(tensors).values()
                       if (p := _projection(fmt, parts)) is not None]
    allowed = _ALLOWED[fmt]
    for p in projections:
        if p.quant not in allowed:
            raise ContentError(
                f"{p.key} is {p.quant.value} ({p.scale.name} is {p.scale.dtype} {list(p.scale.shape)}) but a "
                f"{fmt.value} checkpoint holds only {', '.join(sorted(q.value for q in allowed))} experts",
                error_id="group.unexpected_quant", tensor=p.scale.name, file=p.scale.file,
                hint="the checkpoint mixes formats; re-export it or fix its quantization config")
    return tuple(sorted(projections, key=_sort_key))


def _sort_key(p: Projection):
    mtp = p.layer.startswith("mtp.")
    return (mtp, int(p.layer.split(".")[-1]), p.expert, _ROLE_ORDER[p.role])


def _collect(tensors: Mapping[str, TensorRef]) -> dict[str, _Parts]:
    groups: dict[str, _Parts] = {}
    for name, ref in tensors.items():
        m = _DS_NAME.match(name) or _HF_NAME.match(name)
        if not m:
            continue
        prefix = m.group("prefix")
        if prefix not in groups:
            layer = m.group("layer") if m.groupdict().get("mtp") is None else f"mtp.{m.group('mtp')}"
            groups[prefix] = _Parts(prefix, layer, int(m.group("expert")), _ROLES[m.group("proj")], {})
        groups[prefix].refs[m.group("suffix")] = ref
    return groups


def _shape_error(ref: TensorRef, expected: list[int], derivation: str, *, error_id: str) -> ContentError:
    return ContentError(f"{ref.name} has shape {list(ref.shape)} ({ref.dtype}); expected {expected} ({derivation})",
                        error_id=error_id, tensor=ref.name, file=ref.file,
                        hint="the tensor does not match its weight: re-export the checkpoint")


def _scalar(ref: TensorRef | None, what: str) -> TensorRef | None:
    if ref is not None and (ref.dtype != "F32" or math.prod(ref.shape) != 1):
        raise ContentError(f"{ref.name} is {ref.dtype} {list(ref.shape)}; a {what} is one F32 value",
                           error_id="group.bad_global_scale", tensor=ref.name, file=ref.file,
                           hint="re-export the checkpoint")
    return ref


def _projection(fmt: SourceFormat, parts: _Parts) -> Projection | None:
    refs = parts.refs
    weight = refs.get("weight") or refs.get("weight_packed")
    scale_names = [s for s in ("weight_scale", "scale") if s in refs]
    if weight is None:
        if scale_names:
            s = refs[scale_names[0]]
            raise ContentError(f"{s.name} has no weight ({parts.prefix}.weight / .weight_packed is missing)",
                               error_id="group.scale_without_weight", tensor=s.name, file=s.file,
                               hint="the checkpoint is incomplete: re-download or re-export it")
        return None
    if fmt is SourceFormat.MARLIN:
        return _marlin_projection(parts, weight)
    if weight.dtype not in _PACKED:
        return None  # FP8 / BF16 experts: passthrough, their `.scale` is not an FP4 scale
    if len(weight.shape) != 2:
        raise _shape_error(weight, ["N", "K/2"], "packed FP4 expert weights are 2-D", error_id="group.weight_shape")
    if not scale_names:
        raise ContentError(f"{weight.name} ({weight.dtype} {list(weight.shape)}) has no block scale "
                           f"({parts.prefix}.scale / .weight_scale is missing)", error_id="group.missing_scale",
                           tensor=weight.name, file=weight.file,
                           hint="the checkpoint is incomplete: re-download or re-export it")
    if len(scale_names) > 1:
        raise ContentError(f"{parts.prefix} has both .scale and .weight_scale; cannot tell its format",
                           error_id="group.ambiguous_scale", tensor=weight.name, file=weight.file,
                           hint="remove the stale scale tensor (a half-finished conversion?)")
    scale = refs[scale_names[0]]
    if scale.dtype == "F8_E4M3":
        quant = Quant.NVFP4
    elif scale.dtype in _E8M0:
        quant = Quant.MXFP4
    else:
        raise ContentError(f"{scale.name} is {scale.dtype}; an FP4 block scale is F8_E4M3 (NVFP4) or "
                           "F8_E8M0 / U8 (MXFP4)", error_id="group.bad_scale_dtype", tensor=scale.name,
                           file=scale.file, hint="re-export the checkpoint")
    n, k = weight.shape[0], _logical_k(weight)
    g = quant.group_size
    expected = [n, k // g]
    if k % g or list(scale.shape) != expected:
        raise _shape_error(scale, expected, f"weight {weight.name} {list(weight.shape)} -> N={n}, K={k}; "
                           f"{quant.value} scale is [N, K/{g}]", error_id="group.scale_shape")
    global_scale = input_scale = None
    if quant is Quant.NVFP4:
        global_scale = _scalar(refs.get("weight_scale_2") or refs.get("weight_global_scale"), "global scale")
        if global_scale is None:
            raise ContentError(f"{weight.name} is NVFP4 but has no global scale ({parts.prefix}.weight_scale_2 "
                               "or .weight_global_scale)", error_id="group.missing_global_scale",
                               tensor=weight.name, file=weight.file, hint="re-export the checkpoint")
        input_scale = _scalar(refs.get("input_scale") or refs.get("input_global_scale"), "input scale")
    return Projection(key=parts.prefix, layer=parts.layer, expert=parts.expert, role=parts.role, quant=quant,
                      n=n, k=k, weight=weight, scale=scale, global_scale=global_scale, input_scale=input_scale)


def _marlin_projection(parts: _Parts, weight: TensorRef) -> Projection | None:
    """Marlin output (docs/FORMAT.md): weight I32 [K/16, 2N], weight_scale [K/g, N]; global_scale is the
    kept original `weight_scale_2`, marlin_global the processed `weight_global_scale`."""
    scale = parts.refs.get("weight_scale")
    if weight.dtype != "I32":
        return None  # an expert the converter left unconverted would keep its source dtype
    if len(weight.shape) != 2 or weight.shape[1] % 2:
        raise _shape_error(weight, ["K/16", "2N"], "Marlin weight, docs/FORMAT.md", error_id="group.weight_shape")
    if scale is None:
        raise ContentError(f"{weight.name} has no {parts.prefix}.weight_scale", error_id="group.missing_scale",
                           tensor=weight.name, file=weight.file, hint="the checkpoint is incomplete")
    quant = Quant.NVFP4 if scale.dtype == "F8_E4M3" else Quant.MXFP4 if scale.dtype in _E8M0 else None
    if quant is None:
        raise ContentError(f"{scale.name} is {scale.dtype}; Marlin scales are F8_E4M3 (NVFP4) or F8_E8M0 (MXFP4)",
                           error_id="group.bad_scale_dtype", tensor=scale.name, file=scale.file,
                           hint="re-run the conversion")
    k, n = weight.shape[0] * 16, weight.shape[1] // 2
    expected = [k // quant.group_size, n]
    if list(scale.shape) != expected:
        raise _shape_error(scale, expected, f"weight {list(weight.shape)} -> K={k}, N={n}; Marlin "
                           f"{quant.value} scale is [K/{quant.group_size}, N]", error_id="group.scale_shape")
    refs = parts.refs
    return Projection(key=parts.prefix, layer=parts.layer, expert=parts.expert, role=parts.role, quant=quant,
                      n=n, k=k, weight=weight, scale=scale,
                      global_scale=_scalar(refs.get("weight_scale_2"), "global scale"),
                      input_scale=_scalar(refs.get("input_scale"), "input scale"),
                      marlin_global=refs.get("weight_global_scale"))


def _group_gptoss(tensors: Mapping[str, TensorRef]) -> list[Projection]:
    stacks: dict[tuple[str, str], dict[str, TensorRef]] = {}
    for name, ref in tensors.items():
        m = _GPTOSS_NAME.match(name)
        if m:
            stacks.setdefault((m.group("layer"), m.group("proj")), {})[m.group("kind")] = ref
    out = []
    for (layer, proj), kinds in stacks.items():
        blocks, scales = kinds.get("blocks"), kinds.get("scales")
        if blocks is None or scales is None:
            have = blocks or scales
            raise ContentError(f"{have.name} has no {'scales' if blocks else 'blocks'} sibling",
                               error_id="group.missing_scale" if blocks else "group.scale_without_weight",
                               tensor=have.name, file=have.file, hint="the checkpoint is incomplete")
        if blocks.dtype != "U8" or len(blocks.shape) != 4 or blocks.shape[-1] != 16:
            raise _shape_error(blocks, ["E", "rows", "K/32", 16], "gpt-oss *_blocks are U8",
                               error_id="group.weight_shape")
        e, rows, kb, _ = blocks.shape
        if scales.dtype != "U8" or list(scales.shape) != [e, rows, kb]:
            raise _shape_error(scales, [e, rows, kb], f"{blocks.name} {list(blocks.shape)}; *_scales are U8 "
                               "[E, rows, K/32]", error_id="group.scale_shape")
        fused = proj == "gate_up_proj"
        if fused and rows % 2:
            raise _shape_error(blocks, [e, "2I", kb, 16], "gate and up rows are interleaved",
                               error_id="group.weight_shape")
        parts = ((Role.GATE, "gate_proj", 0), (Role.UP, "up_proj", 1)) if fused else ((Role.DOWN, "down_proj", 0),)
        step = 2 if fused else 1
        for ex in range(e):
            for role, hf_name, start in parts:
                out.append(Projection(
                    key=f"model.layers.{layer}.mlp.experts.{ex}.{hf_name}", layer=layer, expert=ex, role=role,
                    quant=Quant.MXFP4, n=rows // step, k=kb * 32, weight=blocks, scale=scales,
                    expert_index=ex, row_start=start, row_step=step))
    return out
