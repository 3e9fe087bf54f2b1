"""Run every check over a checkpoint: headers first, then every expert streamed one at a time
(the per-expert checks: validate/expert_worker.py; here: planning, the worker pool, the report).

Memory stays bounded by one expert (three projections) per worker, whatever the checkpoint size;
the numeric checks work on per-block maxima (validate/inputs.py), so the only full pass over the
weights is one byte-table lookup. The GEMM spot check dequantizes only the sampled experts.
"""

from __future__ import annotations

import gc
import math
import random
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import torch
from tqdm import tqdm

from ..core.checkpoint.index import read_json
from ..core.checkpoint.reader import TensorReader, open_checkpoint
from ..core.checkpoint.source_location import resolve_source
from ..core.checkpoint.tensor_model import Checkpoint
from ..core.errors import DsvError, InputError, UsageError
from ..core.record.converted_config import record_or_none
from ..core.sources.structure import padded_containers, unreadable_tensors
from ..core.targets.rescale import stack_key, stack_rescale_factors
from ..runtime.cpu_budget import torch_threads
from ..runtime.jobs import stop_with_parent
from .check import Result, Scope
from .checks import ALL_CHECKS
from .expert_worker import _Job, _Outcome, _Task, _Worker
from .headers import scan_checkpoint
from .inputs import CheckpointInput, Coverage, Options
from .report import Report

__all__ = ["Unreadable", "checkpoint_input", "rescale_factors", "resolve_options", "validate"]


_POOL_MIN_TASKS = 32  # below this, starting worker processes costs more than it saves
_CLUSTER_BATCHES = 64  # --executor ray: the experts go out in about this many tasks


class Unreadable(Exception):
    """The input cannot be validated at all (exit code 2); carries the reader's error."""

    def __init__(self, error: DsvError):
        super().__init__(error.message)
        self.error = error


def resolve_options(opts: Options, ckpt: Checkpoint | None) -> Options:
    """For a converted checkpoint, decode with what it was converted for (marlin.config reports a
    disagreement with --target / --act-dtype)."""
    if ckpt is None or not ckpt.format.converted:
        return opts
    record = record_or_none(ckpt.config)
    if record is None:  # the block does not parse: marlin.config names every problem; decode as asked
        return opts
    tp, ep = opts.tp, opts.ep
    if not opts.layout_requested and record.tp_layout is not None:
        tp, ep = record.tp_layout.tp, record.tp_layout.ep  # a --tp/--ep output: its layout is the default
    return replace(opts, target=record.target, tp=tp, ep=ep)


_WORKER: _Worker | None = None  # one per worker process (set by the pool initializer)


def _init_worker(job: _Job) -> None:
    global _WORKER
    stop_with_parent()  # its parent, the forkserver, exits with this run: so does this worker
    torch.set_num_threads(1)
    _WORKER = _Worker(job)


def _run_task(task: _Task) -> _Outcome:
    return _WORKER.run(task)


def _run_batch(job: _Job, index: int, tasks: list[_Task], callback=None) -> tuple[int, list[_Outcome]]:
    """One cluster task: a batch of experts, checked by one _Worker (--executor ray)."""
    worker, outcomes = _Worker(job), []
    for task in tasks:
        outcomes.append(worker.run(task))
        if callback is not None:
            callback(1)
    return index, outcomes


def _on_cluster(executor, job: _Job, tasks: list[_Task], bar) -> list[_Outcome]:
    """The experts in batches as executor jobs; the outcomes in task order, as a local run gives them."""
    from ..runtime.executors import make_executor

    size = max(1, len(tasks) // _CLUSTER_BATCHES)
    batches = [tasks[i:i + size] for i in range(0, len(tasks), size)]
    results: dict[int, list[_Outcome]] = {}
    pool = make_executor(executor, 1, bar)
    try:
        pool.check_paths(None, sorted({Path(job.root) / p.weight.file for t in tasks for p in t.projections}))
        pool.map(_run_batch, [(job, i, b) for i, b in enumerate(batches)], lambda r: results.__setitem__(*r),
                 reports_progress=True, job_bytes=[sum(p.weight.nbytes + p.scale.nbytes for t in b for p in t.projections)
                                                   for b in batches])
    finally:
        pool.shutdown()
    return [o for i in range(len(batches)) for o in results[i]]


# ------------------------------------------------------------------------------------------ planning
def rescale_factors(ckpt: Checkpoint, opts: Options, reader: TensorReader, projections) -> dict:
    """`container.stack` -> sf. Converted checkpoints record it; for an NVFP4 source served by vLLM
    with bf16 it is computed as the converter's planning pass does (core/targets/rescale.py)."""
    if ckpt.format.converted:
        record = record_or_none(ckpt.config)
        return dict(record.rescale_factors) if record else {}
    if not opts.target.rescales:
        return {}
    return stack_rescale_factors(reader, projections, opts.target.act_dtype, skip_unreadable=True)


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
                               {p.role: sf.get(stack_key(p), 1.0) for p in projs}, e in gemm))
    return tasks


def _truncated_tensors(headers) -> set:
    return {name for h in headers.values() for name, (_, _, _, end) in h.tensors.items() if end > h.size}


# ------------------------------------------------------------------------------------------- driver
def checkpoint_input(root: Path, opts: Options) -> tuple[CheckpointInput, DsvError | None]:
    """What the checkpoint-level checks read: the validator's own header scan and the reader's model
    (None, with the reader's error, when it refuses the checkpoint), with the options resolved."""
    index, index_error, headers, on_disk = scan_checkpoint(root)
    ckpt, reader_error = None, None
    try:
        ckpt = open_checkpoint(root)
    except DsvError as e:
        reader_error = e
    opts = resolve_options(opts, ckpt)
    cin = CheckpointInput(str(root), opts, ckpt, index, index_error, headers, on_disk,
                          config=ckpt.config if ckpt else _config_if_readable(root),
                          hf_quant_config=ckpt.hf_quant_config if ckpt else None, reader_error=None)
    return cin, reader_error


def validate(path: str | Path, opts: Options, *, against: str | Path | None = None, workers: int = 1,
             progress: bool = True, executor=None) -> Report:
    """Validate one checkpoint; raises Unreadable when it cannot be validated at all (exit 2)."""
    gc.freeze()  # torch's ~10^5 objects are never garbage: no collection walks them (exit: -1.1 s here)
    with torch_threads(1):  # the per-block work is many small ops: threads only add overhead
        return _validate(path, opts, against=against, workers=workers, progress=progress, executor=executor)


def _validate(path, opts: Options, *, against, workers: int, progress: bool, executor=None) -> Report:
    start = time.monotonic()
    try:
        root = resolve_source(path)
    except DsvError as e:
        raise Unreadable(e) from None
    cin, reader_error = checkpoint_input(root, opts)
    ckpt, opts, headers = cin.checkpoint, cin.options, cin.headers
    report = Report(path=str(path), against=str(against) if against else None,
                    format=ckpt.format.value if ckpt else None, options=opts)
    for chk in ALL_CHECKS:
        if chk.scope is Scope.CHECKPOINT and chk.id != "structure.reader":
            if missing := chk.missing(cin, opts):
                report.skipped[chk.id] = missing
                continue
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
        if ref_ckpt.format.converted:  # its Marlin words would be read as source codes
            raise Unreadable(UsageError(
                f"--against {against} is a converted (Marlin) checkpoint; the reference must be a source",
                error_id="validate.against_converted", file=str(against),
                hint="pass the source checkpoint this one was converted from as --against SRC"))
        chk = ALL_CHECKS_BY_ID["against.tensor_mismatch"]  # needs both checkpoints: runs once both are open
        report.results += [Result(chk.id, f) for f in chk(replace(cin, against=ref_ckpt), opts)]
    skip = _truncated_tensors(headers)
    if skip:
        report.notes.append(f"{len(skip)} tensors in truncated shards were not read")
    skip |= unreadable_tensors(ckpt)  # empty projections: structure.experts.empty reports them
    with TensorReader(root) as reader:
        sf = rescale_factors(ckpt, opts, reader, ckpt.projections)
    tasks = _tasks(ckpt, ref_ckpt, opts, sf, skip)
    if opts.sample < 1.0:
        report.notes.append(f"sampled {opts.sample:.0%} of the experts of each layer (--sample)")
    job = _Job(str(root), ckpt.format, str(ref_ckpt.root) if ref_ckpt else None,
               ref_ckpt.format if ref_ckpt else None, opts, padded_containers(ckpt))
    bar = tqdm(total=len(tasks), unit="expert", desc="validate", disable=not progress, leave=False)
    if executor is not None and executor.name != "local":
        for outcome in _on_cluster(executor, job, tasks, bar):
            report.add(outcome)
    elif workers > 1 and len(tasks) >= _POOL_MIN_TASKS:
        import multiprocessing as mp
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload([__name__])  # workers fork from a server that has torch imported already
        with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                                 initargs=(job,)) as pool:
            for outcome in pool.map(_run_task, tasks, chunksize=max(1, len(tasks) // (workers * 16))):
                report.add(outcome)
                bar.update(1)
    else:
        worker = _Worker(job)
        for task in tasks:
            outcome = worker.run(task)
            report.add(outcome)
            bar.update(1)
    bar.close()
    report.experts = len(tasks)
    coverage = Coverage(len(ckpt.projections), report.projections, report.experts, against is not None,
                        report.compared, ckpt.format.value)
    for chk in ALL_CHECKS:
        if chk.scope is Scope.RUN:
            report.ran.add(chk.id)
            report.results += [Result(chk.id, f) for f in chk(coverage, opts)]
    report.notes += report.not_run_notes()
    report.seconds = time.monotonic() - start
    return report


def _config_if_readable(root: Path) -> dict:
    """config.json through the reader's one JSON reader; {} when it cannot be read (the reader's own
    error, e.g. config.not_json, says why)."""
    try:
        return read_json(root / "config.json", missing_id=None, bad_id="config.not_json", what="config.json") or {}
    except InputError:
        return {}


ALL_CHECKS_BY_ID = {c.id: c for c in ALL_CHECKS}
