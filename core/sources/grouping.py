"""Grouping of expert tensors into FP4 Projections, after `detect_format` named the format. Each
projection's quant comes from the tensors actually present (a ModelOpt DeepSeek-V4 NVFP4 checkpoint
keeps its MTP experts in MXFP4); scale shapes are checked against the weight; structural gaps (a
missing w3, a missing expert) are left to the validator. Tensors whose weight is not packed FP4 are
never grouped, so their FP8 `.scale` tensors stay passthrough."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from ..checkpoint.dtypes import SCALE_DTYPES, WEIGHT_DTYPES
from ..checkpoint.tensor_model import Projection, Quant, Role, TensorRef
from ..errors import ContentError
from .naming import (
    K_MAJOR,
    PER_EXPERT,
    ROLE_ORDER,
    SCHEMES,
    STACKED,
    ExpertName,
    expert_parser,
    logical_k,
    per_expert_key,
)
from .source_formats import SourceFormat, Suffixes, tensor_suffixes

__all__ = ["group_projections"]

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
    names = tensor_suffixes()
    projections = [p for parts in _collect(tensors).values() if (p := _projection(fmt, parts, names)) is not None]
    if not fmt.converted:
        projections += _group_stacked(tensors)
    allowed = fmt.quants
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
    return (mtp, int(p.layer.split(".")[-1]), p.expert, ROLE_ORDER[p.role])


_PER_EXPERT = expert_parser(tuple(s for s in SCHEMES if s.layout == PER_EXPERT))
_STACKED = expert_parser(tuple(s for s in SCHEMES if s.layout == STACKED))


def _collect(tensors: Mapping[str, TensorRef]) -> dict[str, _Parts]:
    groups: dict[str, _Parts] = {}
    for name, ref in tensors.items():
        parsed = _PER_EXPERT(name)
        if parsed is None:
            continue
        if parsed.prefix not in groups:
            groups[parsed.prefix] = _Parts(parsed.prefix, parsed.layer, parsed.expert, parsed.role, {})
        groups[parsed.prefix].refs[parsed.suffix] = ref
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


def _first(refs: dict, suffixes: tuple[str, ...]) -> TensorRef | None:
    return next((refs[s] for s in suffixes if s in refs), None)


def _projection(fmt: SourceFormat, parts: _Parts, names: Suffixes) -> Projection | None:
    """`names`: every source format's tensor suffixes (core/sources/source_formats.py tensor_suffixes)."""
    refs = parts.refs
    weight = _first(refs, names.weight)
    scale_names = [s for s in names.scale if s in refs]
    if weight is None:
        if scale_names:
            s = refs[scale_names[0]]
            raise ContentError(f"{s.name} has no weight ({parts.prefix}.{' / .'.join(names.weight)} is missing)",
                               error_id="group.scale_without_weight", tensor=s.name, file=s.file,
                               hint="the checkpoint is incomplete: re-download or re-export it")
        return None
    if fmt.converted:
        return _marlin_projection(parts, weight)
    if weight.dtype not in WEIGHT_DTYPES:
        return None  # FP8 / BF16 experts: passthrough, their `.scale` is not an FP4 scale
    if len(weight.shape) != 2:
        raise _shape_error(weight, ["N", "K/2"], "packed FP4 expert weights are 2-D", error_id="group.weight_shape")
    if not scale_names:
        raise ContentError(f"{weight.name} ({weight.dtype} {list(weight.shape)}) has no block scale "
                           f"({parts.prefix}.{' / .'.join(reversed(names.scale))} is missing)",
                           error_id="group.missing_scale",
                           tensor=weight.name, file=weight.file,
                           hint="the checkpoint is incomplete: re-download or re-export it")
    if len(scale_names) > 1:
        raise ContentError(f"{parts.prefix} has both .{' and .'.join(reversed(scale_names))}; cannot tell its format",
                           error_id="group.ambiguous_scale", tensor=weight.name, file=weight.file,
                           hint="remove the stale scale tensor (a half-finished conversion?)")
    scale = refs[scale_names[0]]
    if scale.dtype == "F8_E4M3":
        quant = Quant.NVFP4
    elif scale.dtype in SCALE_DTYPES["mxfp4"]:
        quant = Quant.MXFP4
    else:
        raise ContentError(f"{scale.name} is {scale.dtype}; an FP4 block scale is F8_E4M3 (NVFP4) or "
                           "F8_E8M0 / U8 (MXFP4)", error_id="group.bad_scale_dtype", tensor=scale.name,
                           file=scale.file, hint="re-export the checkpoint")
    n, k = weight.shape[0], logical_k(weight)
    g = quant.group_size
    expected = [n, k // g]
    if k % g or list(scale.shape) != expected:
        raise _shape_error(scale, expected, f"weight {weight.name} {list(weight.shape)} -> N={n}, K={k}; "
                           f"{quant.value} scale is [N, K/{g}]", error_id="group.scale_shape")
    global_scale = input_scale = None
    if quant is Quant.NVFP4:
        global_scale = _scalar(_first(refs, names.global_scale), "global scale")
        if global_scale is None:
            raise ContentError(f"{weight.name} is NVFP4 but has no global scale ({parts.prefix}."
                               f"{' or .'.join(names.global_scale)})", error_id="group.missing_global_scale",
                               tensor=weight.name, file=weight.file, hint="re-export the checkpoint")
        input_scale = _scalar(_first(refs, names.input_scale), "input scale")
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
    quant = Quant.NVFP4 if scale.dtype == "F8_E4M3" else Quant.MXFP4 if scale.dtype in SCALE_DTYPES["mxfp4"] else None
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


def _group_stacked(tensors: Mapping[str, TensorRef]) -> list[Projection]:
    """Projections of stacked schemes (all experts of a layer in one tensor), by the naming table."""
    stacks: dict[tuple[str, str], dict[str, TensorRef]] = {}  # (stack base, scheme) -> part -> ref
    parsed_of = {}
    for name, ref in tensors.items():
        parsed = _STACKED(name)
        if parsed is not None:
            stacks.setdefault(parsed.prefix, {})[parsed.suffix] = ref
            parsed_of[parsed.prefix] = parsed
    out: list[Projection] = []
    for base, parts in stacks.items():
        parsed = parsed_of[base]
        if parsed.scheme.orientation == K_MAJOR:
            out.extend(_k_major_projections(parsed, parts))
        else:
            out.extend(_gptoss_projections(parsed, parts))
    return out


def _k_major_projections(parsed: ExpertName, parts: dict[str, TensorRef]) -> list[Projection]:
    """ModelOpt's stacked NVFP4 experts (Llama-4): weight U8 [E, K/2, R], scale F8_E4M3 [E, K/16, R] with R = 2I
    (gate rows then up rows) or H (down); one global and one input scale for the whole stack."""
    weight, scale = parts.get("weight"), parts.get("scale")
    if weight is None:
        s = scale or next(iter(parts.values()))
        raise ContentError(f"{s.name} has no weight ({parsed.prefix} is missing)", error_id="group.scale_without_weight",
                           tensor=s.name, file=s.file, hint="the checkpoint is incomplete: re-download or re-export it")
    if scale is None:
        raise ContentError(f"{weight.name} has no block scale ({parsed.prefix}_weight_scale is missing)",
                           error_id="group.missing_scale", tensor=weight.name, file=weight.file,
                           hint="the checkpoint is incomplete: re-download or re-export it")
    if weight.dtype not in WEIGHT_DTYPES or len(weight.shape) != 3:
        raise _shape_error(weight, ["E", "K/2", "rows"], "stacked K-major NVFP4 experts are U8",
                           error_id="group.weight_shape")
    e, k2, rows = weight.shape
    roles = parsed.scheme.roles[parsed.proj]
    if scale.dtype != "F8_E4M3":
        raise ContentError(f"{scale.name} is {scale.dtype}; stacked NVFP4 block scales are F8_E4M3",
                           error_id="group.bad_scale_dtype", tensor=scale.name, file=scale.file,
                           hint="re-export the checkpoint")
    g = Quant.NVFP4.group_size
    if (2 * k2) % g or list(scale.shape) != [e, 2 * k2 // g, rows] or rows % len(roles):
        raise _shape_error(scale, [e, 2 * k2 // g, rows], f"weight {weight.name} {list(weight.shape)} -> K={2 * k2}; "
                           f"the scale is [E, K/{g}, rows] with rows split evenly among {len(roles)} roles",
                           error_id="group.scale_shape")
    global_scale = _scalar(parts.get("global_scale"), "global scale")
    if global_scale is None:
        raise ContentError(f"{weight.name} is NVFP4 but has no global scale ({parsed.prefix}_weight_scale_2)",
                           error_id="group.missing_global_scale", tensor=weight.name, file=weight.file,
                           hint="re-export the checkpoint")
    input_scale = _scalar(parts.get("input_scale"), "input scale")
    n = rows // len(roles)
    return [Projection(key=per_expert_key(parsed.container, ex, role), layer=parsed.layer, expert=ex, role=role,
                       quant=Quant.NVFP4, n=n, k=2 * k2, weight=weight, scale=scale, global_scale=global_scale,
                       input_scale=input_scale, expert_index=ex, row_start=i * n, k_major=True)
            for ex in range(e) for i, role in enumerate(roles)]


def _gptoss_projections(parsed: ExpertName, parts: dict[str, TensorRef]) -> list[Projection]:
    blocks, scales = parts.get("weight"), parts.get("scale")
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
    roles = parsed.scheme.roles[parsed.proj]
    if rows % len(roles):
        raise _shape_error(blocks, [e, "2I", kb, 16], "gate and up rows are interleaved",
                           error_id="group.weight_shape")
    step = len(roles)
    return [Projection(key=per_expert_key(parsed.container, ex, role), layer=parsed.layer, expert=ex, role=role,
                       quant=Quant.MXFP4, n=rows // step, k=kb * 32, weight=blocks, scale=scales,
                       expert_index=ex, row_start=start, row_step=step)
            for ex in range(e) for start, role in enumerate(roles)]
