"""Why does a converted projection not match its source? Try the usual mistakes one by one and name
the first that explains the bytes exactly. Pure functions; only called after a mismatch."""

from __future__ import annotations

import torch

from ..core.checkpoint.tensor_model import Quant
from ..core.targets.engines import ACT_DTYPES, ENGINES
from ..formats.constants import MARLIN_TILE_K, MARLIN_TILE_N
from ..formats.marlin.scales import (
    mxfp4_scales_to_marlin,
    nvfp4_global_to_marlin,
    nvfp4_scales_to_s0e5m3,
    permute_scale_columns,
    vllm_rescale_factor,
)
from ..formats.marlin.weight import from_marlin_weight

__all__ = ["expected_marlin_scales", "global_cause", "scale_cause", "swap_nibbles", "weight_cause"]


def swap_nibbles(b: torch.Tensor) -> torch.Tensor:
    b = b.view(torch.uint8)
    return (b << 4) | (b >> 4)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.contiguous(), b.contiguous()
    return a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def _tiles(packed: torch.Tensor) -> torch.Tensor:
    """packed [N, K/2] -> [K/16, N/64, 512] bytes, one row per 16(k) x 64(n) Marlin tile."""
    n, k2 = packed.shape
    t = packed.reshape(n // MARLIN_TILE_N, MARLIN_TILE_N, k2 // (MARLIN_TILE_K // 2), MARLIN_TILE_K // 2)
    return t.permute(2, 0, 1, 3).reshape(k2 // 8, n // MARLIN_TILE_N, -1)


def _tile_order_cause(decoded: torch.Tensor, ref: torch.Tensor) -> str | None:
    if decoded.shape[-2] % MARLIN_TILE_N or decoded.shape[-1] % (MARLIN_TILE_K // 2):
        return None
    dt, rt = _tiles(decoded), _tiles(ref)
    bad = torch.nonzero((dt != rt).any(dim=-1))
    if not bad.numel():
        return None
    where = {bytes(rt[kt, c].numpy()): (kt, c) for kt, c in bad.tolist()}
    moves = []
    for kt, c in bad.tolist():
        src = where.get(bytes(dt[kt, c].numpy()))
        if src is None:
            return None
        moves.append(((kt, c), src))
    (at, src), more = moves[0], len(moves) - 1
    return (f"wrong tile order: {len(moves)} tiles (16 k x 64 n) are in the wrong place; tile (kt={at[0]}, "
            f"c={at[1]}) holds the source tile (kt={src[0]}, c={src[1]})" + (f" and {more} more" if more else ""))


def weight_cause(qweight: torch.Tensor, decoded: torch.Tensor, ref: torch.Tensor, *, w4a8: bool) -> str:
    ref = ref.view(torch.uint8)
    if _same(swap_nibbles(decoded), ref):
        return "swapped nibbles: the even k element sits in the high nibble (fix the nibble order before packing)"
    q = qweight.contiguous()
    if q.numel() * 4 == ref.numel() and _same(q.view(torch.uint8).reshape(-1), ref.reshape(-1)):
        return "not repacked: the int32 tensor holds the checkpoint's [N, K/2] bytes unchanged"
    n, k2 = ref.shape[-2:]
    try:
        swapped = from_marlin_weight(swap_nibbles(q.view(torch.uint8)).view(torch.int32), w4a8=w4a8)
        if _same(swapped[..., :n, :k2], ref):
            return "swapped nibbles inside the packed int32 words"
        other = from_marlin_weight(q, w4a8=not w4a8)
        if _same(other[..., :n, :k2], ref):
            return (f"wrong target: packed with the {'A16 (16x64)' if w4a8 else 'W4A8 (32x32)'} tile layout, "
                    f"but the checkpoint says w4a8={w4a8}")
    except ValueError:
        pass
    return _tile_order_cause(decoded, ref) or "unknown: no single known mistake explains the bytes"


def expected_marlin_scales(ref_scale: torch.Tensor, quant: Quant, *, engine: str, sf: float,
                           w4a8: bool, permute: bool = True) -> torch.Tensor:
    """Source block scales [N, K/g] -> the uint8 bytes [K/g, N] a correct conversion stores."""
    if quant is Quant.NVFP4:
        b = nvfp4_scales_to_s0e5m3(ref_scale.view(torch.float8_e4m3fn).transpose(-1, -2),
                                   clamp=ENGINES[engine].scale_clamp, sf=sf)
        return permute_scale_columns(b) if permute else b
    b = mxfp4_scales_to_marlin(ref_scale.view(torch.uint8).transpose(-1, -2), w4a8=w4a8)
    return permute_scale_columns(b, w4a8=w4a8) if permute else b


def scale_cause(mscale: torch.Tensor, ref_scale: torch.Tensor, quant: Quant, *, engine: str, sf: float,
                act_dtype: str, w4a8: bool) -> str:
    stored = mscale.contiguous().view(torch.uint8)
    if _same(stored, expected_marlin_scales(ref_scale, quant, engine=engine, sf=sf, w4a8=w4a8, permute=False)):
        return "scales not permuted: the 8x8 column transpose and [0,2,1,3] interleave were not applied"
    if _same(stored, ref_scale.view(torch.uint8).transpose(-1, -2)) and quant is Quant.NVFP4:
        return "scales not processed: the bytes are the raw E4M3 scales (transposed), not S0E5M3"
    if quant is Quant.NVFP4:
        local_sf = vllm_rescale_factor(ref_scale.view(torch.float8_e4m3fn), act_dtype)
        tried = [(e, f) for e in ENGINES for f in ((sf, 1.0, local_sf) if ENGINES[e].rescale else (1.0,))]
        for eng, f in dict.fromkeys(tried):
            if (eng, f) == (engine, sf):
                continue
            if _same(stored, expected_marlin_scales(ref_scale, quant, engine=eng, sf=f, w4a8=False)):
                return (f"wrong target: scales processed for {eng} (rescale factor {f:g}); the checkpoint says "
                        f"{engine} (rescale factor {sf:g})")
    else:
        if _same(stored, expected_marlin_scales(ref_scale, quant, engine=engine, sf=1.0, w4a8=not w4a8)):
            return f"wrong target: scales laid out for w4a8={not w4a8}, the checkpoint says w4a8={w4a8}"
    return "unknown: no single known mistake explains the bytes"


def global_cause(stored: torch.Tensor, g: torch.Tensor, *, engine: str, act_dtype: str, sf: float) -> str:
    if stored.dtype == torch.float32 and stored.numel() == 1 and float(stored.reshape(())) == float(g.reshape(-1)[0]):
        return "global not processed: it is the raw weight_scale_2 (missing the 2**(B-7) / sf factor)"
    for eng, facts in ENGINES.items():
        for act in ACT_DTYPES:
            for f in sorted({sf, 1.0}) if facts.rescale else (1.0,):
                if (eng, act, f) == (engine, act_dtype, sf):
                    continue
                cand = nvfp4_global_to_marlin(g.float().reshape(()), fp32_global=facts.fp32_global, act_dtype=act, sf=f)
                if cand.dtype == stored.dtype and _same(cand.reshape(-1), stored.reshape(-1)):
                    return (f"wrong target: global processed for {eng}/{act} (rescale {f:g}, {cand.dtype}); "
                            f"the checkpoint says {engine}/{act_dtype}")
    return "unknown: the stored global matches no target's processing of weight_scale_2"
