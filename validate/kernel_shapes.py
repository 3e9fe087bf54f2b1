"""What `validate --kernel` hands the engine's Marlin kernel, decided from the headers before any launch.

A Marlin kernel given a shape it does not support reads out of bounds (a gpt-oss w2 of N = K = 2880
killed the process with SIGSEGV), so every stack's [N, K] goes through the one tile rule
(formats/tiles.py) first:
  converted  the stored tensors as they are: a --tp/--ep output's padded per-rank layout
             (quantization_config.tp_layout) is whole tiles by construction; any other shape that
             breaks the rule is refused
  source     prepared as the engine prepares it at the validated TP / EP: as is where the rule says
             ok, padded per rank where the engine pads (formats/padded_layout.py, the layout the
             converter writes for that --tp/--ep), refused where even the engine's padding cannot help
With --against, every reference projection must have the shape the converted one was made from
(else the reference is another model). Refusals are ContentError (validate: exit 2), before any GPU work.
"""

from __future__ import annotations

from ..core.checkpoint.reader import open_checkpoint
from ..core.checkpoint.source_location import resolve_source
from ..core.checkpoint.tensor_model import Quant, Role, moe_layers
from ..core.errors import ContentError, DsvError
from ..core.sources.source_formats import engine_padding
from ..core.sources.structure import padded_containers
from ..formats.tiles import IMPOSSIBLE, PAD, RankTiles, kernel_tile_ok, moe_rank_tiles
from .runner import resolve_options

__all__ = ["kernel_layouts", "refuse_unsupported_shapes"]

_SPLIT_HINT = ("pass a split and target that serve these experts (--tp N [--ep M], --target); "
               "`dsv4-convert plan` lists the splits each engine serves, padded or not")


def kernel_layouts(ckpt, opts, ref_ckpt=None) -> dict[str, RankTiles | None]:
    """experts container -> the padded per-rank layout its experts run in (None: the tensors as they are).
    `opts` are resolved options (validate/runner.resolve_options). Raises kernel.shape_unsupported or
    kernel.against_shape."""
    marlin = ckpt.format.converted
    padded = padded_containers(ckpt) if marlin else {}
    out: dict[str, RankTiles | None] = {}
    for name, m in moe_layers(ckpt.projections).items():
        if (m.quant is Quant.MXFP4 and opts.target.act_dtype != "bfloat16") or not (m.hidden and m.intermediate):
            continue  # not run (no fp16 MXFP4 kernel) / empty: structure.experts.empty reports it
        if marlin:
            _refuse_off_tile(ckpt, name, m)
            out[name] = padded.get(name)
            continue
        v = moe_rank_tiles(m.quant.value, engine_padding(opts.target.engine, ckpt.format.value), hidden=m.hidden, intermediate=m.intermediate,
                           tp=opts.tp, ep=opts.ep, experts=m.experts, gated=m.gated)
        if v.status == IMPOSSIBLE:
            raise ContentError(f"{name} ({m.quant.value}, H={m.hidden}, I={m.intermediate}) cannot run through "
                               f"{opts.target.engine}'s Marlin kernel at TP {opts.tp} / EP {opts.ep}: {v.reason}",
                               error_id="kernel.shape_unsupported", tensor=name, file=ckpt.index_file,
                               hint=_SPLIT_HINT)
        out[name] = v if v.status == PAD else None
    if marlin and ref_ckpt is not None:
        _refuse_other_reference(ckpt, ref_ckpt, out)
    return out


def _refuse_off_tile(ckpt, name, m) -> None:
    # the runner stacks w13 as [gate; up] (N = 2*I, K = H), or non-gated as up alone (N = I), and w2 as N = H, K = I
    n13 = (2 if m.gated else 1) * m.intermediate
    for stack, (n, k) in (("w13", (n13, m.hidden)), ("w2", (m.hidden, m.intermediate))):
        if not kernel_tile_ok(n, k):
            raise ContentError(f"{name}: the {stack} stack N={n}, K={k} breaks the Marlin tile rule (N%64 and "
                               "K%128, or N%128 and K%64); the engine's kernel would read out of bounds",
                               error_id="kernel.shape_unsupported", tensor=name, file=ckpt.index_file,
                               hint="convert the source again with this tool (it pads per rank with --tp/--ep, "
                                    "or refuses a shape no split serves)")


def _refuse_other_reference(ckpt, ref_ckpt, layouts) -> None:
    refs = {p.key: p for p in ref_ckpt.projections}
    for p in ckpt.projections:
        r = refs.get(p.key)
        if r is None or p.container not in layouts:
            continue
        t, down = layouts[p.container], p.role is Role.DOWN
        # the source shape this projection was converted from: the stored one, or the recorded unpadded sizes
        want = (p.n, p.k) if t is None else ((t.hidden, t.intermediate) if down else (t.intermediate, t.hidden))
        if (r.n, r.k) != want:
            raise ContentError(f"{p.key}: --against's projection is [N, K] = [{r.n}, {r.k}], but this checkpoint "
                               f"was converted from [{want[0]}, {want[1]}]: the reference is another model",
                               error_id="kernel.against_shape", tensor=r.weight.name, file=r.weight.file,
                               hint="pass the source this checkpoint was converted from as --against")


def refuse_unsupported_shapes(path, opts, against=None) -> None:
    """The CLI's early call (before the CPU checks and the GPU): raises what kernel_layouts raises.
    A checkpoint the reader refuses is left to validate's findings."""
    try:
        ckpt = open_checkpoint(resolve_source(path))
        ref = open_checkpoint(resolve_source(against)) if against is not None else None
    except DsvError:
        return
    opts = resolve_options(opts, ckpt)
    if not opts.target.w4a8:
        kernel_layouts(ckpt, opts, ref)
