"""Load-time cost of one real-size DeepSeek-V4-Flash MoE layer (256 experts, H=4096, I=2048) in the
real engine code on CPU: (a) the engine's own loading + process_weights_after_loading from the source
checkpoint, against (b) the plugin's loading from the converted checkpoint. Each path runs in its own
process (one per rank), so each ru_maxrss is that path's own high-water mark.

What runs is the serving tests' harness (serving_tests/{vllm,sglang}/harness_*.py: vLLM 0.33.0 and
SGLang 0.5.23, their own MoE layer, weight loaders, name mapping and process_weights_after_loading),
with the same CPU substitutions as the plugin tests. The one that matters for the numbers: the
engines' CUDA Marlin repack op (`gptq_marlin_repack`) is replaced by the project's codec
(`to_marlin_weight`, the numba kernel), so path (a)'s repack time is the codec's on this CPU, not the
CUDA kernel's (docs/SERVING.md gives the GPU numbers). Tensors are streamed shard by shard, one at a
time, as the engines' safetensors iterators do; the page cache is warmed before each run.

    .venv/bin/python benchmarks/bench_serving_load.py [--engines vllm sglang] [--formats nvfp4 mxfp4]
        [--tp 1 2] [--dir SCRATCH]

Needs the engine venvs (serving_tests/build_venvs.sh) and ~11 GB of scratch for NVFP4 (source +
two converted copies), as much again for MXFP4.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "serving_tests"
CONTAINER = "layers.0.ffn.experts"
SYNTH_FORMAT = {"nvfp4": "nvfp4-modelopt-dsv4", "mxfp4": "mxfp4-dsv4"}


def _max_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


class _Stream:
    """The checkpoint's tensors of one MoE layer, read one at a time (nothing held between them)."""

    def __init__(self, path: str):
        self.path = path

    def items(self):
        from safetensors import safe_open

        for shard in sorted(Path(self.path).glob("*.safetensors")):
            with safe_open(str(shard), "pt") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open is not iterable
                    if name.startswith(CONTAINER + "."):
                        yield name, f.get_tensor(name)


def _quant_config(path: str) -> dict:
    return json.loads(Path(path, "config.json").read_text()).get("quantization_config", {})


def _vllm_path(rank, world, path, fmt, ckpt, dims):
    import harness_vllm as h
    import torch
    from vllm.model_executor.layers.quantization import get_quantization_config
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    with h.vllm_cpu(world=world, rank=rank, ep=False, dtype=torch.bfloat16) as fresh:
        cfg = h.engine_config(fmt) if path == "engine" else None
        if cfg is None:
            qc = _quant_config(ckpt)
            cfg = get_quantization_config(qc["quant_method"]).from_config(qc)
        base = _max_rss_mib()
        t0 = time.perf_counter()
        layer = h.make_layer(fresh, cfg, dtype=torch.bfloat16, **dims)
        missing = h.load_like_dsv4(layer, _Stream(ckpt), experts=dims["experts"])
        t1 = time.perf_counter()
        layer.quant_method.process_weights_after_loading(layer)
        t2 = time.perf_counter()
    return _result(layer, missing, base, t0, t1, t2)


def _sglang_path(rank, world, path, fmt, ckpt, dims):
    import harness_sglang as h
    import torch
    from sglang.srt.plugins import load_plugins

    os.environ["HF_HUB_OFFLINE"] = "1"
    load_plugins()
    with h.sglang_cpu(world=world, rank=rank, ep=False, dtype=torch.bfloat16):
        cfg = h.engine_config(fmt) if path == "engine" else h.plugin_config(_quant_config(ckpt))
        base = _max_rss_mib()
        t0 = time.perf_counter()
        layer = h.make_layer(cfg, dtype=torch.bfloat16, **dims)
        missing = h.load_like_dsv4(layer, _Stream(ckpt), experts=dims["experts"])
        t1 = time.perf_counter()
        layer.quant_method.process_weights_after_loading(layer)
        t2 = time.perf_counter()
    return _result(layer, missing, base, t0, t1, t2)


def _result(layer, missing, base, t0, t1, t2) -> dict:
    final = sum(p.numel() * p.element_size() for p in layer.parameters())
    return {
        "method": type(layer.quant_method).__name__,
        "skipped": len(set(missing)),
        "load_s": t1 - t0,
        "process_s": t2 - t1,
        "total_s": t2 - t0,
        "base_rss_mib": base,  # after the engine's imports and set-up, before any weight
        "peak_rss_mib": _max_rss_mib(),
        "final_mib": final / 2**20,
    }


def _warm_codec() -> None:
    """Import and run the codec that stands in for the CUDA repack once, so that numba's cache load
    (about a second, once per process) is not charged to path (a): the real kernel has no such cost."""
    import torch

    from dsv4_convert.formats.marlin.weight import to_marlin_weight

    to_marlin_weight(torch.zeros((64, 64), dtype=torch.uint8))


def rank_main(rank: int, world: int, *, engine: str, path: str, fmt: str, ckpt: str, dims: dict) -> dict:
    _warm_codec()
    run = _vllm_path if engine == "vllm" else _sglang_path
    return run(rank, world, path, fmt, ckpt, dims)


def _child(args) -> None:
    """In the engine's venv: run one path on `--world` gloo ranks, print each rank's result as JSON."""
    # as serving_tests/conftest.py: the harness, common.py, and the stub for torchvision (SGLang imports it)
    sys.path[:0] = [str(TESTS), str(TESTS / "stubs"), str(TESTS / args.engine), str(Path(__file__).parent)]
    os.environ["PYTHONPATH"] = os.pathsep.join(sys.path[:4] + [os.environ.get("PYTHONPATH", "")])
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    from common import spawn_ranks

    dims = {"experts": args.experts, "hidden": args.hidden, "inter": args.inter}
    kw = {"engine": args.engine, "path": args.path, "fmt": args.fmt, "ckpt": args.ckpt, "dims": dims}
    with tempfile.TemporaryDirectory() as tmp:
        results = spawn_ranks("bench_serving_load:rank_main", kw, Path(tmp), world=args.world)
    print(json.dumps(results))


def _cli(*argv: str) -> None:
    cmd = [sys.executable, "-c", "from dsv4_convert.cli.main import main; main()", *argv]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # progress bars


def _warm(path: Path) -> None:
    for f in sorted(path.glob("*.safetensors")):
        with open(f, "rb") as fh:
            while fh.read(1 << 24):
                pass


def _measure(engine, path, fmt, ckpt, tp, dims) -> list[dict]:
    _warm(Path(ckpt))
    py = ROOT / f".venv-{engine}" / "bin" / "python"
    cmd = [str(py), __file__, "--child", "--engine", engine, "--path", path, "--fmt", fmt, "--ckpt", ckpt,
           "--world", str(tp), *(f"--{k}={v}" for k, v in dims.items())]
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    t0 = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    wall = time.perf_counter() - t0
    ranks = json.loads(out.strip().splitlines()[-1])
    return [{**r, "process_wall_s": wall} for r in ranks]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", nargs="+", default=["vllm", "sglang"], choices=["vllm", "sglang"])
    ap.add_argument("--formats", nargs="+", default=["nvfp4"], choices=list(SYNTH_FORMAT))
    ap.add_argument("--tp", nargs="+", type=int, default=[1])
    ap.add_argument("--dir", default=None, help="scratch directory (kept; reused when it holds the checkpoints)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    for name in ("engine", "path", "fmt", "ckpt"):
        ap.add_argument(f"--{name}", help=argparse.SUPPRESS)
    for name, default in (("world", 1), ("experts", 256), ("hidden", 4096), ("inter", 2048)):
        ap.add_argument(f"--{name}", type=int, default=default, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return _child(args)
    scratch = Path(args.dir or tempfile.mkdtemp(prefix="bench-serving-"))
    dims = {"experts": 256, "hidden": 4096, "inter": 2048}
    print(f"# {os.uname().nodename}: {os.cpu_count()} cores; load before: {os.getloadavg()}", flush=True)
    print("| engine | format | TP | path | load s | process s | total s | peak RSS MiB | over base MiB "
          "| final MiB |", flush=True)
    print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for fmt in args.formats:
        src = scratch / f"src-{fmt}"
        if not (src / "config.json").exists():
            _cli("synth", str(src), "--format", SYNTH_FORMAT[fmt], "--real-size", "--force")
        for engine in args.engines:
            conv = scratch / f"conv-{fmt}-{engine}"
            if not (conv / "config.json").exists():
                _cli(f"{fmt}-to-marlin", str(src), str(conv), "--target", engine)
            for tp in args.tp:
                for path, ckpt in (("engine", src), ("plugin", conv)):
                    for rank, r in enumerate(_measure(engine, path, fmt, str(ckpt), tp, dims)):
                        over = r["peak_rss_mib"] - r["base_rss_mib"]
                        print(f"| {engine} | {fmt} | {tp} (rank {rank}) | {path}: {r['method']} "
                              f"| {r['load_s']:.1f} | {r['process_s']:.2f} | {r['total_s']:.1f} "
                              f"| {r['peak_rss_mib']:.0f} | {over:.0f} | {r['final_mib']:.0f} |", flush=True)
    print(f"# load after: {os.getloadavg()}; scratch: {scratch}", flush=True)


if __name__ == "__main__":
    main()
