"""Long fuzz profile of the header parsers and open_checkpoint (the targets of
tests/helpers/fuzz_targets.py; the CI profile is tests/reliability/test_fuzz_parsers.py).

    nice python -m benchmarks.fuzz_parsers                 # 100000 examples, split over the targets
    python -m benchmarks.fuzz_parsers --examples 2000 --seed 1

Prints, per target and in total: examples run, failures (must be 0), seconds, and the peak RSS growth.
Exits 1 when any target fails (each failure is printed with its shrunk input).
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
import traceback
from pathlib import Path

from hypothesis import HealthCheck, given, seed, settings

from dsv4_convert.synth import write_synthetic_checkpoint
from tests.helpers.fuzz_targets import TARGETS, make_seeds, run_target, strategy

# share of the examples per target (the header targets are cheap, open_checkpoint reads two shards)
WEIGHTS = {"header_bytes": 0.35, "header_json": 0.35, "index": 0.15, "configs": 0.15}


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _run(name: str, seeds, examples: int, rng_seed: int) -> tuple[int, int, float]:
    count = 0

    @seed(rng_seed)
    @settings(max_examples=examples, deadline=5000, database=None, report_multiple_bugs=True,
              suppress_health_check=list(HealthCheck))
    @given(strategy(name, seeds))
    def fuzz(case):
        nonlocal count
        count += 1
        run_target(name, seeds, case)

    start = time.monotonic()
    failures = 0
    try:
        fuzz()
    except Exception as e:  # noqa: BLE001 (one bug, or a group of distinct ones; shrunk by hypothesis)
        failures = len(getattr(e, "exceptions", [e]))
        traceback.print_exc()
    return count, failures, time.monotonic() - start


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=100_000, help="examples in total, split over the targets")
    ap.add_argument("--seed", type=int, default=0, help="hypothesis seed")
    ap.add_argument("--targets", nargs="*", default=list(TARGETS), choices=list(TARGETS))
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="fuzz-parsers-") as tmp:
        src = write_synthetic_checkpoint(Path(tmp) / "src", format="nvfp4-modelopt-dsv4", layers=1, experts=4,
                                         shards=2)
        work = Path(tmp) / "work"
        work.mkdir()
        seeds = make_seeds(src, work)
        share = sum(WEIGHTS[t] for t in args.targets)
        rss0, start = _peak_rss(), time.monotonic()
        total_examples = total_failures = 0
        print(f"{'target':<14} {'examples':>9} {'failures':>9} {'seconds':>9}")
        for name in args.targets:
            n = max(1, round(args.examples * WEIGHTS[name] / share))
            count, failures, seconds = _run(name, seeds, n, args.seed)
            total_examples += count
            total_failures += failures
            print(f"{name:<14} {count:>9} {failures:>9} {seconds:>9.1f}", flush=True)
        elapsed = time.monotonic() - start
        print(f"{'total':<14} {total_examples:>9} {total_failures:>9} {elapsed:>9.1f}")
        print(f"peak RSS growth {(_peak_rss() - rss0) / 2**20:.1f} MiB; {total_examples / elapsed:.0f} examples/s")
    return 1 if total_failures else 0


if __name__ == "__main__":
    sys.exit(main())
