"""Convert one real-size DeepSeek-V4-Flash MoE layer (256 experts, H=4096, I=2048; ~3.4 GB) and
compare with a plain copy of the same bytes, in the same run:
  (a) cp -r IN + sync      (b) dsv4-convert {nvfp4,mxfp4}-to-marlin IN OUT --workers N + sync
Reports seconds, the ratio b/a (target <= 1.25 on 2 cores), peak RSS of the converter's process tree
(target <= 1 GiB), and the projected time for the full 149 GB checkpoint.

    python benchmarks/bench_convert.py [--workers 2] [--formats nvfp4-modelopt-dsv4 mxfp4-dsv4] [--target sglang]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _measure import timed  # noqa: E402

FULL_CHECKPOINT_GB = 148.66 * 2**30 / 1e9
COMMAND = {"nvfp4-modelopt-dsv4": "nvfp4-to-marlin", "mxfp4-dsv4": "mxfp4-to-marlin"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--target", default="sglang", choices=["sglang", "vllm"])
    ap.add_argument("--formats", nargs="+", default=list(COMMAND), choices=list(COMMAND))
    ap.add_argument("--dir", default=None, help="scratch directory (needs ~3x 3.6 GB)")
    args = ap.parse_args()
    cli = [sys.executable, "-m", "dsv4_convert.cli"]
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        tmp = Path(tmp)
        print(f"{'format':<22}{'GB':>6}{'cp+sync s':>11}{'convert s':>11}{'ratio':>7}{'GB/s':>7}{'peak RSS MiB':>14}"
              f"{'149 GB est.':>13}")
        for fmt in args.formats:
            src = tmp / f"src-{fmt}"
            timed([*cli, "synth", str(src), "--format", fmt, "--real-size", "--force"])
            size = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
            t_copy, _ = timed(["cp", "-r", str(src), str(tmp / "copy")])
            t_conv, rss = timed([*cli, COMMAND[fmt], str(src), str(tmp / "out"), "--workers", str(args.workers),
                                 "--target", args.target, "-q"])
            rate = size / t_conv / 1e9
            print(f"{fmt:<22}{size / 1e9:>6.2f}{t_copy:>11.2f}{t_conv:>11.2f}{t_conv / t_copy:>7.2f}{rate:>7.2f}"
                  f"{rss:>14.0f}{FULL_CHECKPOINT_GB / rate / 60:>10.1f} min")
            for d in ("copy", "out", f"src-{fmt}"):
                shutil.rmtree(tmp / d)


if __name__ == "__main__":
    main()
