"""Run every check over a checkpoint: headers first, then every expert streamed one at a time.

Memory stays bounded by one expert (three projections) per worker, whatever the checkpoint size;
the numeric checks work on per-block maxima (validate/inputs.py), so the only full pass over the
weights is one byte-table lookup. The GEMM spot check dequantizes only the sampled experts.
"""

from __future__ import annotations

import math
import random
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from tqdm import tqdm

from dsv4_convert.core.errors import DsvError, InputError
from dsv4_convert.core.reader import TensorReader, load_projection, open_checkpoint, resolve_source
from dsv4_convert.core.structure import unreadable_tensors
from dsv4_convert.core.tensor_model import Checkpoint, Projection, Quant, Role, SourceFormat
from dsv4_convert.formats.e4m3 import e4m3_is_nan
from dsv4_convert.formats.marlin import MarlinTarget, marlin_to_mxfp4, marlin_to_nvfp4, mxfp4_to_marlin, nvfp4_to_marlin
from dsv4_convert.formats.marlin_scales import nvfp4_global_to_marlin, vllm_rescale_factor
from dsv4_convert.validate.check import Check, Finding, Result, Scope
from dsv4_convert.validate.checks import ALL_CHECKS
from dsv4_convert.validate.headers import scan_checkpoint
from dsv4_convert.validate.inputs import (
    CheckpointInput,
    ExpertTensors,
    GemmCase,
    MarlinTensors,
    Options,
    ProjectionTensors,
)
from dsv4_convert.validate.report import Report

__all__ = ["Unreadable", "resolve_options", "validate"]


_POOL_MIN_TASKS = 32  # below this, starting worker processes costs more than it saves


class Unreadable(Exception):
    """The input cannot be validated at all (exit code 2); carries the reader's error."""

    def __init__(self, error: DsvError):
        super().__init__(error.message)
        self.error = error


def resolve_options(opts: Options, ckpt: Checkpoint | None) -> Options:
    """For a converted checkpoint, decode with what it was converted for (marlin.config reports a
    disagreement with --target / --act-dtype)."""
    if ckpt is None or ckpt.format is not SourceFormat.MARLIN:
        return opts
    qc = ckpt.config.get("quantization_config") or {}
    engine = qc.get("target_engine") if qc.get("target_engine") in ("vllm", "sglang") else opts.engine
    act = qc.get("act_dtype") if qc.get("act_dtype") in ("bfloat16", "float16") else opts.act_dtype
    return replace(opts, engine=engine, act_dtype=act, w4a8=bool(qc.get("w4a8", opts.w4a8)))


# ------------------------------------------------------------------------------------------ per expert
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


@dataclass
class _Job:
    """Everything a worker needs besides the task (sent once per worker)."""
    root: str
    fmt: SourceFormat
    against_root: str | None
    against_fmt: SourceFormat | None
    opts: Options


class _Worker:
    def __init__(self, job: _Job):
        self.job = job
        self.reader = TensorReader(job.root)
        self.against = TensorReader(job.against_root) if job.against_root else None
        self.checks = {s: [c for c in ALL_CHECKS if c.scope is s] for s in Scope}

    def _run(self, out: _Outcome, chk: Check, arg, quant=None) -> None:
        if not chk.applies_to(quant):
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
        target = MarlinTarget(engine=o.engine, act_dtype=o.act_dtype, w4a8=o.w4a8 and proj.quant is Quant.MXFP4)
        if proj.quant is Quant.NVFP4:
            packed, scale = marlin_to_nvfp4(d.weight, d.scale, target=target, n=proj.n, k=proj.k, sf=sf)
        else:
            packed, scale = marlin_to_mxfp4(d.weight, d.scale, target=target, n=proj.n, k=proj.k)
            scale = scale.view(torch.uint8)
        decoded = ProjectionTensors(proj, packed, scale, d.global_scale, sf=sf, file=proj.weight.file)
        return MarlinTensors(proj, d.weight, d.scale, mglobal, d.global_scale, o.engine, o.act_dtype,
                             target.w4a8, sf, decoded=decoded, file=proj.weight.file)

    def run(self, task: _Task) -> _Outcome:
        out = _Outcome()
        job = self.job
        marlin = job.fmt is SourceFormat.MARLIN
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
                if ref_proj is not None and self.against is not None:
                    refs[proj.role] = self._load(self.against, ref_proj, job.against_fmt, sf)
            except (DsvError, ValueError, RuntimeError) as e:
                msg = getattr(e, "message", str(e))
                out.results.append(Result("structure.reader", Finding(
                    proj.weight.name, f"cannot read or decode this projection: {msg}", file=proj.weight.file,
                    layer=proj.layer, expert=proj.expert)))
                continue
            tensors[proj.role] = pt
            out.projections += 1
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
        if pt.quant is Quant.MXFP4 and o.act_dtype != "bfloat16":
            return None
        common = dict(engine=o.engine, act_dtype=o.act_dtype, w4a8=o.w4a8 and pt.quant is Quant.MXFP4,
                      sf=pt.sf, seed=o.seed, file=pt.file)
        if role in marlins:
            m = marlins[role]
            mglobal = m.mglobal
            if role is Role.UP and Role.GATE in marlins and pt.quant is Quant.NVFP4:
                mglobal = marlins[Role.GATE].mglobal  # both engines use the gate's global for w13
            return GemmCase(refs.get(role, pt), m.qweight, m.mscale, mglobal, **common)
        target = MarlinTarget(engine=o.engine, act_dtype=o.act_dtype, w4a8=common["w4a8"])
        try:
            if pt.quant is Quant.NVFP4:
                q, s = nvfp4_to_marlin(pt.weight, pt.scale, target=target, sf=pt.sf)
                owner = tensors.get(Role.GATE, pt) if role is Role.UP else pt
                g = owner.global_scale if owner.global_scale is not None else torch.tensor(1.0)
                mglobal = nvfp4_global_to_marlin(g.float().reshape(()), engine=o.engine, act_dtype=o.act_dtype,
                                                 sf=pt.sf)
            else:
                q, s = mxfp4_to_marlin(pt.weight, pt.scale, target=target)
                mglobal = None
        except ValueError:
            return None  # shapes off the Marlin tile: structure.tile.tp / structure.k_align report them
        return GemmCase(pt, q, s, mglobal, **common)


_WORKER: _Worker | None = None  # one per worker process (set by the pool initializer)


def _init_worker(job: _Job) -> None:
    global _WORKER
    torch.set_num_threads(1)
    _WORKER = _Worker(job)


def _run_task(task: _Task) -> _Outcome:
    return _WORKER.run(task)


# ------------------------------------------------------------------------------------------ planning
def _rescale_factors(ckpt: Checkpoint, opts: Options, reader: TensorReader, projections) -> dict:
    """(container, stack) -> sf. Converted checkpoints record it; for an NVFP4 source served by vLLM
    with bf16 it is computed the way vLLM does, over all experts of the stack (scales only)."""
    if ckpt.format is SourceFormat.MARLIN:
        recorded = (ckpt.config.get("quantization_config") or {}).get("rescale_factors") or {}
        return {(c, s): float(v) for c, s, v in ((k.rsplit(".", 1) + [v]) for k, v in recorded.items())}
    if not (opts.engine == "vllm" and opts.act_dtype == "bfloat16"):
        return {}
    nan, top = defaultdict(bool), defaultdict(int)
    for p in projections:
        if p.quant is Quant.NVFP4:
            try:
                b = reader.get(p.scale).contiguous().view(torch.uint8)
            except DsvError:
                continue
            key = (p.container, p.stack)
            nan[key] |= bool(e4m3_is_nan(b).any())
            pos = b[b < 0x7F]  # positive E4M3 bytes sort like their values
            top[key] = max(top[key], int(pos.max()) if pos.numel() else 0)
    return {key: 1.0 if nan[key] else vllm_rescale_factor(
        torch.tensor([top[key]], dtype=torch.uint8).view(torch.float8_e4m3fn), opts.act_dtype) for key in top}


def _sample(items: list, fraction: float, rng: random.Random) -> list:
    if fraction >= 1.0:
        return items
    keep = max(1, math.ceil(fraction * len(items)))
    return sorted(rng.sample(items, keep))


def _tasks(ckpt: Checkpoint, against: Checkpoint | None, opts: Options, sf: dict, skip: set) -> list[_Task]:
    groups = defaultdict(list)
    for p in ckpt.projections:
        if p.weight.name not in skip and p.scale.name not in skip:
            groups[(p.layer, p.expert)].append(p)
    refs = {p.key: p for p in against.projections} if against is not None else {}
    by_layer = defaultdict(list)
    for layer, expert in groups:
        by_layer[layer].append(expert)
    rng = random.Random(opts.seed)
    tasks = []
    for layer, experts in by_layer.items():
        chosen = _sample(sorted(experts), opts.sample, rng)
        gemm = set(rng.sample(chosen, min(opts.gemm_experts, len(chosen)))) if opts.gemm_experts > 0 else set()
        for e in chosen:
            projs = groups[(layer, e)]
            tasks.append(_Task(layer, e, projs, {p.role: refs[p.key] for p in projs if p.key in refs},
                               {p.role: sf.get((p.container, p.stack), 1.0) for p in projs}, e in gemm))
    return tasks


def _truncated_tensors(headers) -> set:
    return {name for h in headers.values() for name, (_, _, _, end) in h.tensors.items() if end > h.size}


# ------------------------------------------------------------------------------------------- driver
def validate(path: str | Path, opts: Options, *, against: str | Path | None = None, workers: int = 1,
             progress: bool = True) -> Report:
    """Validate one checkpoint; raises Unreadable when it cannot be validated at all (exit 2)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the per-block work is many small ops: threads only add overhead
    try:
        return _validate(path, opts, against=against, workers=workers, progress=progress)
    finally:
        torch.set_num_threads(threads)


def _validate(path, opts: Options, *, against, workers: int, progress: bool) -> Report:
    start = time.monotonic()
    try:
        root = resolve_source(path)
    except DsvError as e:
        raise Unreadable(e) from None
    index, index_error, headers, on_disk = scan_checkpoint(root)
    ckpt, reader_error = None, None
    try:
        ckpt = open_checkpoint(root)
    except DsvError as e:
        reader_error = e
    opts = resolve_options(opts, ckpt)
    cin = CheckpointInput(str(root), opts, ckpt, index, index_error, headers, on_disk,
                          config=ckpt.config if ckpt else _json(root / "config.json"),
                          hf_quant_config=ckpt.hf_quant_config if ckpt else None, reader_error=None)
    report = Report(path=str(path), against=str(against) if against else None,
                    format=ckpt.format.value if ckpt else None, options=opts)
    for chk in ALL_CHECKS:
        if chk.scope is Scope.CHECKPOINT and chk.id != "structure.reader":
            report.ran.add(chk.id)
            report.results += [Result(chk.id, f) for f in chk(cin, opts)]
    if reader_error is not None:
        explained = any(r.check_id.startswith("structure.") for r in report.results)
        if isinstance(reader_error, InputError) and not explained:
            raise Unreadable(reader_error)
        if not (isinstance(reader_error, InputError) and explained):
            report.results += [Result("structure.reader", f)
                               for f in ALL_CHECKS_BY_ID["structure.reader"](replace(cin, reader_error=reader_error),
                                                                           opts)]
        report.notes.append(f"tensor checks skipped: the reader refused the checkpoint "
                            f"[{reader_error.error_id}]")
        report.ran.add("structure.reader")
        report.seconds = time.monotonic() - start
        return report
    report.ran.add("structure.reader")
    ref_ckpt = None
    if against is not None:
        try:
            ref_ckpt = open_checkpoint(resolve_source(against))
        except DsvError as e:
            raise Unreadable(e) from None
        chk = ALL_CHECKS_BY_ID["against.tensor_mismatch"]  # needs both checkpoints: runs once both are open
        report.results += [Result(chk.id, f) for f in chk(replace(cin, against=ref_ckpt), opts)]
    skip = _truncated_tensors(headers)
    if skip:
        report.notes.append(f"{len(skip)} tensors in truncated shards were not read")
    skip |= unreadable_tensors(ckpt)  # empty projections: structure.experts.empty reports them
    with TensorReader(root) as reader:
        sf = _rescale_factors(ckpt, opts, reader, ckpt.projections)
    tasks = _tasks(ckpt, ref_ckpt, opts, sf, skip)
    if opts.sample < 1.0:
        report.notes.append(f"sampled {opts.sample:.0%} of the experts of each layer (--sample)")
    job = _Job(str(root), ckpt.format, str(ref_ckpt.root) if ref_ckpt else None,
               ref_ckpt.format if ref_ckpt else None, opts)
    bar = tqdm(total=len(tasks), unit="expert", desc="validate", disable=not progress, leave=False)
    if workers > 1 and len(tasks) >= _POOL_MIN_TASKS:
        import multiprocessing as mp
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload([__name__])  # workers fork from a server that has torch imported already
        with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                                 initargs=(job,)) as pool:
            for outcome in pool.map(_run_task, tasks, chunksize=max(1, len(tasks) // (workers * 16))):
                report.add(outcome.results, outcome.ran, outcome.gemm, outcome.projections)
                bar.update(1)
    else:
        worker = _Worker(job)
        for task in tasks:
            outcome = worker.run(task)
            report.add(outcome.results, outcome.ran, outcome.gemm, outcome.projections)
            bar.update(1)
    bar.close()
    report.experts = len(tasks)
    report.seconds = time.monotonic() - start
    return report


def _json(path: Path) -> dict:
    import json
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


ALL_CHECKS_BY_ID = {c.id: c for c in ALL_CHECKS}
