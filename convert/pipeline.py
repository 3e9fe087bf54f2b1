"""Run a ConvertPlan: planning pass (vLLM rescale factors) -> per-shard jobs in a process pool ->
finalize (configs, index, copies, manifest: convert/publish.py) -> atomic publish. Memory per worker
is bounded by the projection in flight plus one copy chunk, whatever the checkpoint size."""

from __future__ import annotations

import errno
import itertools
import time
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from ..core.checkpoint.reader import TensorReader
from ..core.checkpoint.tensor_model import Projection, Quant
from ..core.errors import Interrupted, OutputError
from ..core.files import LOST_SUFFIX
from ..core.sources.source_formats import SourceFormat
from ..core.targets.rescale import stack_rescale_factors
from ..core.units import human_size
from ..runtime.executors import ExecutorSpec, auto_workers, make_executor
from ..runtime.jobs import RunDir
from ..runtime.memory import freeze_imports, keep_buffers
from ..runtime.output import OutputTree
from ..runtime.profiling import mark, profile_dir, profiled_job
from ..runtime.side_files import protect
from .cpu_path import convert_on_cpu, load_kernels
from .pieces import Piece, piece_sidecar, seal, split_shards
from .plan import ConvertPlan
from .publish import finalize
from .quant_config import build_record
from .safetensors_writer import ShardWriter, direct_pays

__all__ = ["ConvertResult", "run_conversion", "auto_workers"]


@dataclass
class ConvertResult:
    out: Path
    shards: int
    shards_reused: int
    tensors: int
    projections: int
    bytes_in: int
    bytes_out: int
    seconds: float
    rescale_factors: dict = field(default_factory=dict)
    lost_scales: int = 0  # NVFP4 scale bytes the target cannot represent (recorded for the reverse)
    workers: int = 1  # processes the run used, and the most CPU threads one job used (runtime/cpu_budget.py)
    threads: int = 1

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["out"] = str(self.out)
        return d


# -- the step points ---------------------------------------------------------------------------
def _step() -> None:
    """One unit of work done (a tensor written, a finalize stage). Nothing happens here in a run; the
    crash tests replace this function (tests/hooks/sitecustomize.py) to kill the run at a chosen step
    and prove that --resume is safe, so no test switch is read from the environment by shipped code."""


# -- worker side ---------------------------------------------------------------------------------
def _report(nbytes: int, callback=None) -> None:
    if callback is not None:  # the executor's progress channel
        callback(nbytes)


def _write_piece(root: str, fmt: SourceFormat, target, piece: Piece, tmp_path: str, rescale: dict,
                 metadata: dict, threads: int, callback=None) -> tuple[str, str | None, int]:
    """One job of the run, in a worker: `piece` of its shard. The repack runs on `threads` threads
    (the executor's threads_for the piece: 1 in a pool worker, else by its size, runtime/cpu_budget.py)."""
    freeze_imports()
    with profiled_job(piece.name):
        return _write_piece_job(root, fmt, target, piece, tmp_path, rescale, metadata, threads, callback)


def _write_piece_job(root: str, fmt: SourceFormat, target, piece: Piece, tmp_path: str, rescale: dict,
                     metadata: dict, threads: int, callback=None) -> tuple[str, str | None, int]:
    """Write `piece` of its shard into tmp_path: (file, hash, size) for a whole shard, (file, None,
    bytes) for a piece of one (hashed by pieces.seal once its shard is complete)."""
    keep_buffers()
    shard = piece.shard
    with TensorReader(Path(root)) as reader:
        # no fsync per shard: --resume re-hashes every recorded shard, and publish fsyncs everything
        # once before the rename, so the disk writes overlap with the conversion of later shards
        writer = ShardWriter(Path(tmp_path), [o.spec for o in shard.tensors], metadata, fsync=False,
                             part=None if piece.whole else (piece.start, piece.stop),
                             direct=direct_pays(Path(tmp_path).parent))
        try:
            current, parts, lost = None, {}, {}
            for i in range(piece.start, piece.stop):
                o = shard.tensors[i]
                _step()
                if o.source is not None:
                    writer.begin(o.spec.name)
                    for chunk in reader.iter_bytes(o.source):
                        writer.feed(chunk)
                else:
                    p = o.projection
                    if current != p.key:  # a projection's outputs are consecutive: convert it once
                        current = p.key
                        parts = _convert(reader, p, fmt, target, rescale.get(f"{p.container}.{p.stack}", 1.0),
                                         o.tiles, lost, _planned(shard.tensors, i), threads)
                    writer.write(o.spec.name, parts[o.part])
                _report(o.spec.nbytes, callback)
            sha, size = writer.close()
        except BaseException:
            writer.abort()
            raise
    if lost:
        from safetensors.torch import save_file
        save_file(lost, piece_sidecar(tmp_path, piece, LOST_SUFFIX) if not piece.whole
                  else tmp_path.removesuffix(".tmp") + LOST_SUFFIX)
    return shard.file, sha, size


def _planned(tensors, i: int) -> dict:
    """part -> TensorSpec of the converted outputs of the projection whose first output is tensors[i]
    (a projection's outputs are consecutive in the plan)."""
    key = tensors[i].projection.key
    run = itertools.takewhile(lambda o: o.projection is not None and o.projection.key == key, tensors[i:])
    return {o.part: o.spec for o in run if o.source is None}


def _convert(reader: TensorReader, p: Projection, fmt: SourceFormat, target, sf: float, tiles, lost: dict,
             planned: dict, threads: int) -> dict:
    """One projection's output parts (buffers of their planned bytes): the numpy route where it
    applies (convert/cpu_path.py), else the torch route, which checks each part's dtype and shape
    against `planned` and adds to `lost` the scale bytes the target cannot represent. torch is
    imported only when the torch route is taken."""
    parts = convert_on_cpu(reader, p, fmt, target, sf, threads=threads) if tiles is None else None
    if parts is not None:
        return parts
    import torch

    from .transform import convert_with_torch
    torch.set_num_threads(1)  # its small ops only wake OpenMP threads that spin (the repack has its own)
    return convert_with_torch(reader, p, fmt, target, sf, tiles, lost, planned, threads=threads)


def _rescale_for(root: str, act_dtype: str, projections: list[Projection]) -> dict[str, float]:
    with TensorReader(Path(root)) as reader:
        return stack_rescale_factors(reader, projections, act_dtype)


# -- parent side ---------------------------------------------------------------------------------
def run_conversion(plan: ConvertPlan, tree: OutputTree, *, workers: int | None = None, progress: bool = True,
                   executor: ExecutorSpec = ExecutorSpec()) -> ConvertResult:
    """Convert `plan` into `tree.out` (the OutputTree the CLI built and checked: OUT's one owner, with
    --force/--resume)."""
    start = time.perf_counter()
    freeze_imports()  # before the pool forks: the workers inherit it
    ckpt = plan.checkpoint
    protect([ckpt.root], outputs=[tree.out, tree.path])  # side files (profiles) stay off them
    profile_dir()  # refused before any work when it points into them
    resume, pool = tree.resume, None
    try:  # open() inside: a signal that lands in it is still answered (discard() cleans only what open() took)
        done = tree.open(plan.fingerprint())
        run = tree.scratch()
        todo = [s for s in plan.shards if s.file not in done]
        total = sum(s.nbytes for s in todo)
        bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="converting",
                   disable=not progress, dynamic_ncols=True)
        local = executor.name == "local"  # Ray tasks write whole shards: pieces of a file share one page cache
        pieces = split_shards(todo, auto_workers(workers, total, None) if local else 1, auto=workers is None)
        if local and len(pieces) > 1:
            load_kernels()  # once here, inherited by every forked worker
        used = auto_workers(workers, total, len(pieces)) if local else 1
        pool = make_executor(executor, used, bar, max_in_flight=workers)
        threads = max((pool.threads_for(pc.nbytes) for pc in pieces), default=1)
        mark("start")
        pool.check_paths(run, [ckpt.root / f for f in sorted({t.file for t in ckpt.tensors.values()})])
        rescale = _plan_rescale(plan, pool) if plan.needs_rescale else {}
        mark("rescale")
        record = build_record(plan, rescale)  # the config block, the shards' metadata, the manifest's fields
        source = [str(ckpt.root), ckpt.format, plan.target]
        _write_pieces(pool, pieces, run, tree, source, rescale, record.shard_metadata())
        redo = tree.verify_kept()  # hashed while the others converted; one that changed is converted again
        if redo:
            _write_pieces(pool, split_shards([s for s in plan.shards if s.file in redo], 1), run, tree, source,
                          rescale, record.shard_metadata())
        mark("shards")
        bar.close()
        pool.shutdown()
        run.remove()
        lost = finalize(plan, tree, record, step=_step)
        mark("finalize")
        tree.publish(step=_step)
        mark("publish")
    except BaseException as e:
        if pool:
            pool.shutdown(cancel=True)
        tree.discard(keep_verified=resume and isinstance(e, KeyboardInterrupt))  # nothing looks complete
        mapped = _user_error(e, tree, plan)
        if mapped is None:
            raise
        raise mapped from (None if isinstance(e, KeyboardInterrupt) else e)
    return ConvertResult(tree.out, len(plan.shards), len(done) - len(redo), sum(len(s.tensors) for s in plan.shards),
                         len(plan.projections), sum(t.nbytes for t in ckpt.tensors.values()), plan.output_bytes,
                         time.perf_counter() - start, rescale, lost, used, threads)


def _user_error(e: BaseException, tree: OutputTree, plan: ConvertPlan):
    """The typed error to show for an exception that aborted a run, or None to re-raise it as is."""
    staging_path = tree.path
    if isinstance(e, KeyboardInterrupt):
        if tree.published:  # the signal came after the rename: the output is complete
            return Interrupted(f"interrupted after {tree.out} was published; that output is complete",
                               error_id="convert.interrupted", file=str(tree.out),
                               hint=f"run `dsv4-convert validate {tree.out}` to check it")
        if staging_path.exists():  # Ctrl-C during --resume keeps the verified shards (OutputTree.discard)
            return Interrupted(f"interrupted; the verified shards stay in {staging_path}",
                               error_id="convert.interrupted", file=str(staging_path),
                               hint="run the same command with --resume to finish")
        return Interrupted("interrupted; the partial output was removed", error_id="convert.interrupted",
                           hint="run the same command again; it starts over. With --resume, an interrupted run "
                                "keeps its finished shards and the next --resume continues from them")
    if isinstance(e, BrokenProcessPool):
        return OutputError("a worker process died (killed, or out of memory); the partial output was removed",
                           error_id="convert.worker_died", hint="retry with fewer --workers")
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return OutputError(f"no space left while writing {staging_path} ({e.strerror}); the partial output "
                           "was removed", error_id="output.disk_full",
                           hint=f"free at least {human_size(plan.output_bytes)}, or choose another OUT")
    if isinstance(e, OSError):
        return OutputError(f"cannot write the output: {e}", error_id="output.io_error",
                           hint="check the OUT location and permissions")
    return None


def _write_pieces(pool, pieces: list[Piece], run: RunDir, tree: OutputTree, source: list, rescale: dict,
                  meta: dict) -> None:
    """Every piece through the pool (each on the threads the pool gives a job of its size); a whole shard is
    handed over as its job ends, a shard written in pieces once all of them are in and it is sealed
    (hashed, sidecars merged)."""
    split: dict[str, list[Piece]] = {}
    for pc in pieces:
        if not pc.whole:
            split.setdefault(pc.shard.file, []).append(pc)

    def done(file: str, sha: str | None, size: int) -> None:  # sha None: a piece of a shard, sealed below
        if sha is not None:
            tree.take_shard(run, file, size, sha, sidecars=(LOST_SUFFIX,))

    args = [(*source, pc, str(run.tmp(pc.shard.file)), rescale, meta, pool.threads_for(pc.nbytes))
            for pc in pieces]
    pool.map(_write_piece, args, lambda r: done(*r), reports_progress=True, job_bytes=[pc.nbytes for pc in pieces])
    if split:  # hashing reads back from the page cache: one job per shard, in parallel
        pool.map(seal, [(str(run.tmp(f)), f, pcs, LOST_SUFFIX) for f, pcs in split.items()],
                 lambda r: done(*r), job_bytes=[sum(pc.nbytes for pc in pcs) for pcs in split.values()])


def _plan_rescale(plan: ConvertPlan, pool) -> dict[str, float]:
    groups: dict[str, list[Projection]] = {}
    for p in plan.projections:
        if p.quant is Quant.NVFP4:
            groups.setdefault(p.container, []).append(p)
    factors: dict[str, float] = {}
    pool.map(_rescale_for, [(str(plan.checkpoint.root), plan.target.act_dtype, ps) for ps in groups.values()],
             factors.update, job_bytes=[sum(p.scale.nbytes for p in ps) for ps in groups.values()])
    return factors
