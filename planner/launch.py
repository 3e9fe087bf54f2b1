"""`dsv4-convert plan`: from headers alone, which TP/EP splits work, how much memory each GPU needs,
the memory flag to pass, the MoE backend to force, and a launch command (docs/PLAN.md).

Memory model (per GPU, GiB): weights = expert bytes / TP + other bytes / TP (attention is TP-sharded,
embeddings and head are vocab-parallel; the few replicated norms are ignored) plus fixed reserves
for activations, CUDA graphs and the runtime (CUDA context, NCCL buffers, allocator slack). A source
checkpoint also needs room to repack one layer's experts at load time; a converted one does not.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field

from ..core.checkpoint.tensor_model import Checkpoint, gated_experts
from ..core.record.converted_config import record_or_none
from ..core.sources.mtp import draft_bytes
from ..core.sources.side_tables import engram_table_bytes, vision_bytes
from ..core.sources.source_formats import engine_padding
from ..core.sources.structure import model_dims
from ..core.targets.engines import (
    DEFAULT_ENGINE,
    ENGINES,
    QUANT_METHOD,
    launch_command,
    registration_log_line,
)
from ..core.targets.parallel_rules import split_dims, split_refusals
from ..core.targets.verdicts import verdict
from ..core.version import install_sentence
from ..formats.tiles import GROUP_SIZE, PAD, RankTiles, moe_rank_tiles
from .launch_engram import engram_placements, engram_reason, weights_per_gpu

__all__ = [
    "ACTIVATION_GIB",
    "CUDA_GRAPH_GIB",
    "MIN_KV_GIB",
    "RUNTIME_GIB",
    "ConfigVerdict",
    "LaunchPlan",
    "ModelShape",
    "make_plan",
    "padding_factor",
    "shape_from_checkpoint",
]

GIB = 1 << 30
ACTIVATION_GIB = 2.0  # peak activations of a chunked prefill (8k tokens) incl. the MoE intermediate
CUDA_GRAPH_GIB = 1.5  # captured decode graphs for batch sizes up to ~256
RUNTIME_GIB = 1.0  # CUDA context, NCCL buffers, allocator fragmentation
MIN_KV_GIB = 4.0  # below this the KV cache holds too few tokens to serve anything useful
_SM100_ONLY = "trtllm-gen / flashinfer_trtllm_routed MoE kernels are built for SM100 (B200/GB200) only"


@dataclass(frozen=True)
class ModelShape:
    name: str
    format: str
    quant: str  # nvfp4 | mxfp4 (the routed experts of the trunk)
    hidden: int
    intermediate: int
    experts: int
    layers: int
    expert_bytes: int
    other_bytes: int
    largest_layer_expert_bytes: int
    converted: bool
    converted_for: str | None = None  # target engine of a converted checkpoint
    converted_layout: tuple[int, int] | None = None  # (TP, EP) of a --tp/--ep conversion (tp_layout)
    w4a8: bool = False  # a W4A8 (fp8 activations) conversion: only some engine releases serve it
    # engine -> why its plugin is not proven to serve this model once converted (core/targets/served.py), None: served
    not_served: dict = field(default_factory=dict)
    roles: int = 3  # projections per expert: 3 gated (gate, up, down), 2 non-gated (Nemotron-H: up, down)
    gated: bool = True  # the tile rule's w13: gate | up, or up alone (core/checkpoint/tensor_model.py gated_experts)
    draft_bytes: int = 0  # copied MTP (draft) layers (core/sources/mtp.py): loaded only for speculative decoding
    # engine -> what its TP divisibility rules read from config.json (core/targets/parallel_rules.py): heads, KV heads, ...
    split_dims: dict = field(default_factory=dict)
    engram_bytes: int = 0  # DeepSeek-V4.1's Engram tables (core/sources/side_tables.py), part of other_bytes
    vision_bytes: int = 0  # its vision tower, part of other_bytes: whole on every GPU
    source_format: str | None = None  # the experts' source format (a conversion's recorded one): its engine padding


def shape_from_checkpoint(ckpt: Checkpoint) -> ModelShape:
    dims = model_dims(ckpt.config)
    per_layer, quants = defaultdict(dict), defaultdict(int)
    hidden = intermediate = None
    for p in ckpt.projections:
        # by name: a stacked tensor (gpt-oss) feeds every projection of its layer but is counted once
        per_layer[p.layer].update((r.name, r.nbytes) for r in p.source_refs)
        if not p.layer.startswith("mtp"):
            quants[p.quant.value] += 1
        if p.role.value == "down":
            hidden, intermediate = p.n, p.k
    per_layer = {layer: sum(refs.values()) for layer, refs in per_layer.items()}
    expert_bytes = sum(per_layer.values())
    total = sum(t.nbytes for t in ckpt.tensors.values())
    draft = draft_bytes(ckpt.tensors, ckpt.config, ckpt.projection_names)
    record = record_or_none(ckpt.config) if ckpt.format.converted else None
    experts = dims["experts"] or len({p.expert for p in ckpt.projections})
    layout = None
    rec = record.split() if record else None  # a block that does not parse: validate's marlin.config says why
    if rec is not None:
        layout = rec[0], rec[1]
        padded = next(iter(rec[2].values()), None)  # a padded tensor's shape is not the model's H / I
        if padded is not None:
            hidden, intermediate = padded.hidden, padded.intermediate
    return ModelShape(name=ckpt.root.name, format=ckpt.format.value,
                      quant=max(quants, key=quants.get) if quants else "mxfp4",
                      hidden=dims["hidden"] or hidden or 0, intermediate=dims["intermediate"] or intermediate or 0,
                      experts=experts, layers=len([layer for layer in per_layer if not layer.startswith("mtp")]),
                      expert_bytes=expert_bytes, other_bytes=total - expert_bytes - draft, draft_bytes=draft,
                      largest_layer_expert_bytes=max(per_layer.values(), default=0),
                      converted=ckpt.format.converted, converted_for=record.target_engine if record else None,
                      converted_layout=layout, w4a8=bool(record and record.w4a8),
                      roles=len({p.role for p in ckpt.projections}) or 3,
                      gated=gated_experts(p.role for p in ckpt.projections) or not ckpt.projections,
                      split_dims={e: split_dims(ckpt.config, e) for e in ENGINES},
                      engram_bytes=engram_table_bytes(ckpt.tensors), vision_bytes=vision_bytes(ckpt.tensors), source_format=record.source_format if record else ckpt.format.value,
                      not_served={e: verdict(ckpt.config, ckpt.hf_quant_config, ckpt.format.value, e, ckpt.tensors)
                                  for e in ENGINES})


@dataclass
class ConfigVerdict:
    tp: int
    ep: int
    tiles: RankTiles
    weights_gib: float
    repack_gib: float
    kv_gib: float
    fits: bool
    valid: bool
    reasons: list[str] = field(default_factory=list)
    padding_factor: float = 1.0  # expert bytes per GPU with the engine's padding / without (sources)


@dataclass
class LaunchPlan:
    shape: ModelShape
    gpus: int
    gpu_mem_gib: float
    arch: str
    engine: str
    act_dtype: str
    mem_flag: str
    mem_value: float
    backend_flag: str
    backend_why: str
    candidates: list[ConfigVerdict]
    chosen: ConfigVerdict | None
    command: str | None
    reasoning: list[str]
    not_served: str | None = None  # why the engine will not load it (then no command, no recommendation)

    def to_json(self) -> dict:
        return {
            "schema_version": 1, "model": asdict(self.shape),
            "hardware": {"gpus": self.gpus, "gpu_mem_gib": self.gpu_mem_gib, "arch": self.arch},
            "engine": self.engine, "act_dtype": self.act_dtype,
            "memory_flag": {"flag": self.mem_flag, "value": self.mem_value},
            "moe_backend": {"flag": self.backend_flag, "why": self.backend_why},
            "candidates": [{"tp": c.tp, "ep": c.ep, "moe_tp": c.tiles.moe_tp, "i_shard": c.tiles.i_shard,
                            "tiles": c.tiles.status, "tiles_ok": c.tiles.ok, "servable": c.tiles.servable,
                            "padded": None if c.tiles.status != PAD else {"i_shard": c.tiles.i_pad,
                                                                          "hidden": c.tiles.h_pad},
                            "tiles_reason": c.tiles.reason or None, "padding_factor": round(c.padding_factor, 4),
                            "weights_gib": round(c.weights_gib, 2),
                            "repack_gib": round(c.repack_gib, 2), "kv_gib": round(c.kv_gib, 2), "fits": c.fits,
                            "valid": c.valid, "reasons": c.reasons} for c in self.candidates],
            "recommended": None if self.chosen is None else {"tp": self.chosen.tp, "ep": self.chosen.ep},
            "command": self.command, "reasoning": self.reasoning,
        }

    def render_text(self) -> str:
        rows = [("TP", "EP", "I/rank", "tiles", "weights/GPU", "KV/GPU", "verdict")]
        for c in self.candidates:
            rows.append((str(c.tp), str(c.ep), str(c.tiles.i_shard), "ok" if c.tiles.ok else
                         ("pad" if c.tiles.servable else "NO"), f"{c.weights_gib:.1f} GiB", f"{c.kv_gib:.1f} GiB",
                         "valid" if c.valid else "; ".join(c.reasons)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        table = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
        title = (f"plan for {self.shape.name} ({self.shape.format}) on {self.gpus} x {self.gpu_mem_gib:g} GiB "
                 f"{self.arch}, {self.engine}")
        out = [title, ""] + table + [""] + [f"- {line}" for line in self.reasoning]
        out += ["", "launch:" if self.command else "NOT SERVED: no launch command" if self.not_served
                else "no configuration fits; see the reasons above",
                f"  {self.command}" if self.command else ""]
        return "\n".join(out).rstrip()


def padding_factor(tiles: RankTiles) -> float:
    """How much larger a rank's experts are with the engine's padding: w13 [2*I_pad, H_pad] and w2
    [H_pad, I_pad] against [2*I_shard, H] and [H, I_shard] (1 when nothing is padded)."""
    if tiles.status != PAD or not tiles.i_shard or not tiles.hidden:
        return 1.0
    return (tiles.i_pad * tiles.h_pad) / (tiles.i_shard * tiles.hidden)


def _mem_flag(engine: str, gpu_mem: float) -> tuple[str, float]:
    flag = ENGINES[engine].memory_flag
    if not ENGINES[engine].memory_profiled:
        # SGLang's static pool (weights + KV) is this fraction; activations and graphs live in the rest
        frac = (gpu_mem - ACTIVATION_GIB - CUDA_GRAPH_GIB - RUNTIME_GIB) / gpu_mem
        return flag, max(0.5, min(0.92, int(frac * 100) / 100))
    # vLLM profiles activations and graphs itself inside this budget; leave the runtime outside it
    frac = (gpu_mem - RUNTIME_GIB) / gpu_mem
    return flag, max(0.5, min(0.95, int(frac * 100) / 100))


def _backend(engine: str, arch: str) -> tuple[str, str]:
    flag = ENGINES[engine].moe_backend_flag
    if arch == "sm_120":
        return flag, f"{ENGINES[engine].sm120_moe_default}; the {_SM100_ONLY}, so force Marlin W4A16 on sm_120 (RTX PRO 6000 / RTX 50xx)"
    if arch == "sm_90":
        return flag, f"the {_SM100_ONLY}; on sm_90 Marlin is the FP4 MoE path (vLLM may prefer Humming)"
    return flag, ("on SM100 the native FP4 MoE kernels are faster for a source checkpoint; a dsv4-convert "
                  "checkpoint holds Marlin tensors and must still use Marlin")


def make_plan(shape: ModelShape, *, gpus: int, gpu_mem_gib: float, arch: str = "sm_120", engine: str = DEFAULT_ENGINE,
              act_dtype: str = "bfloat16", path: str = "PATH", engram: str = "auto") -> LaunchPlan:
    """`engram`: where DeepSeek-V4.1's Engram tables go, `gpu`, `host` or `auto` (the engine's default, else the
    other placement where only that one fits)."""
    placements = engram_placements(shape, engine, engram)
    for engram_on_gpu in placements:
        plan = _make_plan(shape, gpus=gpus, gpu_mem_gib=gpu_mem_gib, arch=arch, engine=engine, act_dtype=act_dtype,
                          path=path, engram_on_gpu=engram_on_gpu, tried=placements)
        if plan.chosen is not None:
            break
    return plan


def _make_plan(shape: ModelShape, *, gpus: int, gpu_mem_gib: float, arch: str, engine: str, act_dtype: str,
               path: str, engram_on_gpu: bool | None, tried: list) -> LaunchPlan:
    group = GROUP_SIZE[shape.quant]
    mem_flag, mem = _mem_flag(engine, gpu_mem_gib)
    backend, why = _backend(engine, arch)
    reasoning = []
    candidates = []
    for tp in (t for t in (1, 2, 4, 8, 16) if t <= gpus):
        for ep in sorted({1, tp}):
            tiles = moe_rank_tiles(shape.quant, engine_padding(engine, shape.source_format), hidden=shape.hidden, intermediate=shape.intermediate,
                                   tp=tp, ep=ep, experts=shape.experts, gated=shape.gated)
            # a source the engine pads holds padded experts per rank; a converted checkpoint's bytes are final
            grow = 1.0 if shape.converted else padding_factor(tiles)
            weights = weights_per_gpu(shape, tp, grow, bool(engram_on_gpu))
            repack = 0.0 if shape.converted else shape.largest_layer_expert_bytes * grow / tp / GIB
            if not ENGINES[engine].memory_profiled:
                kv = mem * gpu_mem_gib - weights
            else:
                kv = mem * gpu_mem_gib - weights - ACTIVATION_GIB - CUDA_GRAPH_GIB
            loads = weights + repack + RUNTIME_GIB <= gpu_mem_gib
            fits = loads and kv >= MIN_KV_GIB
            reasons = []
            fixed = shape.converted_layout
            refused = split_refusals(shape.split_dims.get(engine, {}), tp)
            if refused:  # the engine refuses the whole model at this TP, whatever the experts allow
                reasons.append(f"{engine} refuses TP {tp} for this model: {'; '.join(refused)}")
            if fixed is not None and (tp, ep) != fixed:
                reasons.append(f"converted for TP {fixed[0]} / EP {fixed[1]} only (quantization_config.tp_layout)")
            elif not tiles.servable:
                reasons.append("tile rule: " + tiles.reason)
            elif not tiles.ok:
                reasons.append("needs padding: " + tiles.reason
                               + (f" (+{grow - 1:.1%} expert bytes per GPU)" if grow > 1 else ""))
                if shape.converted and fixed is None:
                    reasons.append("converted tensors cannot be sliced for this split")
            if not loads:
                reasons.append(f"weights {weights:.1f} GiB" + (f" + repack {repack:.1f} GiB" if repack else "")
                               + f" + fixed runtime overhead {RUNTIME_GIB:g} GiB do not fit {gpu_mem_gib:g} GiB"
                               + ("; the fixed overhead is the cause" if weights + repack <= gpu_mem_gib else ""))
            elif kv < MIN_KV_GIB:
                reasons.append(f"only {kv:.1f} GiB left for the KV cache (< {MIN_KV_GIB:g})")
            if fixed is not None:  # written padded (or not) for exactly this split
                valid = (tp, ep) == fixed and tiles.servable and fits
            else:
                valid = (tiles.ok if shape.converted else tiles.servable) and fits
            valid = valid and not refused
            candidates.append(ConfigVerdict(tp, ep, tiles, weights, repack, kv, fits, valid, reasons, grow))
    usable = [c for c in candidates if c.valid]
    chosen = max(usable, key=lambda c: (c.tp, c.tiles.ok, -c.ep), default=None)
    reasoning.append(f"experts: {shape.layers} layers x {shape.experts} x {shape.roles} projections, H={shape.hidden}, "
                     f"I={shape.intermediate}, {shape.quant} (group {group}); {shape.expert_bytes / GIB:.1f} GiB of "
                     f"experts + {shape.other_bytes / GIB:.1f} GiB of other weights" + (
                         f"; the MTP (draft) layers' {shape.draft_bytes / GIB:.1f} GiB are not counted (loaded only "
                         "with speculative decoding)" if shape.draft_bytes else ""))
    reasoning.append(f"tile rule per rank: w13 [N={'2*' if shape.gated else ''}I/TP, K=H] and w2 [N=H, K=I/TP] "
                     "need (N%64, K%128) or "
                     f"(N%128, K%64), and I/TP % {group} == 0; with EP each expert stays whole on one rank "
                     "(MoE TP = TP / EP)")
    if dims := shape.split_dims.get(engine):
        reasoning.append(f"{engine} splits over TP: " + ", ".join(f"{v} {k}" for k, v in dims.items())
                         + " (heads divisible by TP, KV heads and TP one dividing the other: core/targets/parallel_rules.py)")
    reasoning.append(f"memory per GPU = weights / TP + activations {ACTIVATION_GIB:g} + CUDA graphs "
                     f"{CUDA_GRAPH_GIB:g} + runtime {RUNTIME_GIB:g} GiB; the rest is KV cache (need >= "
                     f"{MIN_KV_GIB:g} GiB)" + ("" if shape.converted else "; loading a source checkpoint also "
                                               "repacks one layer of experts at a time (repack column), which a "
                                               "dsv4-convert checkpoint avoids"))
    reasoning.append(f"{mem_flag} {mem:.2f}: " + (
        "SGLang's static pool (weights + KV) gets this share; activations, CUDA graphs and the runtime need "
        f"about {ACTIVATION_GIB + CUDA_GRAPH_GIB + RUNTIME_GIB:g} GiB outside it" if not ENGINES[engine].memory_profiled else
        f"vLLM may use this share; it profiles activations and CUDA graphs inside it, leaving "
        f"{RUNTIME_GIB:g} GiB for the CUDA context outside"))
    reasoning.append(f"MoE backend {backend}: {why}")
    if engram_on_gpu is not None:
        reasoning.append(engram_reason(shape, engine, engram_on_gpu, tried))
    not_served = shape.not_served.get(engine)
    if not_served:  # what will not load gets no launch command and no recommendation
        chosen = None
        reasoning.append(f"NOT SERVED: {engine} with the dsv4-convert plugin is not proven to load this model "
                         f"{'as converted' if shape.converted else 'once converted'}: {not_served} "
                         "(the converter refuses it: convert.unservable_family); no launch command is given")
    if shape.w4a8:
        reasoning.append(f"W4A8 (fp8 activations) checkpoint: served by {ENGINES[engine].w4a8_versions()} only "
                         "(the engine table, core/targets/engines.py); newer releases refuse it at start-up: install a "
                         "release listed, or convert the source again without --w4a8")
    if shape.converted:
        reasoning.append("a dsv4-convert checkpoint needs the dsv4-convert plugin in the server's environment "
                         f"({install_sentence()}; no --quantization flag: the engine reads quant_method "
                         f"{QUANT_METHOD} from config.json); check the log for "
                         f"`{registration_log_line(engine, ENGINES[engine].version)}`")
    if chosen is not None:
        reasoning.append(f"recommended: TP {chosen.tp}" + (f" with EP {chosen.ep}" if chosen.ep > 1 else "")
                         + f" (the largest valid split on {gpus} GPUs; {chosen.weights_gib:.1f} GiB weights and "
                         f"{chosen.kv_gib:.1f} GiB KV cache per GPU)")
        padded = [c for c in candidates if c.tp == chosen.tp and c.ep != chosen.ep and c.tiles.status == PAD]
        if chosen.tiles.status == PAD:  # the reasoning follows the verdict: EP cannot undo a padded H
            reasoning.append(f"TP {chosen.tp}" + (f" / EP {chosen.ep}" if chosen.ep > 1 else "")
                             + f" is padded: {chosen.tiles.reason}" + (
                                 f"; EP {chosen.ep} keeps each expert whole on one rank, but its shape still "
                                 "needs the padding" if chosen.ep > 1 else ""))
        elif chosen.ep > 1 and padded:
            reasoning.append(f"EP {chosen.ep} keeps each expert whole on one rank, so nothing is padded; TP "
                             f"{chosen.tp} without EP would need padding ({padded[0].tiles.reason})")
        if not shape.converted:
            reasoning.append(
                f"to convert for it: dsv4-convert {'nvfp4' if shape.quant == 'nvfp4' else 'mxfp4'}-to-marlin "
                f"--target {engine} --tp {chosen.tp}" + (f" --ep {chosen.ep}" if chosen.ep > 1 else "")
                + (" (the experts are written padded as the engine pads them; the output then serves this "
                   "split only)" if chosen.tiles.status == PAD else
                   " (or without --tp: this shape needs no padding, so the output is layout-agnostic)"))
        if chosen.tp < gpus:
            reasoning.append(f"{gpus // chosen.tp} replicas of TP {chosen.tp} (data parallel) would use all {gpus} GPUs")
    command = None if chosen is None else launch_command(engine, path, tp=chosen.tp, ep=chosen.ep,
                                                         act_dtype=act_dtype, memory=mem)
    if command is not None and engram_on_gpu is not None:
        facts = ENGINES[engine].engram
        command = (facts.on_gpu if engram_on_gpu else facts.on_host).format(cmd=command)
    return LaunchPlan(shape, gpus, gpu_mem_gib, arch, engine, act_dtype, mem_flag, mem, backend, why, candidates,
                      chosen, command, reasoning, not_served)
