"""The per-expert half of validate: read one expert's projections, decode Marlin bytes back to the
source convention, and run every projection, Marlin, --against, expert and GEMM check on them.

A `_Worker` lives once per worker process (validate/runner.py starts them) and keeps its shard
file descriptors open across the tasks it is given; each task is one (layer, expert).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

from ..core.checkpoint.reader import TensorReader, load_projection
from ..core.checkpoint.tensor_model import Projection, Quant, Role
from ..core.errors import DsvError
from ..core.sources.source_formats import SourceFormat
from ..formats.marlin import marlin_to_mxfp4, marlin_to_nvfp4, mxfp4_to_marlin, nvfp4_to_marlin
from ..formats.marlin.scales import nvfp4_global_to_marlin
from ..formats.padded_layout import decode_rank_blocks, pad_source
from .check import Check, Finding, Result, Scope
from .checks import ALL_CHECKS
from .inputs import ExpertTensors, GemmCase, MarlinTensors, Options, ProjectionTensors

__all__ = ["_Job", "_Outcome", "_Task", "_Worker"]


@dataclass
class _Task:
    layer: str
    expert: int
    projections: list[Projection]
    references: dict  # role -> Projection from --against
    sf: dict  # role -> rescale factor of its stack
    gemm: bool


@dataclass
class _Outcome:
    results: list[Result] = field(default_factory=list)
    ran: set = field(default_factory=set)
    gemm: list[dict] = field(default_factory=list)
    projections: int = 0
    skipped: dict = field(default_factory=dict)  # check id -> what it needed and did not have
    compared: int = 0  # projections compared with an --against reference


@dataclass
class _Job:
    """Everything a worker needs besides the task (sent once per worker)."""
    root: str
    fmt: SourceFormat
    against_root: str | None
    against_fmt: SourceFormat | None
    opts: Options
    tiles: dict = field(default_factory=dict)  # container -> RankTiles of a padded --tp/--ep output


class _Worker:
    def __init__(self, job: _Job):
        self.job = job
        self.reader = TensorReader(job.root)
        self.against = TensorReader(job.against_root) if job.against_root else None
        self.checks = {s: [c for c in ALL_CHECKS if c.scope is s] for s in Scope}

    def _run(self, out: _Outcome, chk: Check, arg, quant=None) -> None:
        if not chk.applies_to(quant):
            return
        if missing := chk.missing(arg, self.job.opts):
            out.skipped[chk.id] = missing
            return
        out.ran.add(chk.id)
        for f in chk(arg, self.job.opts):
            out.results.append(Result(chk.id, f))

    def _load(self, reader, proj: Projection, fmt, sf: float) -> ProjectionTensors:
        d = load_projection(reader, proj, fmt=fmt)
        return ProjectionTensors(proj, d.weight, d.scale, d.global_scale, sf=sf, file=proj.weight.file)

    def _decode(self, proj: Projection, sf: float, out: _Outcome):
        o = self.job.opts
        d = load_projection(self.reader, proj, fmt=self.job.fmt)
        mglobal = self.reader.get(proj.marlin_global) if proj.marlin_global is not None else None
        target = o.target.for_quant(proj.quant)

        def decode(q, s, n, k):
            if proj.quant is Quant.NVFP4:
                return marlin_to_nvfp4(q, s, target=target, n=n, k=k, sf=sf)
            packed, scale = marlin_to_mxfp4(q, s, target=target, n=n, k=k)
            return packed, scale.view(torch.uint8)

        tiles = self.job.tiles.get(proj.container)
        if tiles is None:
            packed, scale = decode(d.weight, d.scale, proj.n, proj.k)
        else:  # a --tp/--ep output: each rank's block is its own Marlin tensor (formats/padded_layout.py)
            packed, scale = decode_rank_blocks((d.weight, d.scale), down=proj.role is Role.DOWN, t=tiles,
                                               decode=decode)
        decoded = ProjectionTensors(proj, packed, scale, d.global_scale, sf=sf, file=proj.weight.file)
        return MarlinTensors(proj, d.weight, d.scale, mglobal, d.global_scale, target, sf, decoded=decoded,
                             file=proj.weight.file, tiles=tiles)

    def run(self, task: _Task) -> _Outcome:
        out = _Outcome()
        job = self.job
        marlin = job.fmt.converted
        tensors: dict[Role, ProjectionTensors] = {}
        marlins: dict[Role, MarlinTensors] = {}
        refs: dict[Role, ProjectionTensors] = {}
        for proj in task.projections:
            sf = task.sf.get(proj.role, 1.0)
            try:
                if marlin:
                    m = marlins[proj.role] = self._decode(proj, sf, out)
                    pt = m.decoded
                else:
                    pt = self._load(self.reader, proj, job.fmt, sf)
                ref_proj = task.references.get(proj.role)
                if ref_proj is not None and (why := _reference_problem(proj, ref_proj, job.tiles.get(proj.container))):
                    out.results.append(Result("against.mismatch", Finding(
                        proj.weight.name, f"cannot be compared with --against: {why}.", file=proj.weight.file,
                        layer=proj.layer, expert=proj.expert, cause="shape")))
                    out.compared += 1  # compared, and found to differ
                    ref_proj = None
                if ref_proj is not None and self.against is not None:
                    refs[proj.role] = self._load(self.against, ref_proj, job.against_fmt, sf)
                    if proj.container in job.tiles:  # compare with the source as this layout pads it
                        refs[proj.role] = _padded_reference(refs[proj.role], proj, job.tiles[proj.container])
            except (DsvError, ValueError, RuntimeError) as e:
                msg = getattr(e, "message", str(e))
                out.results.append(Result("structure.reader", Finding(
                    proj.weight.name, f"cannot read or decode this projection: {msg}", file=proj.weight.file,
                    layer=proj.layer, expert=proj.expert)))
                continue
            tensors[proj.role] = pt
            out.projections += 1
            out.compared += proj.role in refs
            for chk in self.checks[Scope.PROJECTION]:
                self._run(out, chk, pt, proj.quant)
            if marlin:
                marlins[proj.role].reference = refs.get(proj.role)
                for chk in self.checks[Scope.MARLIN]:
                    self._run(out, chk, marlins[proj.role], proj.quant)
            elif proj.role in refs:
                for chk in self.checks[Scope.AGAINST]:
                    self._run(out, chk, (pt, refs[proj.role]), proj.quant)
        expert = ExpertTensors(task.layer, task.expert, tensors)
        for chk in self.checks[Scope.EXPERT]:
            self._run(out, chk, expert, None)
        if task.gemm:
            for role, pt in tensors.items():
                case = self._gemm_case(role, pt, tensors, marlins, refs)
                if case is None:
                    continue
                for chk in self.checks[Scope.GEMM]:
                    self._run(out, chk, case, pt.quant)
                rel, mx = case.errors
                out.gemm.append({"tensor": pt.proj.weight.name, "layer": task.layer, "expert": task.expert,
                                 "role": role.value, "rel_error": rel if math.isfinite(rel) else None,
                                 "max_abs_error": mx if math.isfinite(mx) else None})
        return out

    def _gemm_case(self, role, pt, tensors, marlins, refs) -> GemmCase | None:
        o = self.job.opts
        target = o.target.for_quant(pt.quant)
        if pt.quant is Quant.MXFP4 and target.act_dtype != "bfloat16":
            return None
        common = dict(target=target, sf=pt.sf, seed=o.seed, file=pt.file)
        if role in marlins:
            m = marlins[role]
            mglobal = m.mglobal
            if role is Role.UP and Role.GATE in marlins and pt.quant is Quant.NVFP4:
                mglobal = marlins[Role.GATE].mglobal  # both engines use the gate's global for w13
            return GemmCase(refs.get(role, pt), m.qweight, m.mscale, mglobal, tiles=m.tiles, **common)
        try:
            if pt.quant is Quant.NVFP4:
                q, s = nvfp4_to_marlin(pt.weight, pt.scale, target=target, sf=pt.sf)
                owner = tensors.get(Role.GATE, pt) if role is Role.UP else pt
                g = owner.global_scale if owner.global_scale is not None else torch.tensor(1.0)
                mglobal = nvfp4_global_to_marlin(g.float().reshape(()), fp32_global=target.fp32_global, act_dtype=target.act_dtype,
                                                 sf=pt.sf)
            else:
                q, s = mxfp4_to_marlin(pt.weight, pt.scale, target=target)
                mglobal = None
        except ValueError:
            return None  # shapes off the Marlin tile: structure.tile.tp / structure.k_align report them
        return GemmCase(pt, q, s, mglobal, **common)


def _reference_problem(proj: Projection, ref: Projection, tiles) -> str | None:
    """Why the --against projection `ref` cannot be this projection's source, or None."""
    want = (proj.n, proj.k)
    if tiles is not None:  # the source of a padded container has the unpadded sizes
        real = (tiles.hidden, tiles.moe_tp * tiles.i_shard)
        want = real if proj.role is Role.DOWN else real[::-1]
    if (ref.quant, ref.n, ref.k) != (proj.quant, *want):
        return (f"the reference is {ref.quant.value} [N, K] = [{ref.n}, {ref.k}], this projection's source must be "
                f"{proj.quant.value} [{want[0]}, {want[1]}]")
    return None


def _padded_reference(ref: ProjectionTensors, proj: Projection, tiles) -> ProjectionTensors:
    """The --against source projection in the padded per-rank layout of a --tp/--ep output
    (formats/padded_layout.py): zeros where the engine pads, so the comparisons cover the padding."""
    w, s = pad_source(ref.weight, ref.scale, down=proj.role is Role.DOWN, t=tiles)
    return ProjectionTensors(replace(ref.proj, n=proj.n, k=proj.k), w, s, ref.global_scale, sf=ref.sf, file=ref.file)
