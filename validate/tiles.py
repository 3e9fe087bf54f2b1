"""Marlin tile rules per tensor-parallel rank for a MoE (spec MARLIN_FP4.md §2 "Size constraints").

Each rank repacks its own shard: w13 has N = 2*I_shard, K = H; w2 has N = H, K = I_shard. The
kernel needs (N % 64 == 0 and K % 128 == 0) or (N % 128 == 0 and K % 64 == 0), and K_shard % g == 0
(a quant group never straddles ranks; nobody pads that). dsv4-convert's output is packed per
projection, so a rank's slice is only valid when I_shard % 64 == 0 (docs/FORMAT.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dsv4_convert.formats.marlin import padded_moe_intermediate

__all__ = ["ShardVerdict", "moe_shard_verdict", "tile_ok"]


def tile_ok(n: int, k: int) -> bool:
    return (n % 64 == 0 and k % 128 == 0) or (n % 128 == 0 and k % 64 == 0)


def _roundup(x: int, m: int) -> int:
    return -(-x // m) * m


@dataclass(frozen=True)
class ShardVerdict:
    """`ok`: serves without padding; `servable`: the engine can serve it (maybe by padding);
    `sliceable`: a dsv4-convert checkpoint can be sliced for this split."""
    tp: int
    ep: int
    moe_tp: int
    i_shard: int
    ok: bool
    servable: bool
    sliceable: bool
    problems: list[str] = field(default_factory=list)
    padding: str = ""


def moe_shard_verdict(*, hidden: int, intermediate: int, experts: int, group: int, quant: str, tp: int,
                      ep: int, engine: str) -> ShardVerdict:
    problems: list[str] = []
    if tp < 1 or ep < 1 or tp % ep:
        return ShardVerdict(tp, ep, 0, 0, False, False, False, [f"EP {ep} must divide TP {tp} (MoE TP = TP / EP)"])
    moe_tp = tp // ep
    if experts % ep:
        problems.append(f"{experts} experts do not split evenly over EP {ep}")
    if intermediate % moe_tp:
        problems.append(f"I={intermediate} is not divisible by MoE TP {moe_tp}")
        return ShardVerdict(tp, ep, moe_tp, 0, False, False, False, problems)
    i_s = intermediate // moe_tp
    if i_s % group:
        problems.append(f"I_shard={i_s} is not a multiple of the group size {group}: a quant group would "
                        "straddle two ranks (no engine pads this)")
        return ShardVerdict(tp, ep, moe_tp, i_s, False, False, False, problems)
    w13, w2 = tile_ok(2 * i_s, hidden), tile_ok(hidden, i_s)
    if not w13:
        problems.append(f"w13 shard N=2*I_shard={2 * i_s}, K=H={hidden} breaks the tile rule "
                        "(N%64 and K%128, or N%128 and K%64)")
    if not w2:
        problems.append(f"w2 shard N=H={hidden}, K=I_shard={i_s} breaks the tile rule "
                        "(N%64 and K%128, or N%128 and K%64)")
    sliceable = i_s % 64 == 0 and hidden % 64 == 0
    if not sliceable:
        problems.append(f"I_shard={i_s} is not a multiple of 64: converted (pre-packed) tensors cannot be "
                        "sliced for this split; dsv4-convert refuses the shape")
    ok = w13 and w2 and not (experts % ep)
    padding, servable = "", ok
    if not (w13 and w2):
        if quant == "nvfp4" and engine == "vllm":
            padding = (f"vLLM (>= 0.24) pads I_shard {i_s} -> {padded_moe_intermediate(i_s, hidden)} with zeros "
                       "(gate and up halves separately, w2's K too) at load time")
            servable = True
        elif quant == "nvfp4":
            padding = "SGLang does not pad a gated NVFP4 MoE: the Marlin kernel refuses this shape"
        elif engine == "vllm":
            padding = (f"vLLM's Mxfp4MoEMethod rounds I -> {_roundup(i_s, 128)} and H -> {_roundup(hidden, 256)} "
                       "with zero-filled weights and scales at create_weights")
            servable = True
        else:
            padding = ("SGLang's Mxfp4MarlinMoEMethod rounds I -> 128 / H -> 256 but leaves the padding "
                       "uninitialised (torch.empty, scale byte 127): not reproducible, avoid this shape")
        servable = servable and not (experts % ep)
    return ShardVerdict(tp, ep, moe_tp, i_s, ok, servable, sliceable, problems, padding)
