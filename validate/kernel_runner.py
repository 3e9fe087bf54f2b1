"""`validate --kernel`: every MoE layer's experts through the engine's own Marlin kernels on a GPU.

Per layer, the chosen experts are stacked as the engine stacks them (w13 = gate rows then up rows
with the gate's global, or for non-gated experts, Nemotron-H's, the up projection alone: the engines'
one-shard w13 with N = I; w2), in chunks so that GPU memory stays bounded, and run through the
provider's MoE GEMM with random activations in the activation dtype. A non-gated layer also runs
whole as the engines run it: w13, ReLU-squared in the activation dtype, w2 on every (token, expert) row; so does a
gated layer whose engines clamp its SwiGLU (GLM-5.3-Flash's `swiglu_limit`) or apply SiTU (Kimi-K3), with that activation. The fp32 reference is
dequant(SRC) with --against (or when validating an unconverted source), else the project's own
decode of the Marlin bytes (formats/ inverses). Where source bytes are at hand the engine's repack
kernel runs on them too and must give the converted words. An unconverted source is prepared in
memory exactly as the converter would (formats/marlin/torch_route.py on the GPU).
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from ..core.checkpoint.reader import TensorReader, load_projection, open_checkpoint
from ..core.checkpoint.source_location import resolve_source
from ..core.checkpoint.tensor_model import Quant, Role, gated_experts
from ..core.errors import DsvError
from ..core.sources.structure import situ_betas, swiglu_alpha, swiglu_limit
from ..core.targets.engines import engine_facts
from ..core.targets.rescale import stack_key
from ..formats.marlin.scales import marlin_to_nvfp4_global, nvfp4_global_to_marlin, s0e5m3_to_nvfp4_scales
from ..formats.marlin.torch_route import (
    byte_table,
    from_marlin_weight_t,
    mxfp4_to_marlin_t,
    nvfp4_to_marlin_t,
    permute_columns_t,
)
from ..formats.padded_layout import pad_source
from ..runtime.cpu_budget import torch_threads
from .check import Result, Scope
from .checks import ALL_CHECKS
from .checks.kernel import KERNEL_LAYER_REL_ERROR_MAX, KERNEL_REL_ERROR_MAX, KernelCase
from .kernel_moe import (
    Stack,
    clamped_swiglu,
    dequant,
    reference_layer,
    reference_product,
    rel_errors,
    relu2,
    repack_source,
    run_layer,
    run_stack,
    situ,
)
from .kernel_provider import KernelBuildError, select_provider
from .kernel_shapes import kernel_layouts
from .runner import rescale_factors, resolve_options

__all__ = ["KernelOptions", "run_kernel_checks"]

_LAYER = "w13+relu2+w2"  # a non-gated layer run whole (KernelCase.stack)
_SWIGLU_LAYER = "w13+swiglu_limit+w2"  # a gated layer whose engines clamp its SwiGLU (swiglu_limit), run whole
_SITU_LAYER = "w13+situ+w2"  # a gated layer whose engines apply Kimi's SiTU (situ_betas), run whole


def _stacks(experts) -> tuple[tuple[str, tuple[Role, ...]], ...]:
    """The engines' stacks of one layer: w13 = gate | up, or the gate alone where the layer's experts have no
    up projection (non-gated: Nemotron-H's up_proj is the engines' w1, core/sources/naming.py); w2 = down."""
    gated = gated_experts(r for roles in experts.values() for r in roles)
    return ("w13", (Role.GATE, Role.UP) if gated else (Role.GATE,)), ("w2", (Role.DOWN,))


@dataclass(frozen=True)
class KernelOptions:
    provider: str = "auto"
    experts: int | None = None  # per layer; None = all
    rows: int = 16  # tokens of random activations per expert
    device: str = "cuda"
    chunk: int = 32  # experts per kernel launch (bounds the fp32 reference's memory)


@dataclass
class _Prepared:
    q: torch.Tensor
    s: torch.Tensor
    g: torch.Tensor | None  # processed global as the kernel gets it (fp32), None for MXFP4
    ref: torch.Tensor
    repack: tuple | None  # (bad words, total, first) when source bytes were at hand
    engine_global: float | None = None  # the kernel's global / the reference's, where the engine rounds it


class _Layer:
    """Prepares one projection on the device: Marlin tensors, reference, repack comparison. `layouts`:
    container -> the padded per-rank layout its experts run in (validate/kernel_shapes.py)."""

    def __init__(self, ckpt, reader, refs, rreader, ref_fmt, opts, provider, sf, device, layouts):
        self.ckpt, self.reader, self.refs, self.rreader, self.ref_fmt = ckpt, reader, refs, rreader, ref_fmt
        self.opts, self.provider, self.sf, self.dev, self.layouts = opts, provider, sf, device, layouts
        self.target = opts.target

    def _get(self, reader, proj, fmt):
        d = load_projection(reader, proj, fmt=fmt)
        return (d.weight.to(self.dev), d.scale.to(self.dev),
                d.global_scale.to(self.dev) if d.global_scale is not None else None)

    def _source(self, reader, proj, fmt, layout_of):
        """Source tensors on the device, in the padded per-rank layout of `layout_of`'s container where
        it has one (the one home of that layout: formats/padded_layout.py)."""
        w, bs, gs = self._get(reader, proj, fmt)
        t = self.layouts.get(layout_of.container)
        if t is not None:
            w, bs = pad_source(w, bs, down=proj.role is Role.DOWN, t=t)
        return w, bs, gs

    def _repack(self, q, packed):
        if self.provider.repack_op is None:  # a provider without the repack op: kernel.repack does not run
            return None
        got = repack_source(self.provider, packed)
        bad = got.ne(q)
        first = tuple(int(i) for i in bad.nonzero()[0]) if bad.any() else None
        return int(bad.sum()), bad.numel(), first

    def _engine_global(self, exact, sf):
        """The global the engine keeps for the exact source global, over the exact one: 1.0 for vLLM (fp32),
        SGLang's rounding to the activation dtype (kernel.gemm's policy on the engine's own rounding).
        From the source, never from the stored bytes: a stored global that is off is not the engine's."""
        e = exact.float().reshape(()).cpu() if exact is not None else None
        if e is None or not (torch.isfinite(e) and e > 0):
            return None  # nvfp4.global.invalid reports it
        t = self.target
        kept = marlin_to_nvfp4_global(nvfp4_global_to_marlin(e, fp32_global=t.fp32_global, act_dtype=t.act_dtype, sf=sf),
                                      act_dtype=t.act_dtype, sf=sf)
        return float(kept / e)

    def prepare(self, proj, owner) -> _Prepared:
        """`owner` is the projection whose global the engine uses (the gate for up)."""
        sf = self.sf.get(stack_key(proj), 1.0)
        nv = proj.quant is Quant.NVFP4
        if self.ckpt.format.converted:
            q, s, _ = self._get(self.reader, proj, self.ckpt.format)
            g = self.reader.get(owner.marlin_global).float().reshape(()) if nv else None
            ref_proj = self.refs.get(proj.key)
            if ref_proj is not None:
                w, bs, gs = self._source(self.rreader, ref_proj, self.ref_fmt, proj)
                ref_owner = self.refs.get(owner.key, ref_proj)
                og = gs if ref_owner is ref_proj else self._get(self.rreader, ref_owner, self.ref_fmt)[2]
                return _Prepared(q, s, g, dequant(proj.quant.value, w, bs, gs), self._repack(q, w),
                                 self._engine_global(og, sf) if nv else None)
            own = self.reader.get(proj.marlin_global).float().reshape(()) if nv else None
            return _Prepared(q, s, g, self._decode(proj, q, s, own, sf), None)
        w, bs, gs = self._source(self.reader, proj, self.ckpt.format, proj)
        if nv:
            q, s = nvfp4_to_marlin_t(w, bs, target=self.target, sf=sf)
            og = self._get(self.reader, owner, self.ckpt.format)[2] if owner is not proj else gs
            try:
                g = nvfp4_global_to_marlin(og.float().reshape(()).cpu(), fp32_global=self.target.fp32_global,
                                           act_dtype=self.target.act_dtype, sf=sf).float()
            except ValueError:  # NaN, 0 or negative: nvfp4.global.invalid reports it; the expert must not pass
                g = torch.tensor(float("nan"))
        else:
            q, s = mxfp4_to_marlin_t(w, bs, target=self.target)
            g = og = None
        return _Prepared(q, s, g, dequant(proj.quant.value, w, bs, gs), self._repack(q, w),
                         self._engine_global(og, sf) if nv else None)

    def _decode(self, proj, q, s, mglobal, sf):
        """The Marlin bytes back to what they mean (formats/ inverses), fp32 [Np, Kp]."""
        packed = from_marlin_weight_t(q)
        b = permute_columns_t(s.contiguous().view(torch.uint8), w4a8=False, inverse=True)
        if proj.quant is Quant.NVFP4:
            table = byte_table(lambda c: s0e5m3_to_nvfp4_scales(c, sf=sf), torch.uint8, self.dev)
            scale = table[b.long()].view(torch.float8_e4m3fn).t()
            g = marlin_to_nvfp4_global(mglobal, act_dtype=self.target.act_dtype, sf=sf)
            return dequant("nvfp4", packed, scale, g)
        return dequant("mxfp4", packed, b.t(), None)


def _chosen(experts, n, seed, layer):
    experts = sorted(experts)
    if n is None or n >= len(experts):
        return experts
    return sorted(random.Random(f"{seed}/{layer}").sample(experts, n))


@torch_threads(1)  # the GPU runs the products; the CPU's share is small decodes (runtime/cpu_budget.py)
def run_kernel_checks(path, opts, report, *, against=None, kopts: KernelOptions = KernelOptions(),
                      progress=None) -> None:
    """Adds kernel.* results, one `report.kernel` row per layer stack, and notes to `report`."""
    try:
        ckpt = open_checkpoint(resolve_source(path))
    except DsvError as e:  # validate's own findings say why (structure.reader); nothing to run
        report.notes.append(f"kernel checks skipped: the reader refuses the checkpoint ({e.error_id})")
        return
    opts = resolve_options(opts, ckpt)
    checks = [c for c in ALL_CHECKS if c.scope is Scope.KERNEL]
    if opts.target.w4a8:
        report.notes.append("kernel checks skipped: W4A8 (fp8 activations) is not in the kernel pre-flight yet")
        return
    ref_ckpt = open_checkpoint(resolve_source(against)) if against is not None else None
    layouts = kernel_layouts(ckpt, opts, ref_ckpt)  # refuses what the kernel cannot run, before any launch
    provider = select_provider(kopts.provider, engine_facts(opts.target.engine).layout_tag)
    dev = torch.device(kopts.device)
    report.notes.append(f"kernel: {provider.name} on {torch.cuda.get_device_name(dev)}")
    report.notes += _layout_notes(ckpt, opts, layouts, ref_ckpt is not None)
    refs = {p.key: p for p in ref_ckpt.projections} if ref_ckpt is not None else {}
    limit, alpha, betas = swiglu_limit(ckpt.config), swiglu_alpha(ckpt.config), situ_betas(ckpt.config)  # activations
    groups = defaultdict(lambda: defaultdict(dict))
    for p in ckpt.projections:
        groups[p.layer][p.expert][p.role] = p
    marlin = ckpt.format.converted
    kind = "--against SRC" if ref_ckpt is not None else ("Marlin bytes decoded" if marlin else "source dequant")
    with TensorReader(ckpt.root) as reader, (TensorReader(ref_ckpt.root) if ref_ckpt else nullcontext()) as rr:
        sf = rescale_factors(ckpt, opts, reader, ckpt.projections)
        layer_prep = _Layer(ckpt, reader, refs, rr, ref_ckpt.format if ref_ckpt else None, opts, provider, sf, dev,
                            layouts)
        for layer, experts in groups.items():
            chosen = _chosen(experts, kopts.experts, opts.seed, layer)
            stacks = _stacks(experts)
            non_gated = stacks[0][1] == (Role.GATE,)
            gated = (Role.GATE, Role.UP, Role.DOWN)
            whole = (((_LAYER, (Role.GATE, Role.DOWN)),) if non_gated else ((_SWIGLU_LAYER, gated),) if limit is not None
                     else ((_SITU_LAYER, gated),) if betas is not None else ())
            for stack, roles in (*stacks, *whole):
                members = [e for e in chosen if all(r in experts[e] for r in roles)]
                if not members:
                    continue
                quant = experts[members[0]][roles[0]].quant
                if quant is Quant.MXFP4 and opts.target.act_dtype != "bfloat16":
                    continue  # the engines have no fp16 MXFP4 Marlin kernel (quant_config.mxfp4_act_dtype)
                case = KernelCase(layer, stack, opts.target.act_dtype, provider.name, kind)
                t0 = time.monotonic()
                try:
                    if stack in (_LAYER, _SWIGLU_LAYER, _SITU_LAYER):
                        case.limit = KERNEL_LAYER_REL_ERROR_MAX[opts.target.act_dtype]
                        act, reach = {_LAYER: (relu2, None), _SWIGLU_LAYER: (limit and clamped_swiglu(limit, alpha), limit),
                                      _SITU_LAYER: (betas and situ(*betas), betas and betas[0])}[stack]
                        _run_layer(layer_prep, experts, members, case, opts, kopts, dev, roles, act, reach)
                    else:
                        _run_stack(layer_prep, experts, members, roles, case, opts, kopts, dev)
                except KernelBuildError as e:  # nothing can run: one finding, the rest not run
                    case.build_error = (e.message, e.hint)
                    report.results += [Result(c.id, f) for c in checks if c.id == "kernel.build" for f in c(case, opts)]
                    report.ran.add("kernel.build")
                    report.notes.append("kernel checks stopped: the engine could not build its Marlin kernel here")
                    return
                report.results += [Result(c.id, f) for c in checks for f in c(case, opts)]
                jit = provider.ops is not None and provider.ops.jit is not None
                report.ran |= {c.id for c in checks if (c.id != "kernel.repack" or case.repack)
                               and (c.id != "kernel.build" or jit)}
                worst = sorted(case.rel.items(), key=lambda t: -t[1])[:5]
                report.kernel.append({"layer": layer, "projection": stack, "experts": len(case.rel),
                                      "max_rel_error": worst[0][1] if worst else None,
                                      "worst_experts": [[e, r] for e, r in worst],
                                      "limit": case.limit or KERNEL_REL_ERROR_MAX[opts.target.act_dtype],
                                      "repack_checked": len(case.repack), "seconds": time.monotonic() - t0})
                if progress:
                    progress(layer, stack, len(case.rel))


def _layout_notes(ckpt, opts, layouts, against: bool) -> list[str]:
    padded = sorted({(t.tp, t.ep, t.i_shard, t.i_pad, t.hidden, t.h_pad) for t in layouts.values() if t is not None})
    if not padded:
        return []
    sizes = "; ".join(f"TP {tp} / EP {ep}: I_shard {i} -> {ip}, H {h} -> {hp}" for tp, ep, i, ip, h, hp in padded)
    if not ckpt.format.converted:
        return [f"kernel: source experts padded per rank as {opts.target.engine} pads them ({sizes}), as the converter "
                "writes that split"]
    if against:
        return [f"kernel: padded per-rank layout ({sizes}) checked against the source padded the same way"]
    return [f"kernel: padded per-rank layout ({sizes}) checked without --against: the reference is the bytes' "
            "own decode, so rank blocks in the wrong order or padding in the wrong place of a rank block are "
            "not visible here (the kernel computes what the bytes mean); add --against SRC to check the layout"]


def _run_stack(prep, experts, members, roles, case, opts, kopts, dev):
    gen = torch.Generator(device=dev).manual_seed(opts.seed)
    act = getattr(torch, opts.target.act_dtype)
    x = None
    for i in range(0, len(members), kopts.chunk):
        part = members[i:i + kopts.chunk]
        qs, ss, gs, refs, kept = [], [], [], [], []
        for e in part:
            owner = experts[e][roles[0]]
            pieces = [prep.prepare(experts[e][r], owner) for r in roles]
            kept.append(pieces[0].engine_global)
            qs.append(torch.cat([p.q for p in pieces], dim=-1))
            ss.append(torch.cat([p.s.view(torch.uint8) for p in pieces], dim=-1).view(pieces[0].s.dtype))
            gs.append(pieces[0].g)
            refs.append(torch.cat([p.ref for p in pieces], dim=0))
            case.names[e] = (owner.weight.name, owner.weight.file)
            for r, p in zip(roles, pieces):
                if p.repack is None:
                    continue
                bad, total, first = p.repack
                name, b0, t0, f0 = case.repack.get(e, (experts[e][r].weight.name, 0, 0, None))
                if bad and not b0:
                    name, f0 = experts[e][r].weight.name, first
                case.repack[e] = (name, b0 + bad, t0 + total, f0)
        stack = Stack(torch.stack(qs), torch.stack(ss), torch.stack(gs).to(dev) if gs[0] is not None else None,
                      torch.stack(refs))
        if x is None:
            x = torch.randn(kopts.rows, stack.reference.shape[-1], generator=gen, device=dev).to(act)
        y = run_stack(prep.provider, stack, x)
        ref = reference_product(stack, x)
        case.rel.update({e: float(r) for e, r in zip(part, rel_errors(y, ref).tolist())})
        if any(k is not None and k != 1.0 for k in kept):  # the engine rounds a global: the error without it
            ratio = torch.tensor([1.0 if k is None else k for k in kept], device=dev)
            errs = rel_errors(y, ref * ratio[None, :, None])
            case.engine_global.update({e: (k, float(r)) for e, k, r in zip(part, kept, errs.tolist())
                                       if k is not None and k != 1.0})
        del stack, y, ref


def _stack_of(prep, experts, part, roles, dev) -> Stack:
    """The engine's stack of `roles` for the experts `part` (w13 = gate | up under the gate's global), its reference
    scaled by the global the engine keeps (vLLM: exact; SGLang: the activation dtype's)."""
    per_expert = [[prep.prepare(experts[e][r], experts[e][roles[0]]) for r in roles] for e in part]
    kept = torch.tensor([1.0 if ps[0].engine_global is None else ps[0].engine_global for ps in per_expert], device=dev)
    return Stack(torch.stack([torch.cat([p.q for p in ps], dim=-1) for ps in per_expert]),
                 torch.stack([torch.cat([p.s.view(torch.uint8) for p in ps], dim=-1).view(ps[0].s.dtype)
                              for ps in per_expert]),
                 torch.stack([ps[0].g for ps in per_expert]).to(dev) if per_expert[0][0].g is not None else None,
                 torch.stack([torch.cat([p.ref for p in ps], dim=0) for ps in per_expert]) * kept[:, None, None])


def _run_layer(prep, experts, members, case, opts, kopts, dev, roles, activation, reach):
    """A layer whole (kernel_moe.run_layer): per chunk, the w13 and w2 stacks of the same experts, one input, the
    engines' `activation` between them: relu2 after a non-gated w13 (`roles` gate, down), the clamped SwiGLU or SiTU
    after a gated one (gate, up, down; the input scaled so that the median |output| of the first GEMM is `reach`, the
    clamp or SiTU's beta, where the activation bends). The references take each projection's global as the engine keeps it, so this case sees the kernels'
    path through the activation, not the global rounding that the two stacks' own cases report."""
    gen = torch.Generator(device=dev).manual_seed(opts.seed + 1)
    act = getattr(torch, opts.target.act_dtype)
    x = None
    for i in range(0, len(members), kopts.chunk):
        part = members[i:i + kopts.chunk]
        w13, w2 = _stack_of(prep, experts, part, roles[:-1], dev), _stack_of(prep, experts, part, roles[-1:], dev)
        case.names.update({e: (experts[e][Role.GATE].weight.name, experts[e][Role.GATE].weight.file) for e in part})
        if x is None:
            x = torch.randn(kopts.rows, w13.reference.shape[-1], generator=gen, device=dev)
            if reach is not None:  # reach the clamp (or SiTU's bend): the median |output| of the first GEMM there
                x = x * (reach / reference_product(w13, x).abs().median().clamp_min(1e-30))
            x = x.to(act)
        y = run_layer(prep.provider, w13, w2, x, activation)
        case.rel.update({e: float(r) for e, r in
                         zip(part, rel_errors(y, reference_layer(w13, w2, x, activation)).tolist())})
        del w13, w2, y
