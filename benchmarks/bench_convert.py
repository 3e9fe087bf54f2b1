"""Convert one real-size DeepSeek-V4-Flash MoE layer (256 experts, H=4096, I=2048; 3.4-3.6 GB) and
compare with a plain copy of the same bytes, alternating in the same run (the disk's writeback
makes single runs vary 1.6-9 s here, so only alternating medians mean anything):
  (a) sync; cp -r IN COPY; sync      (b) sync; dsv4-convert ... IN OUT --workers N; sync
for the three default cases: NVFP4 -> sglang, NVFP4 -> vllm, MXFP4 -> sglang. Reports the medians
of --repeat pairs: seconds, ratio b/a (target <= 1.25 on 2 cores), GB/s of input (target >= 1.3),
peak RSS of the largest process and of the process tree (target <= 1 GiB each), the load average,
and the projected time for the full 149 GB checkpoint.
With --profile, one more (untimed) conversion per case runs with DSV4_CONVERT_PROFILE set
(runtime/profiling.py): the driver's phases (start-up = imports + planning, the vLLM rescale pass,
shard jobs, finalize, publish = the fsync of everything) and, summed over the shard jobs, the wall
seconds inside read, weights, scales, globals, hash, write and Python, the jobs' CPU seconds, and
their idle seconds (wall - CPU: waiting for the disk, or for a core on a busy machine).

    python benchmarks/bench_convert.py [--workers 2] [--repeat 3] [--cases nvfp4-sglang ...] [--profile]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _measure import measured  # noqa: E402

from dsv4_convert.runtime.profiling import PROFILE_ENV, breakdown  # noqa: E402

FULL_CHECKPOINT_GB = 148.66 * 2**30 / 1e9
CASES = {  # name -> (synth format, command, target)
    "nvfp4-sglang": ("nvfp4-modelopt-dsv4", "nvfp4-to-marlin", "sglang"),
    "nvfp4-vllm": ("nvfp4-modelopt-dsv4", "nvfp4-to-marlin", "vllm"),
    "mxfp4-sglang": ("mxfp4-dsv4", "mxfp4-to-marlin", "sglang"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3, help="alternating cp / convert pairs per case (median)")
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--dir", default=None, help="scratch directory (needs ~3x 3.6 GB)")
    ap.add_argument("--profile", action="store_true", help="one more run per case: where the time goes")
    args = ap.parse_args()
    cli = [sys.executable, "-m", "dsv4_convert.cli"]
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} cores")
    print(f"{'case':<14}{'GB':>6}{'cp+sync s':>11}{'convert s':>11}{'ratio':>7}{'GB/s':>7}{'RSS largest':>12}"
          f"{'RSS tree':>10}{'149 GB est.':>13}  (MiB; medians of {args.repeat})")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        tmp = Path(tmp)
        sources: dict[str, Path] = {}
        for case in args.cases:
            fmt, command, target = CASES[case]
            src = sources.get(fmt)
            if src is None:
                for old in sources.values():
                    shutil.rmtree(old)
                sources.clear()
                src = sources[fmt] = tmp / f"src-{fmt}"
                measured([*cli, "synth", str(src), "--format", fmt, "--real-size", "--force"])
            size = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
            copies, convs = [], []
            for _ in range(args.repeat):
                copies.append(measured(["cp", "-r", str(src), str(tmp / "copy")]).seconds)
                shutil.rmtree(tmp / "copy")
                convs.append(measured([*cli, command, str(src), str(tmp / "out"), "--workers", str(args.workers),
                                       "--target", target, "-q"]))
                shutil.rmtree(tmp / "out")
            t_copy = statistics.median(copies)
            t_conv = statistics.median(r.seconds for r in convs)
            ratio = statistics.median(r.seconds / c for r, c in zip(convs, copies))
            rate = size / t_conv / 1e9
            print(f"{case:<14}{size / 1e9:>6.2f}{t_copy:>11.2f}{t_conv:>11.2f}{ratio:>7.2f}{rate:>7.2f}"
                  f"{max(r.largest_mib for r in convs):>12.0f}{max(r.tree_mib for r in convs):>10.0f}"
                  f"{FULL_CHECKPOINT_GB / rate / 60:>10.1f} min", flush=True)
            print(f"{'':<14}runs: cp {' '.join(f'{c:.2f}' for c in copies)}; convert "
                  f"{' '.join(f'{r.seconds:.2f}' for r in convs)}", flush=True)
            if args.profile:
                _profile(cli, command, src, tmp, target, args.workers)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def _profile(cli, command, src, tmp, target, workers) -> None:
    prof = tmp / "profile"
    env = dict(os.environ, **{PROFILE_ENV: str(prof)})
    r = measured([*cli, command, str(src), str(tmp / "out"), "--workers", str(workers), "--target", target, "-q"],
                 env=env)
    shutil.rmtree(tmp / "out")
    marks = json.loads((prof / "driver.json").read_text())
    t0 = r.started  # perf_counter is CLOCK_MONOTONIC: the driver's marks use the same clock
    phases, last = [], t0
    for name, t in marks:
        phases.append(f"{'start-up' if name == 'start' else name} {t - last:.2f}")
        last = t
    b = breakdown(prof)
    shutil.rmtree(prof)
    print(f"{'':<14}profile (load {os.getloadavg()[0]:.2f}; cProfile adds overhead): wall {r.seconds:.2f} s = "
          f"{', '.join(phases)}, exit+sync {t0 + r.seconds - last:.2f}", flush=True)
    cats = ["read", "weights", "scales", "globals", "hash", "write", "python"]
    print(f"{'':<14}jobs (s, summed over workers): wall {b['jobs_wall']:.2f} = "
          f"{', '.join(f'{c} {b[c]:.2f}' for c in cats)}; CPU {b['jobs_cpu']:.2f}, idle (wall - CPU) "
          f"{b['idle']:.2f}", flush=True)


if __name__ == "__main__":
    main()
