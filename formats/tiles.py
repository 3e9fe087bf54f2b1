"""The one Marlin tile rule of the project, and how engines pad (docs/spec/MARLIN_FP4.md §2).

Every caller (the converters, `plan`, validate's structure.tile.tp and --kernel, both serving plugins) asks
`moe_rank_tiles`, so they cannot disagree. Each rank repacks its own shard: w13 has N = 2*I_shard
(gate | up) for gated experts and N = I_shard for non-gated ones (Nemotron-H's ReLU-squared up_proj alone),
K = H; w2 has N = H, K = I_shard. The Marlin kernel needs (N % 64, K % 128) or (N % 128, K % 64);
a quant group never straddles two ranks. On top of the kernel, the engines round sizes up when
they create their MoE parameters; a shape is `ok` only when nobody pads it, since dsv4-convert's
layout-agnostic output is one packed tensor per projection that each rank slices whole tiles from.

Padding (per rank, zeros at the end of each dimension; w13's gate and up halves separately; the numbers
live in core/targets/engines.py, which hands them in as an `EnginePadding`):
  vLLM NVFP4 MoE (>= 0.24)      I -> multiple of 64 if H % 128 == 0, else of 128; H kept
  vLLM MXFP4 (Mxfp4MoEMethod)   I -> multiple of 128, H -> multiple of 256 (torch.zeros)
  vLLM compressed-tensors MXFP4 never pads (CompressedTensorsW4A4Mxfp4MoEMethod): the rule of the MoE method the
                                engine builds for the SOURCE applies (core/sources/source_formats.py `engine_padding`)
  SGLang MXFP4 (DSv4 Marlin)    I -> 128, H -> 256 too, but torch.empty: dsv4-convert writes zeros
  SGLang NVFP4 gated MoE        never pads: a shape that breaks the kernel rule cannot be served
  SGLang NVFP4 non-gated MoE    I -> 128 inside its Marlin preparation (`if not is_gated`); the plugin creates
                                that buffer and SGLang's loader zero-fills it (`loader_fills`): a shape the
                                kernel takes unpadded is `ok` (the converter writes the unpadded projection),
                                one it does not is written padded to that multiple (`pad`)
Dense layers: `padded_dense_nk` (vLLM's marlin_padded_nk; SGLang NVFP4 dense uses the same rule).
Pure: no I/O, no engine import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .constants import MARLIN_TILE_K, MARLIN_TILE_N, MXFP4_GROUP, NVFP4_GROUP, W4A8_TILE

__all__ = [
    "GROUP_SIZE", "IMPOSSIBLE", "LAYOUT_CANDIDATES", "OK", "PAD", "EnginePadding", "PadRule", "RankTiles",
    "check_weight_tiles", "kernel_tile_ok", "moe_rank_tiles", "padded_dense_nk", "padded_moe_intermediate",
    "roundup", "working_layouts",
]

OK, PAD, IMPOSSIBLE = "ok", "pad", "impossible"
GROUP_SIZE = {"nvfp4": NVFP4_GROUP, "mxfp4": MXFP4_GROUP}
LAYOUT_CANDIDATES = tuple((tp, ep) for tp in (1, 2, 4, 8) for ep in sorted({1, tp}))  # (TP, EP) the tools offer


def roundup(x: int, m: int) -> int:
    return -(-x // m) * m


def kernel_tile_ok(n: int, k: int) -> bool:
    """The Marlin W4A16 kernel's shape rule for one [N, K] GEMM operand."""
    return (n % 64 == 0 and k % 128 == 0) or (n % 128 == 0 and k % 64 == 0)


def check_weight_tiles(n: int, k: int, *, w4a8: bool = False) -> None:
    """Raise ValueError unless one [N, K] tensor can be repacked without padding (whole tiles)."""
    tile_k, tile_n = (W4A8_TILE, W4A8_TILE) if w4a8 else (MARLIN_TILE_K, MARLIN_TILE_N)
    if k % 8:
        raise ValueError(f"K={k} must be a multiple of 8 (the uint8 -> int32 view needs whole words)")
    if k % tile_k or n % tile_n:
        raise ValueError(
            f"shape N={n}, K={k} is not a multiple of the Marlin tile ({tile_k} in K, {tile_n} in N); "
            "pad it first (formats.tiles) or use a tensor-parallel split that keeps whole tiles"
        )


def padded_dense_nk(n: int, k: int, group: int) -> tuple[int, int]:
    """vLLM's `marlin_padded_nk` (>= 0.24; SGLang's NVFP4 dense uses the same rule): the smaller, by
    N*K then N+K, of (N->64, K->lcm(128, g)) and (N->128, K->lcm(64, g))."""
    a = (roundup(n, 64), roundup(k, math.lcm(128, group)))
    b = (roundup(n, 128), roundup(k, math.lcm(64, group)))
    return min(a, b, key=lambda nk: (nk[0] * nk[1], nk[0] + nk[1]))


@dataclass(frozen=True, slots=True)
class PadRule:
    """How an engine rounds a rank's MoE sizes up when it creates the expert parameters."""
    i_multiple: int  # I_shard -> a multiple of this
    h_multiple: int  # H -> a multiple of this
    fill: str  # what fills the padding
    i_multiple_h_unaligned: int | None = None  # I's multiple instead when H % 128 != 0
    # the engine's loader pads a stored unpadded tensor itself (the plugin's buffer has a zero tail): a shape the
    # kernel takes unpadded needs no padded layout, as SGLang's non-gated NVFP4 MoE
    loader_fills: bool = False

    def multiples(self, hidden: int) -> tuple[int, int]:
        unaligned = self.i_multiple_h_unaligned is not None and hidden % 128
        return (self.i_multiple_h_unaligned if unaligned else self.i_multiple), self.h_multiple


@dataclass(frozen=True, slots=True)
class EnginePadding:
    """One engine's padding numbers, per FP4 format (None: never pads). The numbers live in the engine
    table (core/targets/engines.py `EngineFacts.padding`); formats/ imports nothing of the project, so callers
    pass this value in."""
    name: str  # the engine, for messages
    rules: dict  # FP4 format -> PadRule | None
    non_gated: dict = field(default_factory=dict)  # FP4 format -> PadRule | None for non-gated experts (else `rules`)

    def pad_rule(self, fmt: str, *, gated: bool = True) -> PadRule | None:
        """The rule for `fmt` experts, gated (gate | up) or not; None when the engine never pads them."""
        if fmt not in GROUP_SIZE:
            raise ValueError(f"unknown FP4 format {fmt!r}; expected one of {sorted(GROUP_SIZE)}")
        return self.rules[fmt] if gated or fmt not in self.non_gated else self.non_gated[fmt]

    def rule(self, fmt: str, hidden: int, *, gated: bool = True) -> tuple[int, int, str] | None:
        """(I multiple, H multiple, what fills the padding), or None when the engine never pads `fmt`."""
        rule = self.pad_rule(fmt, gated=gated)
        return None if rule is None else (*rule.multiples(hidden), rule.fill)


def padded_moe_intermediate(i: int, h: int, padding: EnginePadding) -> int:
    """I as the engine's NVFP4 MoE pads it (vLLM >= 0.24: a multiple of 64 if H % 128 == 0, else of 128)."""
    rule = padding.rule("nvfp4", h)
    return i if rule is None else roundup(i, rule[0])


@dataclass(frozen=True, slots=True)
class RankTiles:
    """The verdict for one MoE layer on one (TP, EP) split. `i_pad`/`h_pad` are the per-rank sizes the
    engine's parameters have (equal to `i_shard`/`hidden` when `status` is OK)."""
    status: str  # OK | PAD | IMPOSSIBLE
    fmt: str
    engine: str
    tp: int
    ep: int
    hidden: int
    intermediate: int
    i_shard: int = 0
    i_pad: int = 0
    h_pad: int = 0
    reason: str = ""
    gated: bool = True  # w13 = gate | up (N = 2 I); False: up alone (N = I)

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def servable(self) -> bool:
        return self.status != IMPOSSIBLE

    @property
    def moe_tp(self) -> int:
        return self.tp // self.ep if self.ep and self.tp % self.ep == 0 else 0

    @property
    def w13_nk(self) -> tuple[int, int]:
        return (2 if self.gated else 1) * self.i_pad, self.h_pad

    @property
    def w2_nk(self) -> tuple[int, int]:
        return self.h_pad, self.i_pad

    def layout(self) -> str:
        return f"TP {self.tp} / EP {self.ep}"


def _kernel_problems(i_s: int, h: int, gated: bool) -> list[str]:
    out = []
    n13, n13_text = (2 * i_s, "2*I_shard") if gated else (i_s, "I_shard")
    if not kernel_tile_ok(n13, h):
        out.append(f"w13 N={n13_text}={n13}, K=H={h} breaks the Marlin tile rule (N%64 and K%128, or N%128 and K%64)")
    if not kernel_tile_ok(h, i_s):
        out.append(f"w2 N=H={h}, K=I_shard={i_s} breaks the Marlin tile rule (N%64 and K%128, or N%128 and K%64)")
    return out


def moe_rank_tiles(fmt: str, padding: EnginePadding, *, hidden: int, intermediate: int, tp: int = 1, ep: int = 1,
                   experts: int | None = None, gated: bool = True) -> RankTiles:
    """Ok as is / needs padding to (I_pad, H_pad) per rank / impossible, with the reason, for a MoE
    layer of `fmt` experts (`gated`: w13 = gate | up; else up alone) served by an engine (its `padding`, from
    core/targets/engines.py) with tensor parallel `tp` and expert parallel `ep` (MoE TP = TP / EP: with EP each expert
    stays whole on one rank)."""
    rule = padding.pad_rule(fmt, gated=gated)  # raises for an unknown format
    pad_rule = padding.rule(fmt, hidden, gated=gated)
    engine = padding.name
    group = GROUP_SIZE[fmt]
    kind = "gated" if gated else "non-gated"
    v = dict(fmt=fmt, engine=engine, tp=tp, ep=ep, hidden=hidden, intermediate=intermediate, gated=gated)

    def impossible(reason: str, i_s: int = 0) -> RankTiles:
        return RankTiles(IMPOSSIBLE, **v, i_shard=i_s, i_pad=i_s, h_pad=hidden, reason=reason)

    if tp < 1 or ep < 1 or tp % ep:
        return impossible(f"EP {ep} must divide TP {tp} (MoE TP = TP / EP)")
    if experts is not None and experts % ep:
        return impossible(f"{experts} experts do not split evenly over EP {ep}")
    moe_tp = tp // ep
    if intermediate % moe_tp:
        return impossible(f"I={intermediate} does not split evenly over MoE TP {moe_tp}")
    i_s = intermediate // moe_tp
    if i_s % group:
        return impossible(f"I_shard={i_s} is not a multiple of the group size {group}: a quant group would "
                          "straddle two ranks (no engine pads this)", i_s)
    kernel = _kernel_problems(i_s, hidden, gated)
    if pad_rule is None:
        if kernel:
            return impossible("; ".join(kernel) + f", and {engine} does not pad a {kind} {fmt} MoE", i_s)
        return RankTiles(OK, **v, i_shard=i_s, i_pad=i_s, h_pad=hidden)
    i_mult, h_mult, fill = pad_rule
    i_pad, h_pad = roundup(i_s, i_mult), roundup(hidden, h_mult)
    if not kernel and ((i_pad, h_pad) == (i_s, hidden) or rule.loader_fills):
        return RankTiles(OK, **v, i_shard=i_s, i_pad=i_s, h_pad=hidden)
    padded_kernel = _kernel_problems(i_pad, h_pad, gated)
    if padded_kernel:
        return impossible("; ".join(padded_kernel) + f" even after {engine}'s padding of a {kind} {fmt} MoE", i_s)
    what = ([f"I_shard {i_s} -> {i_pad}"] if i_pad != i_s else []) + ([f"H {hidden} -> {h_pad}"] if h_pad != hidden else [])
    return RankTiles(PAD, **v, i_shard=i_s, i_pad=i_pad, h_pad=h_pad,
                     reason=f"{engine} pads {'' if gated else 'non-gated '}{fmt} experts per rank: {', '.join(what)} ({fill})")


def working_layouts(fmt: str, padding: EnginePadding, *, hidden: int, intermediate: int, experts: int | None = None,
                    candidates=LAYOUT_CANDIDATES, gated: bool = True) -> list[tuple[int, int]]:
    """The (TP, EP) splits among `candidates` that the engine serves without any padding."""
    return [(tp, ep) for tp, ep in candidates
            if moe_rank_tiles(fmt, padding, hidden=hidden, intermediate=intermediate, tp=tp, ep=ep,
                              experts=experts, gated=gated).ok]
