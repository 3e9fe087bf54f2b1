"""Issue 37: `--resume` must not cost more than starting over. A synthetic checkpoint of --shards
shards is converted fresh, and converted again from an interrupted run that finished the first half of
its shards (SIGKILLed by the crash tests' step hook, tests/hooks, at the first tensor of the next shard,
with --workers 1 so that the shards finish in order); fresh and resumed runs alternate, --rounds times,
both with the converter's own worker count. Printed: each round, then the medians. docs/PERFORMANCE.md
has the numbers.

    python benchmarks/bench_resume.py [--dir /tmp] [--shards 4] [--layers 4] [--experts 32] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "dsv4_convert.cli"]
HOOKS = REPO / "tests" / "hooks"


def _timed(argv: list[str], env: dict | None = None) -> float:
    start = time.perf_counter()
    proc = subprocess.run([*CLI, *map(str, argv)], capture_output=True, text=True, env=env)
    took = time.perf_counter() - start
    if proc.returncode != 0 and env is None:
        raise SystemExit(f"{' '.join(map(str, argv))} exited {proc.returncode}:\n{proc.stderr}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--size", type=int, default=1024, help="hidden and intermediate size")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-resume-", dir=args.dir))
    try:
        src = work / "src"
        _timed(["synth", src, "--format", "nvfp4-modelopt-dsv4", "--layers", args.layers, "--experts", args.experts,
                "--hidden", args.size, "--intermediate", args.size, "--shards", args.shards, "-q"])
        plan = json.loads(subprocess.run([*CLI, "nvfp4-to-marlin", str(src), "--dry-run", "--json", "-q"],
                                         capture_output=True, text=True, check=True).stdout)
        half = len(plan["shards"]) // 2
        kill_at = sum(s["tensors"] for s in plan["shards"][:half]) + 1
        size = sum(s["bytes"] for s in plan["shards"])
        print(f"{len(plan['shards'])} shards, {size / 2**20:.0f} MiB out; resume reuses {half}; "
              f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
        killer = dict(os.environ, DSV4_CONVERT_KILL_AT=str(kill_at),
                      PYTHONPATH=os.pathsep.join(filter(None, [str(HOOKS), os.environ.get("PYTHONPATH")])))
        fresh, resumed = [], []
        for r in range(args.rounds):
            shutil.rmtree(work / "fresh", ignore_errors=True)
            fresh.append(_timed(["nvfp4-to-marlin", src, work / "fresh", "-q"]))
            shutil.rmtree(work / "res", ignore_errors=True)
            shutil.rmtree(work / "res.partial", ignore_errors=True)
            _timed(["nvfp4-to-marlin", src, work / "res", "-q", "--workers", "1"], env=killer)
            kept = len(list((work / "res.partial").glob("*.safetensors")))
            assert kept == half, f"the interrupted run finished {kept} shards, expected {half}"
            resumed.append(_timed(["nvfp4-to-marlin", src, work / "res", "-q", "--resume"]))
            print(f"round {r + 1}: fresh {fresh[-1]:.2f} s, resume {resumed[-1]:.2f} s "
                  f"(load {os.getloadavg()[0]:.1f})")
        print(f"median: fresh {statistics.median(fresh):.2f} s, resume {statistics.median(resumed):.2f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
