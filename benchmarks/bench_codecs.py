"""Throughput of the Marlin FP4 codecs, in MB/s of packed FP4 input (N*K/2 bytes; scale bytes are not
counted), against a plain clone() of the same bytes. Also prints the peak RSS of the process.

    python benchmarks/bench_codecs.py --threads 1 --repeat 5
"""

import argparse
import os
import platform
import resource
import time

import torch

from dsv4_convert.core.targets.target import MarlinTarget
from dsv4_convert.formats.marlin import mxfp4_to_marlin, nvfp4_to_marlin
from dsv4_convert.formats.marlin.weight import from_marlin_weight, to_marlin_weight

# DeepSeek-V4-Flash routed expert (H = 4096, I = 2048): w1/w3 are N=2048, K=4096; w2 is N=4096, K=2048
PROJECTIONS = ((2048, 4096), (4096, 2048))


def _best_seconds(fn, repeat: int) -> float:
    fn()  # warm-up: first-touch page faults and lazy imports stay out of the timing
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _cases(n: int, k: int, experts: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    lead = (experts,) if experts > 1 else ()
    packed = torch.randint(0, 256, (*lead, n, k // 2), dtype=torch.uint8, generator=gen)
    # valid positive E4M3 scales (bytes 0x08..0x7E) and E8M0 bytes around 2**0
    nv_scale = torch.randint(0x08, 0x7F, (*lead, n, k // 16), dtype=torch.uint8, generator=gen)
    mx_scale = torch.randint(110, 140, (*lead, n, k // 32), dtype=torch.uint8, generator=gen)
    q16 = to_marlin_weight(packed)
    q8 = to_marlin_weight(packed, w4a8=True)
    vllm, w4a8 = MarlinTarget(engine="vllm", act_dtype="bfloat16"), MarlinTarget(engine="vllm", w4a8=True)
    return packed, [
        ("clone (memcpy baseline)", lambda: packed.clone()),
        ("repack W4A16", lambda: to_marlin_weight(packed)),
        ("repack W4A8", lambda: to_marlin_weight(packed, w4a8=True)),
        ("inverse W4A16", lambda: from_marlin_weight(q16)),
        ("inverse W4A8", lambda: from_marlin_weight(q8, w4a8=True)),
        ("nvfp4_to_marlin (vllm, bf16)", lambda: nvfp4_to_marlin(packed, nv_scale, target=vllm)),
        ("mxfp4_to_marlin (bf16)", lambda: mxfp4_to_marlin(packed, mx_scale, target=vllm)),
        ("mxfp4_to_marlin (W4A8)", lambda: mxfp4_to_marlin(packed, mx_scale, target=w4a8)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (the repack uses as many)")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per case; the best one is reported")
    parser.add_argument("--experts", type=int, default=8, help="experts in the stacked case (0 to skip it)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"threads={torch.get_num_threads()}, best of {args.repeat}")
    print(f"{'case':<30} {'shape [E,] N x K':>18} {'MB':>7} {'ms':>9} {'MB/s':>9} {'vs clone':>9}")
    shapes = [(n, k, 1) for n, k in PROJECTIONS]
    if args.experts > 1:
        shapes.append((*PROJECTIONS[0], args.experts))
    for n, k, experts in shapes:
        packed, cases = _cases(n, k, experts, args.seed)
        mb = packed.numel() / 1e6
        shape = f"{experts} x {n} x {k}" if experts > 1 else f"{n} x {k}"
        clone_rate = None
        for name, fn in cases:
            seconds = _best_seconds(fn, args.repeat)
            rate = mb / seconds
            clone_rate = clone_rate or rate
            print(f"{name:<30} {shape:>18} {mb:7.1f} {seconds * 1e3:9.2f} {rate:9.0f} {rate / clone_rate:9.3f}")
        del packed, cases
    print(f"peak RSS: {_peak_rss_mib():.0f} MiB")


if __name__ == "__main__":
    main()
