"""The padded per-rank layout of a `--tp/--ep` conversion (docs/FORMAT.md "Padded layout"): geometry only.

When `formats.tiles.moe_rank_tiles` says `pad`, each expert projection is still one tensor, made of
the MoE-TP ranks' blocks in rank order, so that the engine's own narrow at `rank * size` gives rank
r its padded parameter:
  gate / up (N = I, K = H): rank r packs source rows [r*i_shard, (r+1)*i_shard) padded to [i_pad, h_pad];
      Marlin blocks are concatenated along the last dim (N): weight [h_pad/16, 2*m*i_pad], scale [h_pad/g, m*i_pad]
  down (N = H, K = I): rank r packs source columns [r*i_shard, ...) padded to [h_pad, i_pad];
      blocks are concatenated along dim -2 (K): weight [m*i_pad/16, 2*h_pad], scale [m*i_pad/g, h_pad]
The padding is zeros in source space before the codec (what the engines fill). Pure: no I/O.
torch is imported by the functions that make tensors: planning uses the geometry alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsv4_convert.formats.tiles import GROUP_SIZE, RankTiles

if TYPE_CHECKING:
    import torch

__all__ = ["join_rank_blocks", "pad_source", "padded_nk", "rank_nk", "source_rank_blocks", "unpad_source"]


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
    import torch

    return torch.cat(list(blocks), dim=_axis(down))


def _rank_view(t: RankTiles, down: bool, group: int, r: int, padded: bool):
    """(row slice, weight column slice, scale column slice) of rank r's real block, in the whole
    padded source-space matrix (padded=True) or in the unpadded source (padded=False)."""
    step, real = (t.i_pad if padded else t.i_shard), t.i_shard
    if down:  # ranks side by side along K (columns); rows are H (padded to h_pad at the end)
        c0 = r * step
        return slice(0, t.hidden), slice(c0 // 2, (c0 + real) // 2), slice(c0 // group, (c0 + real) // group)
    r0 = r * step  # ranks stacked along N (rows); columns are H
    return slice(r0, r0 + real), slice(0, t.hidden // 2), slice(0, t.hidden // group)


def pad_source(weight: torch.Tensor, scale: torch.Tensor, *, down: bool, t: RankTiles):
    """A source projection (packed [N, K/2], scale bytes [N, K/g]) -> the whole padded source-space
    matrix its padded Marlin tensor decodes to (each rank's block zero-padded, blocks in rank order).
    Marlin packing is tile-local along N and K, so packing this whole matrix gives the same bytes as
    packing each rank's block and concatenating."""
    import torch

    g = GROUP_SIZE[t.fmt]
    n, k = padded_nk(down, t)
    w = torch.zeros(n, k // 2, dtype=torch.uint8)
    s = torch.zeros(n, k // g, dtype=torch.uint8)
    wv, sv = weight.view(torch.uint8), scale.view(torch.uint8)
    for r in range(t.moe_tp):
        rows, wc, sc = _rank_view(t, down, g, r, padded=True)
        srows, swc, ssc = _rank_view(t, down, g, r, padded=False)
        w[rows, wc], s[rows, sc] = wv[srows, swc], sv[srows, ssc]
    return w, s.view(scale.dtype)


def unpad_source(weight: torch.Tensor, scale: torch.Tensor, *, down: bool, t: RankTiles):
    """Inverse of pad_source: (source packed [N, K/2], scale [N, K/g], padding_is_zero). The padding
    bytes must all be zero for the result to be the exact inverse; the flag says whether they are."""
    import torch

    g = GROUP_SIZE[t.fmt]
    wv, sv = weight.view(torch.uint8), scale.view(torch.uint8)
    n, k = (t.hidden, t.moe_tp * t.i_shard) if down else (t.moe_tp * t.i_shard, t.hidden)
    w = torch.empty(n, k // 2, dtype=torch.uint8)
    s = torch.empty(n, k // g, dtype=torch.uint8)
    for r in range(t.moe_tp):
        rows, wc, sc = _rank_view(t, down, g, r, padded=True)
        srows, swc, ssc = _rank_view(t, down, g, r, padded=False)
        w[srows, swc], s[srows, ssc] = wv[rows, wc], sv[rows, sc]
    zero = int(wv.sum()) == int(w.sum()) and int(sv.sum()) == int(s.sum())  # bytes are non-negative
    return w, s.view(scale.dtype), zero
