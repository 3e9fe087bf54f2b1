"""The padded per-rank layout of a `--tp/--ep` conversion (docs/FORMAT.md "Padded layout"): geometry only.

When `formats.tiles.moe_rank_tiles` says `pad`, each expert projection is still one tensor, made of
the MoE-TP ranks' blocks in rank order, so that the engine's own narrow at `rank * size` gives rank
r its padded parameter:
  gate / up (N = I, K = H): rank r packs source rows [r*i_shard, (r+1)*i_shard) padded to [i_pad, h_pad];
      Marlin blocks are concatenated along the last dim (N): weight [h_pad/16, 2*m*i_pad], scale [h_pad/g, m*i_pad]
  down (N = H, K = I): rank r packs source columns [r*i_shard, ...) padded to [h_pad, i_pad];
      blocks are concatenated along dim -2 (K): weight [m*i_pad/16, 2*h_pad], scale [m*i_pad/g, h_pad]
The padding is zeros in source space before the codec (what the engines fill). Pure: no I/O.
"""

from __future__ import annotations

import torch

from dsv4_convert.formats.tiles import GROUP_SIZE, PAD, RankTiles, moe_rank_tiles

__all__ = ["join_rank_blocks", "layout_record", "marlin_rank_blocks", "padded_nk", "rank_nk", "read_layout_record",
           "source_rank_blocks", "unpad_rank_block"]


def rank_nk(down: bool, t: RankTiles) -> tuple[int, int]:
    """One rank's padded [N, K] of a gate/up (down=False) or down projection."""
    return (t.h_pad, t.i_pad) if down else (t.i_pad, t.h_pad)


def padded_nk(down: bool, t: RankTiles) -> tuple[int, int]:
    """The whole output tensor's logical Marlin [N, K] (all MoE-TP ranks' blocks)."""
    m = t.moe_tp
    return (t.h_pad, m * t.i_pad) if down else (m * t.i_pad, t.h_pad)


def _axis(down: bool) -> int:
    # source: gate/up split rows (N), down splits columns (K); Marlin [K/16, 2N]: N is the last dim, K dim -2
    return -2 if down else -1


def source_rank_blocks(weight: torch.Tensor, scale: torch.Tensor, *, down: bool, t: RankTiles):
    """Rank r's unpadded slice (packed [N_r, K_r/2], scale [N_r, K_r/g]) of one source projection, r = 0.. m-1."""
    g, s = GROUP_SIZE[t.fmt], t.i_shard
    for r in range(t.moe_tp):
        if down:
            yield weight[..., r * s // 2:(r + 1) * s // 2], scale[..., r * s // g:(r + 1) * s // g]
        else:
            yield weight[..., r * s:(r + 1) * s, :], scale[..., r * s:(r + 1) * s, :]


def join_rank_blocks(blocks, *, down: bool) -> torch.Tensor:
    """Concatenate per-rank Marlin tensors (weight or scale) in rank order."""
    return torch.cat(list(blocks), dim=_axis(down))


def marlin_rank_blocks(tensor: torch.Tensor, *, down: bool, t: RankTiles) -> tuple[torch.Tensor, ...]:
    """Split a padded Marlin weight or scale back into its MoE-TP ranks' blocks."""
    return tuple(torch.chunk(tensor, t.moe_tp, dim=_axis(down)))


def unpad_rank_block(weight: torch.Tensor, scale: torch.Tensor, *, down: bool, t: RankTiles):
    """(decoded padded rank block [n_pad, k_pad/2], scale [n_pad, k_pad/g]) -> (real part, padding is zero).
    The real part is the rank's source slice; `padding is zero` is False when any padding byte is set."""
    g = GROUP_SIZE[t.fmt]
    n, k = (t.hidden, t.i_shard) if down else (t.i_shard, t.hidden)
    w, s = weight.view(torch.uint8), scale.view(torch.uint8)
    real_w, real_s = w[..., :n, :k // 2], s[..., :n, :k // g]
    zero = bool(w.sum() == real_w.sum() and s.sum() == real_s.sum())  # bytes are non-negative
    return real_w, real_s, zero


def layout_record(tp: int, ep: int, tiles: dict[str, RankTiles]) -> dict:
    """quantization_config.tp_layout for a `--tp/--ep` conversion."""
    return {"tp": tp, "ep": ep, "containers": {c: {
        "hidden": v.hidden, "intermediate": v.intermediate, "i_shard": v.i_shard, "i_pad": v.i_pad,
        "h_pad": v.h_pad, "status": v.status} for c, v in tiles.items()}}


def read_layout_record(block: dict) -> tuple[int, int, dict[str, RankTiles]] | None:
    """(tp, ep, container -> RankTiles of the padded containers) from a quantization_config, or None
    without `tp_layout`. Each verdict is recomputed with the one tile rule from the recorded sizes and
    must match the record; ValueError (with the reason) when the record is not one this tool writes."""
    rec = block.get("tp_layout")
    if rec is None:
        return None
    try:
        tp, ep = int(rec["tp"]), int(rec["ep"])
        engine, experts = block["target_engine"], block.get("experts") or {}
        out = {}
        for name, c in rec["containers"].items():
            v = moe_rank_tiles(experts[name], engine, hidden=int(c["hidden"]), intermediate=int(c["intermediate"]),
                               tp=tp, ep=ep)
            got = (c["status"], c["i_shard"], c["i_pad"], c["h_pad"])
            if got != (v.status, v.i_shard, v.i_pad, v.h_pad):
                raise ValueError(f"tp_layout.containers[{name!r}] records {got}, the tile rule gives "
                                 f"{(v.status, v.i_shard, v.i_pad, v.h_pad)}")
            if v.status == PAD:
                out[name] = v
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"tp_layout is not a dsv4-convert layout record ({type(e).__name__}: {e})") from None
    return tp, ep, out
