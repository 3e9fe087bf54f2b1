"""Full `dsv4-convert validate` of a real-size DeepSeek-V4-Flash MoE layer (256 experts, H=4096,
I=2048, ~3.4 GB) against `cp -r` + `sync` of the same directory, measured in the same run.

    .venv/bin/python benchmarks/bench_validate.py [--dir /tmp/bench-validate] [--format mxfp4-dsv4 ...]

Target: validation within 1.5x of the copy. Peak RSS is summed over the validate process tree, sampled every 20 ms from /proc:
anonymous memory (what the tool holds) and file-backed pages (the memory-mapped shards) apart. Both runs see the same (warm) page cache: synth just wrote the files.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

CLI = [sys.executable, "-m", "dsv4_convert.cli"]


def _status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _tree_rss(pid: int) -> tuple[int, int]:
    """(anonymous, file-backed) resident bytes of `pid` and all its descendants. File-backed pages
    are the memory-mapped shards: page cache the kernel can drop, not memory the tool holds."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(d))
            except (OSError, IndexError, ValueError):
                continue
    anon = mapped = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            anon += _status_kib(p, "RssAnon") * 1024
            mapped += _status_kib(p, "RssFile") * 1024
        except OSError:
            pass
        todo += children.get(p, [])
    return anon, mapped


def timed(cmd: list[str]) -> tuple[float, tuple[int, int], int]:
    """(seconds, peak (anonymous, file-backed) tree RSS in bytes, exit code)."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = (0, 0)

    def poll():
        nonlocal peak
        while proc.poll() is None:
            anon, mapped = _tree_rss(proc.pid)
            peak = (max(peak[0], anon), max(peak[1], mapped))
            time.sleep(0.02)

    t = threading.Thread(target=poll)
    t.start()
    _, err = proc.communicate()
    t.join()
    if proc.returncode not in (0,):
        sys.stderr.write(err.decode()[-2000:])
    return time.monotonic() - start, peak, proc.returncode


def bench(fmt: str, base: Path, workers: int) -> dict:
    src = base / f"{fmt}-layer"
    if not (src / "config.json").exists():
        subprocess.run(CLI + ["synth", str(src), "--format", fmt, "--real-size", "--force"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    size = sum(p.stat().st_size for p in src.iterdir())
    dst = base / f"{fmt}-copy"
    shutil.rmtree(dst, ignore_errors=True)
    cp_s, _, _ = timed(["sh", "-c", f"cp -r '{src}' '{dst}' && sync"])
    shutil.rmtree(dst, ignore_errors=True)
    v_s, v_rss, code = timed(CLI + ["validate", str(src), "--quiet", "--workers", str(workers),
                                    "--report", str(base / f"{fmt}-report.json")])
    return {"format": fmt, "bytes": size, "cp_sync_s": cp_s, "validate_s": v_s, "ratio": v_s / cp_s,
            "validate_peak_anon_mib": v_rss[0] / 2**20, "validate_peak_mapped_mib": v_rss[1] / 2**20,
            "exit_code": code}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="/tmp/bench-validate")
    ap.add_argument("--format", action="append", choices=["mxfp4-dsv4", "nvfp4-modelopt-dsv4"])
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the synthesized layers for the next run")
    args = ap.parse_args()
    base = Path(args.dir)
    base.mkdir(parents=True, exist_ok=True)
    print(f"{'format':22s} {'size':>9s} {'cp+sync':>9s} {'validate':>9s} {'ratio':>6s} {'peak anon':>10s} "
          f"{'(mapped)':>10s}  target <= 1.5x")
    for fmt in args.format or ["mxfp4-dsv4", "nvfp4-modelopt-dsv4"]:
        r = bench(fmt, base, args.workers)
        print(f"{r['format']:22s} {r['bytes'] / 1e9:7.2f}GB {r['cp_sync_s']:8.1f}s {r['validate_s']:8.1f}s "
              f"{r['ratio']:5.2f}x {r['validate_peak_anon_mib']:8.0f}MiB {r['validate_peak_mapped_mib']:8.0f}MiB  "
              f"{'ok' if r['ratio'] <= 1.5 and r['exit_code'] == 0 else 'MISSED'} (validate exit {r['exit_code']})")
        if not args.keep:
            shutil.rmtree(base / f"{fmt}-layer", ignore_errors=True)


if __name__ == "__main__":
    main()
