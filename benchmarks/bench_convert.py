"""The converter's speed and memory on this machine, in one table, against copies of the same bytes
made in the same run. The numbers in docs/PERFORMANCE.md come from this script.

Printed, in order:
1. the machine (cores, CPU, memory, GPUs, the filesystem the files live on, the load);
2. the README's small synthetic checkpoint converted on the CPU route: cold (an empty numba cache:
   the first run on a fresh machine compiles the kernels) and warm (median of 3);
3. start-up: `--help`, `--version`, and `inspect` and `plan` on header sets of --header-layers
   real-size layers (benchmarks/_inputs.py: the data are holes), medians of 5, beside `python -c pass`;
4. per input layout (--layers real-size DeepSeek-V4-Flash NVFP4 MoE layers of 3.62 GB each, or of
   --experts experts on a small machine (14.16 MB an expert; 96 experts: 1.36 GB), cut into
   shards of --shard-gib): the first conversion right after the input was written (cold: page cache
   dirty, numba cache as found), then every route x --workers ("auto": no --workers, the converter's
   own choice) --repeat times, after --copies rounds of the two copy baselines: one `cp -r` of the
   checkpoint (single stream) and one `cp` per shard all at once (the parallel copy: about what the
   machine can move, the honest ceiling). Every command is followed by `sync`.
Columns: seconds (median), GB/s of input, t / cp1 and t / cpN (the time over the single-stream and
the parallel copy's of the same round; below 1 is faster), CPU seconds (user + sys of the process
tree), memory in MiB: the largest process's peak VmRSS (exact, its VmHWM), its peak RssAnon
(sampled every 20 ms; anonymous memory is what an out-of-memory kill counts: VmRSS also counts
mapped file pages, RssFile / RssShmem), and the summed RssAnon of the tree; start-up (process start to
the first job). Each row's bytes are the same; tests/convert prove the routes byte-identical.

    python benchmarks/bench_convert.py [--dir /dev/shm] [--layers 8|auto] [--experts 256] [--shard-gib 1 4]
        [--workers auto 4 8 16] [--routes cpu ray] [--repeat 2] [--copies 2] [--header-layers 8 43]
        [--format nvfp4-modelopt-dsv4]
        [--target sglang] [--profile] [--skip-small]

--layers auto: as many as --dir holds with room for the output (2.1x the input), at most 8.
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
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _inputs import header_set, synth_layers  # noqa: E402
from _measure import Run, measured  # noqa: E402

from dsv4_convert.core.sources.source_formats import source_format, synth_formats  # noqa: E402
from dsv4_convert.runtime.executors import auto_workers, physical_cores  # noqa: E402
from dsv4_convert.runtime.profiling import breakdown  # noqa: E402
from dsv4_convert.runtime.settings import MARKS_ENV, PROFILE_ENV  # noqa: E402

LAYER_GB = 3.6238848  # one real-size NVFP4 layer
# the formats synth writes one tensor per projection of (the source-format table), and the command of each
COMMANDS = {name: f"{source_format(name).trunk.value}-to-marlin" for name in synth_formats()
            if source_format(name).suffixes is not None}
ROUTES = {  # name -> (extra CLI arguments, extra environment)
    "cpu": ([], {}),  # the local process pool (the converters run on the CPU only: docs/PERFORMANCE.md)
    "ray": (["--executor", "ray"], {"RAY_USAGE_STATS_ENABLED": "0"}),
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
    import numba
    topo = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
    threads = next((line.split(":")[1].strip() for line in topo if line.startswith("Thread(s) per core")), "?")
    return (f"machine: {os.cpu_count()} cores ({physical_cores()} physical, {threads} thread(s) per core; {cpu}), "
            f"{mem:.0f} GiB; GPU: {'; '.join(_gpus()) or 'none'}; files in "
            f"{where} ({fs[1]}, {int(fs[4]) / 2**20:.0f} GiB free); load {' '.join(f'{x:.2f}' for x in os.getloadavg())};"
            f" Python {platform.python_version()}, numba {numba.__version__}")


def _startup(marks_dir: Path, started: float) -> float:
    try:
        marks = dict(json.loads((marks_dir / "driver.json").read_text()))
    except FileNotFoundError:
        return float("nan")
    shutil.rmtree(marks_dir)
    return marks["start"] - started  # perf_counter is CLOCK_MONOTONIC in both processes


def _mem(r: Run) -> str:
    return f"{r.hwm_largest_mib:>7.0f}{r.anon_largest_mib:>7.0f}{r.anon_tree_mib:>7.0f}"


MEM_HEAD = f"{'VmHWM':>7}{'anon':>7}{'anon/t':>7}"


def _copies(src: Path, tmp: Path) -> tuple[Run, Run]:
    """(single-stream cp -r + sync, one cp per file at once + sync)."""
    single = measured(["cp", "-r", str(src), str(tmp / "copy")])
    shutil.rmtree(tmp / "copy")
    (tmp / "copy").mkdir()
    script = f'for f in "{src}"/*; do cp "$f" "{tmp / "copy"}"/ & done; wait'
    parallel = measured(["sh", "-c", script])
    shutil.rmtree(tmp / "copy")
    return single, parallel


def _convert(command, src, out, target, route, workers, env_extra=None, cold_cache: Path | None = None) -> Run:
    args, env = ROUTES[route]
    cmd = [*CLI, command, str(src), str(out), "--target", target, "-q", *args]
    if workers != "auto":
        cmd += ["--workers", str(workers)]
    env = dict(os.environ, **env, **(env_extra or {}))
    if cold_cache is not None:  # an empty numba cache: the kernels are compiled, as on a fresh machine
        env["NUMBA_CACHE_DIR"] = str(cold_cache)
    return measured(cmd, env=env)


def startup_table(tmp: Path, fmt: str, header_layers: list[int]) -> None:
    """--help / --version, and inspect / plan on header sets of real-size layers (benchmarks/_inputs.py:
    256 experts a layer, the data holes; 43 layers is DeepSeek-V4-Flash), medians of 5."""
    one = tmp / "header-layer"
    synth_layers(one, fmt, 1, 1.0, experts=1)
    cases = [("python -c pass", [sys.executable, "-c", "pass"]), ("--help", [*CLI, "--help"]),
             ("--version", [*CLI, "--version"])]
    for layers in header_layers:
        src = tmp / f"headers-{layers}"
        n = header_set(one, src, layers)
        cases += [(f"inspect, {layers} layers ({n} tensors)", [*CLI, "inspect", str(src)]),
                  (f"plan, {layers} layers", [*CLI, "plan", str(src)])]
    print("start-up (median of 5, seconds wall / CPU):", flush=True)
    for name, cmd in cases:
        runs = [_timed_anyway(cmd) for _ in range(5)]  # no memory sampler: it competes for the cores
        print(f"  {name:<40}{statistics.median(r.seconds for r in runs):>6.2f} s"
              f"{statistics.median(r.cpu_seconds for r in runs):>6.2f} CPU s", flush=True)
    for layers in header_layers:
        shutil.rmtree(tmp / f"headers-{layers}")
    shutil.rmtree(one)


def _timed_anyway(cmd) -> Run:
    """Wall and CPU seconds of `cmd`, whatever its exit code (plan exits 1 when no split fits its
    default GPUs)."""
    t = time.perf_counter()
    u0 = os.times()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    u1 = os.times()
    return Run(time.perf_counter() - t, 0, 0, cpu_seconds=u1.children_user + u1.children_system
               - u0.children_user - u0.children_system)


def small_table(tmp: Path) -> None:
    src = tmp / "demo"
    subprocess.run([*CLI, "synth", str(src), "--force", "-q"], check=True)
    cache = tmp / "numba-cold"
    cold = _convert("nvfp4-to-marlin", src, tmp / "demo-out", "sglang", "cpu", "auto", cold_cache=cache)
    shutil.rmtree(tmp / "demo-out")
    warm = []
    for _ in range(3):
        warm.append(_convert("nvfp4-to-marlin", src, tmp / "demo-out", "sglang", "cpu", "auto", cold_cache=cache))
        shutil.rmtree(tmp / "demo-out")
    shutil.rmtree(cache)
    w = min(warm, key=lambda r: r.seconds)
    print(f"small conversion (README synth, {_size(src) / 1e6:.1f} MB, CPU route): cold (empty numba cache) "
          f"{cold.seconds:.2f} s, {cold.cpu_seconds:.2f} CPU s; warm median {statistics.median(r.seconds for r in warm):.2f}"
          f" s, {statistics.median(r.cpu_seconds for r in warm):.2f} CPU s; largest process VmHWM / RssAnon MiB: "
          f"cold {cold.hwm_largest_mib:.0f} / {cold.anon_largest_mib:.0f}, warm {w.hwm_largest_mib:.0f} / "
          f"{w.anon_largest_mib:.0f}", flush=True)


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def layout_table(tmp: Path, args, layers: int, shard_gib: float, routes: list[str]) -> None:
    command = COMMANDS[args.format]
    src = tmp / "src"
    shutil.rmtree(src, ignore_errors=True)
    synth_s = synth_layers(src, args.format, layers, shard_gib, experts=args.experts)
    size, shards = _size(src), len(list(src.glob("*.safetensors")))
    cold = _convert(command, src, tmp / "out", args.target, "cpu", "auto")  # just written: dirty pages
    shutil.rmtree(tmp / "out")
    print(f"\ninput: {layers} real-size layer(s) of {args.experts} experts, {args.format}, {size / 1e9:.2f} GB in {shards} shards "
          f"(written in {synth_s:.1f} s) -> {args.target}; medians of {args.repeat}; memory in MiB\n"
          f"  first conversion right after writing it (cpu, auto = {auto_workers(None, size, None)} workers): "
          f"{cold.seconds:.2f} s, {size / cold.seconds / 1e9:.2f} GB/s, {cold.cpu_seconds:.1f} CPU s, largest "
          f"VmHWM {cold.hwm_largest_mib:.0f}, RssAnon {cold.anon_largest_mib:.0f}, mapped file pages "
          f"{cold.file_largest_mib:.0f}; tree RssAnon {cold.anon_tree_mib:.0f}", flush=True)
    singles, parallels = [], []
    for _ in range(args.copies):
        c1, cn = _copies(src, tmp)
        singles.append(c1)
        parallels.append(cn)
    t1, tn = statistics.median(r.seconds for r in singles), statistics.median(r.seconds for r in parallels)
    cpu1, cpun = statistics.median(r.cpu_seconds for r in singles), statistics.median(r.cpu_seconds for r in parallels)
    rows = [(route, w) for route in routes for w in args.workers]
    header = (f"  {'route':<12}{'workers':>8}{'seconds':>9}{'GB/s':>7}{'t/cp1':>7}{'t/cpN':>7}{'CPU s':>8}{MEM_HEAD}"
              f"{'start-up':>9}")
    runs, starts = {row: [] for row in rows}, {row: [] for row in rows}
    for i in range(args.repeat):  # rounds over every row, so that a burst of load hits no row alone
        for route, w in rows:
            r = _convert(command, src, tmp / "out", args.target, route, w, {MARKS_ENV: str(tmp / "marks")})
            shutil.rmtree(tmp / "out")
            starts[route, w].append(_startup(tmp / "marks", r.started))
            runs[route, w].append(r)
            print(f"    (round {i + 1}: {route} x{w} {r.seconds:.2f} s)", flush=True)  # kept if the run is cut short
    print(header, flush=True)
    for route, w in rows:
        rs = runs[route, w]
        t = statistics.median(r.seconds for r in rs)
        label = f"auto={auto_workers(None, size, None)}" if w == "auto" else w
        worst = max(rs, key=lambda r: r.anon_largest_mib)
        print(f"  {route:<12}{label:>8}{t:>9.2f}{size / t / 1e9:>7.2f}{t / t1:>7.2f}{t / tn:>7.2f}"
              f"{statistics.median(r.cpu_seconds for r in rs):>8.1f}{_mem(worst)}"
              f"{statistics.median(starts[route, w]):>9.2f}", flush=True)
    print(f"  {'cp -r':<12}{'1':>8}{t1:>9.2f}{size / t1 / 1e9:>7.2f}{1:>7.2f}{t1 / tn:>7.2f}{cpu1:>8.1f}   (medians of "
          f"{args.copies}, made before the rows)\n  {'cp per shard':<12}{shards:>8}{tn:>9.2f}{size / tn / 1e9:>7.2f}"
          f"{tn / t1:>7.2f}{1:>7.2f}{cpun:>8.1f}", flush=True)
    if args.profile:
        for route in routes:
            _profile(command, src, tmp, args.target, route, args.workers[-1])


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
    print(f"  profile {route} x{workers} (cProfile adds overhead): wall {r.seconds:.2f} s = {', '.join(phases)}, "
          f"exit+sync {r.started + r.seconds - last:.2f}; jobs (s, summed): wall {b['jobs_wall']:.2f} = "
          f"{', '.join(f'{c} {b[c]:.2f}' for c in cats)}; CPU {b['jobs_cpu']:.2f}, idle {b['idle']:.2f}", flush=True)


def _auto_layers(where: Path, experts: int, most: int = 8) -> int:
    free = shutil.disk_usage(where).free / 1e9
    return max(1, min(most, int(free / (2.1 * LAYER_GB * experts / 256))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cores = os.cpu_count() or 1
    ap.add_argument("--dir", default=None, help="where the files live (/dev/shm: no disk)")
    ap.add_argument("--layers", default="1", help="real-size layers in the input, or 'auto'")
    ap.add_argument("--experts", type=int, default=256,
                    help="experts per layer (256: DeepSeek-V4-Flash, 3.62 GB a layer); fewer for a small machine")
    ap.add_argument("--header-layers", type=int, nargs="+", default=[8, 43],
                    help="layers of the header sets timed by inspect / plan (43: the whole DeepSeek-V4-Flash)")
    ap.add_argument("--shard-gib", type=float, nargs="+", default=[1.0], help="input shard sizes, one table each")
    ap.add_argument("--workers", nargs="+", default=["auto", *sorted({min(4, cores), cores})],
                    help="worker counts ('auto': the converter's choice)")
    ap.add_argument("--routes", nargs="+", choices=list(ROUTES), default=["cpu"], help="executors to measure")
    ap.add_argument("--repeat", type=int, default=2, help="conversions per row (medians)")
    ap.add_argument("--copies", type=int, default=2, help="rounds of both copy baselines per input (medians)")
    ap.add_argument("--format", default="nvfp4-modelopt-dsv4", choices=list(COMMANDS))
    ap.add_argument("--target", default="sglang", choices=["sglang", "vllm"])
    ap.add_argument("--profile", action="store_true", help="one more run per route: where the time goes")
    ap.add_argument("--skip-small", action="store_true", help="no start-up and small-conversion sections")
    args = ap.parse_args()
    args.workers = [w if w == "auto" else int(w) for w in args.workers]
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        tmp = Path(tmp)
        print(_machine(tmp), flush=True)
        layers = _auto_layers(tmp, args.experts) if args.layers == "auto" else int(args.layers)
        if not args.skip_small:
            small_table(tmp)
            startup_table(tmp, args.format, args.header_layers)
        for gib in args.shard_gib:
            layout_table(tmp, args, layers, gib, args.routes)
    print(f"load after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
