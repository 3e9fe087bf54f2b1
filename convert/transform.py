"""The route from one source projection to its output tensors, for a target. Calls formats/ only."""

from __future__ import annotations

import functools

import numpy as np
import torch

from ..core.checkpoint.reader import TensorReader, load_projection
from ..core.checkpoint.tensor_io import safetensors_dtype
from ..core.checkpoint.tensor_model import Projection, Quant, Role
from ..core.errors import ContentError
from ..core.sources.source_formats import SourceFormat
from ..core.targets.target import MarlinTarget
from ..formats.constants import E4M3_NAN_BYTES, E8M0_NAN
from ..formats.e4m3 import e4m3_is_nan
from ..formats.marlin import (
    mxfp4_source_for,
    mxfp4_to_marlin,
    nvfp4_source_for,
    nvfp4_to_marlin,
)
from ..formats.marlin.compiled_kernels import byte_presence
from ..formats.marlin.scales import nvfp4_global_to_marlin, nvfp4_scales_to_s0e5m3, s0e5m3_to_nvfp4_scales
from ..formats.padded_layout import join_rank_blocks, rank_nk, source_rank_blocks
from ..formats.tiles import RankTiles

__all__ = ["convert_projection", "convert_with_torch", "lost_scales", "scale_round_trip"]


def convert_projection(p: Projection, weight: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor | None,
                       *, target: MarlinTarget, sf: float = 1.0, tiles: RankTiles | None = None,
                       threads: int | None = None) -> dict[str, torch.Tensor]:
    """Source tensors (weight u8 [N, K/2], scale [N, K/g], ModelOpt global or None) -> output parts
    named as in plan._projection_outputs: weight, weight_scale, and for NVFP4 weight_global_scale and
    weight_scale_2 (the ModelOpt-convention global, stored for compressed-tensors sources).
    With `tiles` (a container the engine pads at the --tp/--ep split), the padded per-rank layout.
    The weight repack runs on `threads` CPU threads."""
    _refuse_nan_scales(p, scale)
    if tiles is not None:
        return _convert_padded(p, weight, scale, global_scale, target=target, sf=sf, tiles=tiles, threads=threads)
    if p.quant is Quant.NVFP4:
        q, s = nvfp4_to_marlin(weight, scale, target=target, sf=sf, threads=threads)
        g = global_scale.float().reshape(())
        processed = nvfp4_global_to_marlin(g, fp32_global=target.fp32_global, act_dtype=target.act_dtype, sf=sf)
        return {"weight": q, "weight_scale": s, "weight_global_scale": processed, "weight_scale_2": g}
    q, s = mxfp4_to_marlin(weight, scale, target=target, threads=threads)
    return {"weight": q, "weight_scale": s}


def _convert_padded(p: Projection, weight, scale, global_scale, *, target: MarlinTarget, sf: float,
                    tiles: RankTiles, threads: int | None) -> dict[str, torch.Tensor]:
    """Each MoE-TP rank's source slice, zero-padded in source space to the engine's per-rank sizes
    (what vLLM's torch.zeros parameters hold before the repack), through the same codec as an
    unpadded projection; the rank blocks concatenated in rank order (formats/padded_layout.py).
    One rank's block in flight at a time besides the outputs."""
    down = p.role is Role.DOWN
    n_pad, k_pad = rank_nk(down, tiles)
    pad = nvfp4_source_for if p.quant is Quant.NVFP4 else mxfp4_source_for
    blocks = []
    for w, s in source_rank_blocks(weight, scale, down=down, t=tiles):
        w, s = pad(w.contiguous(), s.contiguous(), target=target, n_pad=n_pad, k_pad=k_pad)
        blocks.append(convert_projection(p, w.contiguous(), s.contiguous(), global_scale, target=target, sf=sf,
                                         threads=threads))
    out = dict(blocks[0])
    for part in ("weight", "weight_scale"):
        out[part] = join_rank_blocks((b[part] for b in blocks), down=down)
    return out


def _refuse_nan_scales(p: Projection, scale: torch.Tensor) -> None:
    """The engines would load NaN scales without a word and serve NaN (NVFP4) or Inf (MXFP4) for every
    token through that channel; a converter that exists to fail early refuses them."""
    b = scale.view(torch.uint8)
    present = _present(b)  # one pass over the bytes; the mask below only for the rare error
    if not (present[list(E4M3_NAN_BYTES)].any() if p.quant is Quant.NVFP4 else present[E8M0_NAN]):
        return
    nan = e4m3_is_nan(b) if p.quant is Quant.NVFP4 else b == E8M0_NAN
    if nan.any():
        first = [int(i) for i in torch.nonzero(nan)[0]]
        raise ValueError(f"{int(nan.sum())} block scales are NaN (first at {first})")


@functools.lru_cache(maxsize=16)
def scale_round_trip(clamp: bool, sf: float) -> np.ndarray:
    """[256] uint8: what each E4M3 block scale byte decodes back to after the target's S0E5M3."""
    codes = torch.arange(256, dtype=torch.uint8)
    back = s0e5m3_to_nvfp4_scales(nvfp4_scales_to_s0e5m3(codes.view(torch.float8_e4m3fn), clamp=clamp, sf=sf), sf=sf)
    return back.view(torch.uint8).numpy()


def _lossy_bytes(clamp: bool, sf: float) -> np.ndarray:
    """[256] bool: E4M3 bytes that do not survive the round trip through the target's S0E5M3."""
    return scale_round_trip(clamp, sf) != np.arange(256, dtype=np.uint8)


def _present(b: torch.Tensor) -> np.ndarray:
    """[256] bool: which byte values occur in b."""
    return byte_presence(b.contiguous().reshape(-1).numpy())


def lost_scales(scale: torch.Tensor, *, target: MarlinTarget, sf: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 block scales the target cannot represent (vllm clamps values below 2 after x128 and
    rescaling, incl. negatives; sglang drops signs): (flat indices into the source [N, K/16] scale,
    their original bytes). Empty for normal checkpoints; stored so that the reverse is exact.
    Whether a byte survives the round trip depends on the byte alone: one 256-entry table."""
    lossy = _lossy_bytes(target.clamps_scales, sf)
    src = scale.contiguous().view(torch.uint8).reshape(-1)
    if not (lossy & _present(src)).any():  # the normal case: no byte of the scale is lossy
        return torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.uint8)
    idx = torch.from_numpy(lossy[src.numpy()].nonzero()[0])
    return idx, src[idx].clone()


def convert_with_torch(reader: TensorReader, p: Projection, fmt: SourceFormat, target, sf: float, tiles,
                       lost: dict, planned: dict, *, threads: int | None = None) -> dict[str, np.ndarray]:
    """One projection -> its output parts as byte arrays, each checked against its planned TensorSpec
    (`planned`: part -> spec; parts the plan does not write are left out); adds {key.index, key.bytes}
    of the scale bytes the target loses to `lost`. `tiles`: the padded
    per-rank layout of a --tp/--ep conversion (plan.OutTensor.tiles). The route for everything
    convert/cpu_path.py does not take."""
    src = load_projection(reader, p, fmt=fmt)
    try:
        parts = convert_projection(p, src.weight, src.scale, src.global_scale, target=target, sf=sf, tiles=tiles,
                                   threads=threads)
    except ValueError as e:  # the codecs refuse values the target cannot encode
        raise ContentError(f"{p.key}: {e}", error_id="convert.bad_values", tensor=p.weight.name, file=p.weight.file,
                           hint="run `dsv4-convert validate` on the input for the full list; fix or re-export "
                                "the checkpoint") from None
    if p.quant is Quant.NVFP4:
        idx, orig = lost_scales(src.scale, target=target, sf=sf)
        if idx.numel():
            lost.update({f"{p.key}.index": idx, f"{p.key}.bytes": orig})
    return {part: _planned_bytes(parts[part], spec) for part, spec in planned.items()}


def _planned_bytes(t: torch.Tensor, spec) -> np.ndarray:
    if safetensors_dtype(t) != spec.dtype or tuple(t.shape) != spec.shape:
        raise RuntimeError(f"{spec.name}: produced {safetensors_dtype(t)}{list(t.shape)}, "
                           f"planned {spec.dtype}{list(spec.shape)}")
    return t.contiguous().reshape(-1).view(torch.uint8).numpy()
