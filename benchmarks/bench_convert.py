"""The converter's speed on this machine: one real-size DeepSeek-V4-Flash MoE layer (`synth --real-size`:
256 experts, H 4096, I 2048; 3.6 GB NVFP4, 3.4 GB MXFP4) converted by every route (the CPU route in
worker processes; `--device cuda` where a GPU is visible; on request the CPU route in threads and
`--executor ray` on a one-node cluster) at several --workers, against a plain copy
of the same bytes (`cp -r` + `sync`) in the same run, alternating, so the disk and the load are the
same for both. The numbers in docs/PERFORMANCE.md come from this script.

Printed: a line naming the machine (cores, CPU, memory, GPUs, the filesystem the files live on, the
load), then one row per route x workers with the medians of --repeat runs: seconds, GB/s of input,
the time over the copy's (t/cp: below 1 converts faster than `cp -r` copies), CPU seconds (user + sys of the whole process tree), peak RSS (summed over the
tree, and of the largest process), and the start-up (process start to the first job: imports,
planning, the pool; runtime/profiling.py's driver marks). A warm-up conversion first (untimed):
compiled kernels cached, page cache warm, as on a machine that converts more than once.

With --profile, one more (untimed) run per route at the most workers, under DSV4_CONVERT_PROFILE:
the driver's phases and, summed over the jobs, the seconds in read, weights, scales, globals, hash,
write and Python, their CPU seconds and their idle seconds (wall - CPU).

    python benchmarks/bench_convert.py [--dir /dev/shm] [--workers 1 4 16] [--routes cpu cuda]
        [--repeat 3] [--format nvfp4-modelopt-dsv4] [--target sglang] [--profile]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _measure import measured  # noqa: E402

from dsv4_convert.runtime.profiling import breakdown  # noqa: E402
from dsv4_convert.runtime.settings import MARKS_ENV, PROFILE_ENV  # noqa: E402

FULL_CHECKPOINT_GB = 148.66 * 2**30 / 1e9
COMMANDS = {"nvfp4-modelopt-dsv4": "nvfp4-to-marlin", "nvfp4-modelopt-hf": "nvfp4-to-marlin",
            "nvfp4-ct": "nvfp4-to-marlin", "mxfp4-dsv4": "mxfp4-to-marlin", "mxfp4-ct": "mxfp4-to-marlin"}
ROUTES = {  # name -> (extra CLI arguments, extra environment)
    "cpu": ([], {}),
    "cuda": (["--device", "cuda"], {}),
    "cpu-threads": ([], {"DSV4_CONVERT_THREADS": "1"}),  # the CPU route in --device cuda's thread executor
    "ray": (["--executor", "ray"], {"RAY_USAGE_STATS_ENABLED": "0"}),  # a one-node cluster started by the run
}
CLI = [sys.executable, "-m", "dsv4_convert.cli"]


def _gpus() -> list[str]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def _machine(where: Path) -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else "?"
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    fs = subprocess.run(["df", "-T", str(where)], capture_output=True, text=True).stdout.splitlines()[-1].split()
    gpus = _gpus()
    return (f"machine: {os.cpu_count()} cores ({cpu}), {mem:.0f} GiB; GPU: {'; '.join(gpus) or 'none'}; files in "
            f"{where} ({fs[1]} on {fs[0]}); load {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
            f"Python {platform.python_version()}")


def _convert(command, src, out, target, route, workers, env_extra=None):
    args, env = ROUTES[route]
    cmd = [*CLI, command, str(src), str(out), "--target", target, "--workers", str(workers), "-q", *args]
    return measured(cmd, env=dict(os.environ, **env, **(env_extra or {})))


def _startup(marks_dir: Path, started: float) -> float:
    marks = dict(json.loads((marks_dir / "driver.json").read_text()))
    shutil.rmtree(marks_dir)
    return marks["start"] - started  # perf_counter is CLOCK_MONOTONIC in both processes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cores = os.cpu_count() or 1
    ap.add_argument("--dir", default=None, help="where the files live (needs ~3x 3.6 GB; /dev/shm: no disk)")
    ap.add_argument("--workers", type=int, nargs="+", default=sorted({1, min(4, cores), cores}))
    ap.add_argument("--routes", nargs="+", choices=list(ROUTES), default=None,
                    help="default: cpu, and cuda where nvidia-smi sees a GPU")
    ap.add_argument("--repeat", type=int, default=3, help="alternating copy / convert pairs per row (medians)")
    ap.add_argument("--format", default="nvfp4-modelopt-dsv4", choices=list(COMMANDS))
    ap.add_argument("--target", default="sglang", choices=["sglang", "vllm"])
    ap.add_argument("--profile", action="store_true", help="one more run per route: where the time goes")
    args = ap.parse_args()
    routes = args.routes or (["cpu", "cuda"] if _gpus() else ["cpu"])
    command = COMMANDS[args.format]
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        tmp = Path(tmp)
        print(_machine(tmp), flush=True)
        src = tmp / "src"
        measured([*CLI, "synth", str(src), "--format", args.format, "--real-size", "--force", "-q"])
        size = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
        shards = len(list(src.glob("*.safetensors")))
        print(f"input: {args.format}, {size / 1e9:.2f} GB in {shards} shards -> {args.target}; medians of "
              f"{args.repeat}; RSS in MiB", flush=True)
        _convert(command, src, tmp / "out", args.target, routes[-1], max(args.workers))  # warm-up
        shutil.rmtree(tmp / "out")
        print(f"{'route':<12}{'workers':>8}{'seconds':>9}{'GB/s':>7}{'t/cp':>7}{'CPU s':>8}{'RSS tree':>10}"
              f"{'largest':>9}{'start-up':>10}{'149 GB':>9}", flush=True)
        copies = []
        for route in routes:
            for w in args.workers:
                runs, starts = [], []
                for _ in range(args.repeat):
                    copies.append(measured(["cp", "-r", str(src), str(tmp / "copy")]).seconds)
                    shutil.rmtree(tmp / "copy")
                    r = _convert(command, src, tmp / "out", args.target, route, w, {MARKS_ENV: str(tmp / "marks")})
                    starts.append(_startup(tmp / "marks", r.started))
                    runs.append(r)
                    shutil.rmtree(tmp / "out")
                t = statistics.median(r.seconds for r in runs)
                rate = size / t / 1e9
                print(f"{route:<12}{w:>8}{t:>9.2f}{rate:>7.2f}{t / statistics.median(copies[-args.repeat:]):>7.2f}"
                      f"{statistics.median(r.cpu_seconds for r in runs):>8.1f}{max(r.tree_mib for r in runs):>10.0f}"
                      f"{max(r.largest_mib for r in runs):>9.0f}{statistics.median(starts):>10.2f}"
                      f"{FULL_CHECKPOINT_GB / rate / 60:>6.1f} min", flush=True)
        t_copy = statistics.median(copies)
        print(f"{'cp -r+sync':<12}{'':>8}{t_copy:>9.2f}{size / t_copy / 1e9:>7.2f}{1:>7.2f}   (all "
              f"{len(copies)} copies)", flush=True)
        if args.profile:
            for route in routes:
                _profile(command, src, tmp, args.target, route, max(args.workers))
    print(f"load after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def _profile(command, src, tmp, target, route, workers) -> None:
    prof = tmp / "profile"
    r = _convert(command, src, tmp / "out", target, route, workers, {PROFILE_ENV: str(prof)})
    shutil.rmtree(tmp / "out")
    marks = json.loads((prof / "driver.json").read_text())
    phases, last = [], r.started
    for name, t in marks:
        phases.append(f"{'start-up' if name == 'start' else name} {t - last:.2f}")
        last = t
    b = breakdown(prof)
    shutil.rmtree(prof)
    cats = ["read", "weights", "scales", "globals", "hash", "write", "python"]
    print(f"profile {route} x{workers} (cProfile adds overhead): wall {r.seconds:.2f} s = {', '.join(phases)}, "
          f"exit+sync {r.started + r.seconds - last:.2f}; jobs (s, summed): wall {b['jobs_wall']:.2f} = "
          f"{', '.join(f'{c} {b[c]:.2f}' for c in cats)}; CPU {b['jobs_cpu']:.2f}, idle {b['idle']:.2f}", flush=True)


if __name__ == "__main__":
    main()
