#!/usr/bin/env python3
"""Build SGLang 0.5.23's JIT Marlin kernels (the MoE GEMM and the repack) with SGLang's own JIT loader.

  python build.py              # assemble, compile (fp16 + bf16 MoE GEMM, repack); prints PYTHONPATH
  import build; build.load()   # from Python (this folder on sys.path): SGLang's two op modules

SGLang 0.5.23 has no prebuilt Marlin op (its kernel wheel, sglang-kernel 0.4.10, ships none): the ops
`sglang.kernels.ops.moe.moe_wna16_marlin.moe_wna16_marlin_gemm` and
`sglang.kernels.ops.quantization.gptq_marlin_repack.gptq_marlin_repack` compile their `.cuh` sources on
first use through `sglang.kernels.jit.utils.load_jit` (ninja + nvcc for the local GPU's arch, loaded by
tvm_ffi). This folder carries those files from the sglang-0.5.23 wheel unchanged (src/sglang, sha256 in
SOURCES.sha256; and the dist-info METADATA, so that the version reads 0.5.23), sgl_kernel/scalar_type.py from sglang-kernel 0.4.10 unchanged (SGLang passes
`scalar_types.float4_e2m1f` from it), the two wheels the loader needs (wheels/: apache-tvm-ffi 0.1.11 and
msgspec 0.22.0, cp312, as sglang 0.5.23 pins them), and stand-ins for the package `__init__`s and for
sglang/srt/utils/common.py (stand_in/: each says why). The build is SGLang's own code path: this script
only puts the files on sys.path and calls SGLang's cached module builders for the variants validate uses.

SGLANG_MARLIN_BUILD_DIR (default /tmp/sglang_marlin_0523) holds the assembled package; SGLang's JIT cache
is $SGLANG_JIT_CACHE_DIR (default here: <build dir>/jit-cache, so the CLI processes the tests start reuse it).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUILD = Path(os.environ.get("SGLANG_MARLIN_BUILD_DIR", "/tmp/sglang_marlin_0523"))
PKG, SITE = BUILD / "pkg", BUILD / "site"


def prepare() -> list[str]:
    """The package view (wheel files + stand-ins) and, where tvm_ffi is missing, the carried wheels.
    Returns the sys.path entries to use; sets SGLANG_JIT_CACHE_DIR for this process and its children."""
    if PKG.exists():
        shutil.rmtree(PKG)
    shutil.copytree(HERE / "src", PKG)
    shutil.copytree(HERE / "stand_in", PKG, dirs_exist_ok=True)
    paths = [str(PKG)]
    probe = subprocess.run([sys.executable, "-c", "import tvm_ffi, msgspec"], capture_output=True)
    if probe.returncode != 0:
        if not (SITE / "tvm_ffi").is_dir():
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                            "--target", str(SITE), *map(str, sorted((HERE / "wheels").glob("*.whl")))], check=True)
        paths.append(str(SITE))
    os.environ.setdefault("SGLANG_JIT_CACHE_DIR", str(BUILD / "jit-cache"))
    return paths


def load(dtypes=("float16", "bfloat16"), verbose: bool = True):
    """Build (or reuse) the MoE GEMM variant validate calls for each activation dtype and the repack, in parallel
    threads (each is one nvcc translation unit). The variant is the one SGLang's server runs without expert
    parallelism (fused_marlin_moe.py: is_ep False, no bias, expert_ids_are_sorted True, zero_inactive_output
    False): the template arguments of moe_wna16_marlin.py's `_jit_moe_wna16_marlin_module`, in its order.
    Returns (moe module, repack module)."""
    import torch

    t0 = time.time()
    paths = prepare()
    for p in reversed(paths):
        if p not in sys.path:
            sys.path.insert(0, p)
    from sglang.kernels.ops.moe import moe_wna16_marlin as moe
    from sglang.kernels.ops.quantization import gptq_marlin_repack as repack

    def timed(name, fn):
        t = time.time()
        fn()
        return name, time.time() - t

    jobs = [(f"moe_wna16_marlin<{d}>",
             lambda d=d: moe._jit_moe_wna16_marlin_module(getattr(torch, d), False, False, True, False, False))
            for d in dtypes] + [("gptq_marlin_repack", repack._jit_gptq_marlin_repack_module)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        done = list(pool.map(lambda j: timed(*j), jobs))
    if verbose:
        from sglang.kernels.jit.utils import get_jit_cuda_arch
        from sglang.kernels.jit.utils.compile import toolchain
        print(f"[build] SGLang 0.5.23 JIT Marlin: {', '.join(f'{n} {s:.1f} s' for n, s in done)}; "
              f"target {toolchain.target_flags()} ({get_jit_cuda_arch().target_name}); ready in "
              f"{time.time() - t0:.1f} s; cache {os.environ['SGLANG_JIT_CACHE_DIR']}", flush=True)
        print("PYTHONPATH=" + ":".join(paths), flush=True)
    return moe, repack


if __name__ == "__main__":
    if "--prepare-only" in sys.argv:
        print("PYTHONPATH=" + ":".join(prepare()))
    else:
        load()
