"""Where a conversion's time goes (benchmarks/bench_convert.py --profile). Off unless the environment
names a directory in DSV4_CONVERT_PROFILE; then every shard job runs under cProfile and leaves
`<dir>/<shard>.prof` and `<dir>/<shard>.json` (the job's wall, user and sys seconds), and the driver
leaves `<dir>/driver.json` (wall clock at each phase boundary). `breakdown` sums them into the
categories of issue 13: read, transform (weights, scales, globals), hash, write, Python, idle.

cProfile sees the job's main thread only. With O_DIRECT (runtime/direct_io.py) the hashing and the
pwrite run in the writer's thread, beside the conversion: "write" is then the time the main thread
waits for a free bounce buffer or for the last writes (plus the copy into the buffers, under
"python"), and "hash" is near zero; on the buffered path (DSV4_CONVERT_DIRECT_IO=0) both are the
main thread's own calls, as before."""

from __future__ import annotations

import contextlib
import cProfile
import json
import marshal
import os
import pstats
import resource
import time
from pathlib import Path

from ..core.errors import OutputError
from .settings import PROFILE_ENV, settings
from .side_files import guard, write_side_file

__all__ = ["profile_dir", "profiled_job", "mark", "breakdown"]

_marks: list[tuple[str, float]] = []

# category -> functions whose cumulative time counts there (file suffix, function name); disjoint call trees
_CUMULATIVE = {
    # the torch route (convert/transform.py) and the numpy route (convert/cpu_path.py); a third element
    # counts only the calls made from that file (the torch route's wrappers call the same numpy code)
    "read": [("core/checkpoint/reader.py", "load_projection"), ("core/checkpoint/reader.py", "iter_bytes"), ("convert/cpu_path.py", "_rows")],
    "weights": [("formats/marlin/weight.py", "to_marlin_weight"), ("formats/marlin/reference_weight.py", "a16_forward",
                                                                     "convert/cpu_path.py")],
    "scales": [("formats/marlin/scales.py", "permute_scale_columns"), ("formats/marlin/scales.py", "nvfp4_scales_to_s0e5m3"),
               ("formats/marlin/scales.py", "mxfp4_scales_to_marlin"), ("convert/transform.py", "_refuse_nan_scales"),
               ("convert/transform.py", "lost_scales"),
               ("formats/marlin/reference_scales.py", "permute_scales", "convert/cpu_path.py"),
               ("formats/marlin/compiled_kernels.py", "byte_presence", "convert/cpu_path.py")],
    "globals": [("formats/marlin/scales.py", "nvfp4_global_to_marlin"),
                ("formats/marlin/reference_scales.py", "global_to_marlin", "convert/cpu_path.py")],
    "write": [("runtime/direct_io.py", "_wait_for_buffer"), ("runtime/direct_io.py", "_wait_for_thread")],
}
_SELF = {  # category -> builtins whose own time counts there
    "hash": ["of 'xxhash."],
    "write": ["posix.write", "posix.pwrite", "posix.fsync", "'write' of '_io.", "sync_file_range", "copy_file_range"],
}


def profile_dir(marks: bool = False) -> Path | None:
    """The profile directory (with `marks`, the marks-only one: DSV4_CONVERT_MARKS), guarded like every
    side file (never inside IN or OUT), created."""
    d = settings().marks if marks else settings().profile
    if not d:
        return None
    real = guard(d, "profile", directory=True)
    try:
        real.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"cannot create the profile directory {d}: {e.strerror}", error_id="profile.not_writable",
                          file=d, hint=f"point {PROFILE_ENV} at a writable directory outside IN and OUT") from None
    return real


def _write(path: Path, data: bytes) -> None:
    write_side_file(path, "profile", lambda f: f.write(data))


@contextlib.contextmanager
def profiled_job(name: str):
    """Run one shard job under cProfile when profiling is on; a no-op otherwise."""
    d = profile_dir()
    if d is None:
        yield
        return
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    prof = cProfile.Profile()  # wall clock (a CPU-time timer is a system call per event: it distorted more)
    try:
        prof.enable()
    except ValueError:  # Python >= 3.12: one profiler per process, and a job thread beside holds it
        prof = None
    try:
        yield
    finally:
        if prof is not None:
            prof.disable()
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        if prof is not None:
            prof.create_stats()
            _write(d / f"{name}.prof", marshal.dumps(prof.stats))  # what pstats.Stats reads (dump_stats' format)
        _write(d / f"{name}.json", json.dumps({
            "wall": time.perf_counter() - t0, "user": r1.ru_utime - r0.ru_utime, "sys": r1.ru_stime - r0.ru_stime,
            "pid": os.getpid()}).encode())


def mark(phase: str) -> None:
    """Driver side: note the wall clock at the end of `phase`; written out at once (a crash keeps it)."""
    d = profile_dir() or profile_dir(marks=True)
    if d is None:
        return
    _marks.append((phase, time.perf_counter()))
    _write(d / "driver.json", json.dumps(_marks).encode())


def breakdown(d: Path) -> dict[str, float]:
    """Seconds per category summed over every job in `d`: wall seconds spent inside the category's
    functions (they add up to the jobs' wall time), and apart from them `idle`: the jobs' wall minus
    their CPU time (waiting: on the disk's writeback throttle, or for a core on a busy machine)."""
    out = dict.fromkeys(["read", "weights", "scales", "globals", "hash", "write", "python", "idle", "jobs_wall",
                         "jobs_cpu"], 0.0)
    for js in sorted(Path(d).glob("*.json")):
        if js.name == "driver.json":
            continue
        job = json.loads(js.read_text())
        prof = js.with_suffix(".prof")  # absent for a job whose thread could not profile (see profiled_job)
        stats = pstats.Stats(str(prof)).stats if prof.exists() else {}  # {(file, line, func): (cc, nc, tt, ct, callers)}
        total = sum(v[2] for v in stats.values())
        used = 0.0
        for cat, entries in _CUMULATIVE.items():
            for (file, _, func), v in stats.items():
                for f, fn, *caller in entries:
                    if file.endswith(f) and func == fn:
                        ct = v[3] if not caller else sum(c[3] for k, c in v[4].items() if k[0].endswith(caller[0]))
                        out[cat] += ct
                        used += ct
        for cat, names in _SELF.items():
            for (file, _, func), v in stats.items():
                if file == "~" and any(n in func for n in names):
                    out[cat] += v[2]
                    used += v[2]
        out["python"] += max(0.0, total - used)
        cpu = job["user"] + job["sys"]
        out["jobs_wall"] += job["wall"]
        out["jobs_cpu"] += cpu
        out["idle"] += max(0.0, job["wall"] - cpu)
    return out
