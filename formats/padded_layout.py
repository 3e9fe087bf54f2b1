"""The padded per-rank layout of a `--tp/--ep` conversion (docs/FORMAT.md "Padded layout"): geometry only.

When `formats.tiles.moe_rank_tiles` says `pad`, each expert projection is still one tensor, made of
the MoE-TP ranks' blocks in rank order, so that the engine's own narrow at `rank * size` gives rank
r its padded parameter:
  gate / up (N = I, K = H): rank r packs source rows [r*i_shard, (r+1)*i_shard) padded to [i_pad, h_pad];
      Marlin blocks are concatenated along the last dim (N): weight [h_pad/16, 2*m*i_pad], scale [h_pad/g, m*i_pad]
  down (N = H, K = I): rank r packs source columns [r*i_shard, ...) padded to [h_pad, i_pad];
      blocks are concatenated along dim -2 (K): weight [m*i_pad/16, 2*h_pad], scale [m*i_pad/g, h_pad]
The padding is zeros in source space before the codec (what the engines fill). Pure: no I/O.
Each rank block is encoded on its own, and decoded on its own (`decode_rank_blocks`): the W4A8 tile
order is not local along N, so a whole padded W4A8 tensor does not decode as one Marlin tensor.
`padding_mask` is the one rule "the padding must be zero", for validate and marlin-to-source alike.
torch is imported by the functions that make tensors: planning uses the geometry alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .tiles import GROUP_SIZE, RankTiles

if TYPE_CHECKING:
    import torch

__all__ = ["decode_rank_blocks", "encode_rank_blocks", "join_rank_blocks", "pad_source", "padded_nk",
           "padding_masks", "rank_nk", "source_rank_blocks", "unpad_source"]


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


def _source_axis(down: bool) -> int:
    # source [N, K/2]: gate/up ranks are stacked along N (rows), down ranks side by side along K (columns)
    return -1 if down else -2


def _split(t: torch.Tensor, axis: int, m: int) -> list:
    if t.shape[axis] % m:
        raise ValueError(f"a padded tensor {list(t.shape)} does not split into {m} equal rank blocks along "
                         f"dim {axis}")
    return list(t.chunk(m, dim=axis))


def decode_rank_blocks(marlin: tuple, *, down: bool, t: RankTiles, decode) -> tuple:
    """Padded Marlin tensors (weight and/or scale) -> `decode(*rank_blocks, n, k)` of each rank's blocks
    (n, k: rank_nk), each result (a tuple of [n, ...] tensors) joined in source space in rank order: for
    the codec's inverse, the whole padded source-space matrix that pad_source describes."""
    import torch

    n, k = rank_nk(down, t)
    blocks = zip(*(_split(x, _axis(down), t.moe_tp) for x in marlin))
    parts = [decode(*b, n, k) for b in blocks]
    return tuple(_cat([p[i] for p in parts], _source_axis(down), torch) for i in range(len(parts[0])))


def encode_rank_blocks(source: tuple, *, down: bool, t: RankTiles, encode) -> tuple:
    """The other direction: whole padded source-space matrices ([N, K/2] codes and/or [N, K/g] scales)
    -> `encode(*rank_blocks)` of each rank's blocks (a tuple of Marlin tensors), each joined in rank
    order as the converter writes them."""
    import torch

    blocks = zip(*(_split(x, _source_axis(down), t.moe_tp) for x in source))
    parts = [encode(*b) for b in blocks]
    return tuple(_cat([p[i] for p in parts], _axis(down), torch) for i in range(len(parts[0])))


def _cat(blocks: list, axis: int, torch):
    # through uint8: torch.cat has no CPU kernel for the float8 scale dtypes
    return torch.cat([b.contiguous().view(torch.uint8) for b in blocks], dim=axis).view(blocks[0].dtype)


def padding_masks(*, down: bool, t: RankTiles):
    """(bool [N, K/2], bool [N, K/g]) over the whole padded source-space matrix (padded_nk): True where
    the layout pads, for the packed codes and for the block scales. The padding must hold zero bytes:
    the engines fill zeros, and only then is unpad_source the exact inverse of pad_source."""
    import torch

    g = GROUP_SIZE[t.fmt]
    n, k = padded_nk(down, t)
    w, s = torch.ones(n, k // 2, dtype=torch.bool), torch.ones(n, k // g, dtype=torch.bool)
    for r in range(t.moe_tp):
        rows, wc, sc = _rank_view(t, down, g, r, padded=True)
        w[rows, wc], s[rows, sc] = False, False
    return w, s


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
    The converter encodes each rank's block of it on its own (encode_rank_blocks). The result is on the
    source tensors' device."""
    import torch

    g = GROUP_SIZE[t.fmt]
    n, k = padded_nk(down, t)
    w = torch.zeros(n, k // 2, dtype=torch.uint8, device=weight.device)
    s = torch.zeros(n, k // g, dtype=torch.uint8, device=weight.device)
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
    wpad, spad = padding_masks(down=down, t=t)
    zero = not ((wv != 0) & wpad).any() and not ((sv != 0) & spad).any()
    return w, s.view(scale.dtype), zero
