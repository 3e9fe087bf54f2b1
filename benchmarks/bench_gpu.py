"""GPU benchmarks on one real-size DeepSeek-V4-Flash MoE layer (256 experts, H 4096, I 2048).

  python benchmarks/bench_gpu.py WORKDIR [--module PATH] [--json FILE]

1. `validate --kernel` on the layer (every expert, source mode: prepared on the GPU as the converter
   would, the engine's MoE GEMM against dequant(SRC), the engine's repack against our words).
2. The load-time cost the plugins remove: vLLM's gptq_marlin_repack on every expert of the layer
   (as its weight loading does it, one expert at a time), its time and peak GPU memory.
The layer comes from `dsv4-convert synth --real-size` (random codes; fine for speed).
Conversion speed, file to file, is benchmarks/bench_convert.py's (the converters run on the CPU only).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from dsv4_convert.core.checkpoint.reader import TensorReader, load_projection, open_checkpoint
from dsv4_convert.core.targets.target import MarlinTarget
from dsv4_convert.validate.inputs import Options
from dsv4_convert.validate.kernel_moe import repack_source
from dsv4_convert.validate.kernel_provider import select_provider
from dsv4_convert.validate.kernel_runner import KernelOptions, run_kernel_checks
from dsv4_convert.validate.report import Report


def _sync_time(fn, *args) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn(*args)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def _layer(src: Path):
    ckpt = open_checkpoint(src)
    with TensorReader(ckpt.root) as r:
        return ckpt, [(p, load_projection(r, p, fmt=ckpt.format)) for p in ckpt.projections]


def bench_kernel_validate(src: Path, engine: str, module: str) -> dict:
    opts = Options(target=MarlinTarget(engine=engine, act_dtype="bfloat16"))
    report = Report(path=str(src), against=None, format=None, options=opts)
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    run_kernel_checks(src, opts, report, kopts=KernelOptions(provider=f"module:{module}"))
    dt = time.perf_counter() - t0
    return {"seconds": round(dt, 2), "stacks": report.kernel, "errors": len(report.results),
            "peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}


def bench_repack(projections, module: str) -> dict:
    provider = select_provider(f"module:{module}", None)
    dev = torch.device("cuda")
    on_gpu = [(d.weight.to(dev), p.n, p.k) for p, d in projections]
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()

    def repack():
        for w, n, k in on_gpu:
            repack_source(provider, w)
    repack()
    t = min(_sync_time(repack) for _ in range(3))
    nbytes = sum(w.numel() for w, _, _ in on_gpu)
    return {"experts": len({p.expert for p, _ in projections}), "weight_gib": round(nbytes / 2**30, 2),
            "seconds": round(t, 3), "gb_s": round(nbytes / t / 1e9, 1),
            "peak_extra_gpu_mib": round((torch.cuda.max_memory_allocated() - base) / 2**20, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("workdir")
    ap.add_argument("--module", required=True)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    work = Path(args.workdir)
    results = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    for fmt, engine in (("nvfp4-modelopt-dsv4", "vllm"), ("mxfp4-dsv4", "sglang")):
        src = work / fmt
        if not src.exists():
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "dsv4_convert.cli", "synth", str(src), "--format", fmt,
                            "--real-size"], check=True, capture_output=True)
            results[f"{fmt}/synth_s"] = round(time.perf_counter() - t0, 1)
        ckpt, projections = _layer(src)
        results[f"{fmt}/repack"] = bench_repack(projections, args.module)
        del projections
        results[f"{fmt}/validate_kernel"] = bench_kernel_validate(src, engine, args.module)
        print(json.dumps({k: v for k, v in results.items() if k.startswith(fmt)}, indent=1), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
