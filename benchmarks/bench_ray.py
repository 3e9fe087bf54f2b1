"""The overhead of Ray on one node: convert one real-size DeepSeek-V4-Flash MoE layer (`synth --real-size`,
~3.4-3.6 GB) with --executor local and with --executor ray (a one-machine cluster started by the run),
against a plain copy of the same bytes in the same run. Reports seconds, GB/s, the ratio to the copy,
and the peak RSS of each process tree (Ray's own daemons included for the ray run).

    python benchmarks/bench_ray.py [--workers 2] [--format nvfp4-modelopt-dsv4] [--dir /scratch]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _measure import timed  # noqa: E402

COMMAND = {"nvfp4-modelopt-dsv4": "nvfp4-to-marlin", "mxfp4-dsv4": "mxfp4-to-marlin"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--format", default="nvfp4-modelopt-dsv4", choices=list(COMMAND))
    ap.add_argument("--dir", default=None, help="scratch directory (needs ~3x 3.6 GB)")
    args = ap.parse_args()
    cli = [sys.executable, "-m", "dsv4_convert.cli"]
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        tmp = Path(tmp)
        src = tmp / "src"
        timed([*cli, "synth", str(src), "--format", args.format, "--real-size", "--force"])
        size = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
        t_copy, _ = timed(["cp", "-r", str(src), str(tmp / "copy")])
        shutil.rmtree(tmp / "copy")
        print(f"{args.format}, {size / 1e9:.2f} GB, --workers {args.workers}; cp -r + sync: {t_copy:.2f} s")
        print(f"{'executor':<10}{'seconds':>9}{'GB/s':>7}{'vs cp':>7}{'peak RSS MiB':>14}")
        for executor in ("local", "ray"):
            out = tmp / executor / "out"
            t, rss = timed([*cli, COMMAND[args.format], str(src), str(out), "--workers", str(args.workers),
                            "--executor", executor, "-q"], env=env)
            print(f"{executor:<10}{t:>9.2f}{size / t / 1e9:>7.2f}{t / t_copy:>7.2f}{rss:>14.0f}")
            shutil.rmtree(tmp / executor)


if __name__ == "__main__":
    main()
