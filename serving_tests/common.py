"""Engine-independent helpers for the engine tests: spawning gloo ranks and comparing bytes."""

from __future__ import annotations

import json
import os
import socket
import sys
import traceback
from pathlib import Path

import torch

__all__ = ["byte_diff", "compare_params", "spawn_ranks", "split_params"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, target: str, args: dict, out_dir: str) -> None:
    torch.distributed.init_process_group(
        "gloo", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}"
    )
    module_name, fn_name = target.split(":")
    try:
        __import__(module_name)
        result = getattr(sys.modules[module_name], fn_name)(rank, world, **args)
    except BaseException:  # noqa: BLE001 - report any failure of a rank to the parent
        result = {"__error__": traceback.format_exc()}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


# What every rank imports before its harness runs: torch and the engine's layers, loaders and configs. The
# ranks fork from one server process that imported these once per suite (multiprocessing's forkserver), instead
# of each rank of each test importing them anew (about 5 to 10 s of a rank's start on 2 cores). Each rank is still
# a fresh process: the harnesses' CPU stand-ins patch the engine inside the rank, after the fork, as before, and
# nothing a test does reaches the server. A module missing from a release is skipped by multiprocessing itself.
_PRELOAD = {
    "vllm": ["vllm.config", "vllm.distributed", "vllm.model_executor.layers.fused_moe.layer",
             "vllm.model_executor.layers.quantization", "vllm.model_executor.model_loader.utils"],
    "sglang": ["sglang.srt.configs.model_config", "sglang.srt.distributed", "sglang.srt.layers.quantization",
               "sglang.srt.layers.moe.fused_moe_triton.layer", "sglang.srt.model_loader.loader"],
}


def _start_method() -> str:
    """'forkserver' preloaded with the installed engine's heavy modules (set once: the server starts with the
    first ranks and keeps the environment of that moment, which spawn_ranks has set by then)."""
    import multiprocessing

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["common", "torch", "torch.distributed", *_PRELOAD.get(installed_engine(), [])])
    return "forkserver"


def spawn_ranks(target: str, args: dict, tmp_path: Path, world: int = 2) -> list[dict]:
    """Run `module:function(rank, world, **args)` in `world` spawned processes that share a gloo group;
    return each rank's JSON result (a rank that raised returns {'__error__': traceback})."""
    sys.path.insert(0, str(Path(__file__).parent))
    os.environ.setdefault("PYTHONPATH", "")
    # the stand-ins too: vLLM inspects a multimodal wrapper's model class in a subprocess of its own, whose import
    # of transformers' image processors needs the torchvision stand-in (serving_tests/stubs)
    here = Path(__file__).parent
    os.environ["PYTHONPATH"] = os.pathsep.join([str(here), str(here / "stubs"), os.environ["PYTHONPATH"]])
    torch.multiprocessing.start_processes(
        _rank_main, args=(world, _free_port(), target, args, str(tmp_path)), nprocs=world,
        start_method=_start_method(),
    )
    results = [json.loads(Path(tmp_path, f"rank{r}.json").read_text()) for r in range(world)]
    errors = [f"rank {r}:\n{res['__error__']}" for r, res in enumerate(results) if "__error__" in res]
    if errors:
        raise AssertionError("\n".join(errors))
    return results


def byte_diff(actual: torch.Tensor, expected: torch.Tensor) -> str | None:
    """None when dtype, shape and every byte agree; otherwise what differs (first index, both bytes)."""
    if actual.dtype != expected.dtype:
        return f"dtype {actual.dtype} != {expected.dtype}"
    if tuple(actual.shape) != tuple(expected.shape):
        return f"shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    a = actual.detach().contiguous().reshape(-1).view(torch.uint8)
    b = expected.detach().contiguous().reshape(-1).view(torch.uint8)
    bad = torch.nonzero(a != b).flatten()
    if bad.numel():
        i = bad[0].item()
        return f"{bad.numel()} of {a.numel()} bytes differ; first at byte {i}: {a[i].item():#04x} != {b[i].item():#04x}"
    return None


def compare_params(engine_layer: torch.nn.Module, plugin_layer: torch.nn.Module, names: list[str]) -> dict:
    """Byte comparison of the named final parameters: {name: None or what differs}."""
    out = {}
    for name in names:
        exp = getattr(engine_layer, name, None)
        act = getattr(plugin_layer, name, None)
        if exp is None or act is None:
            out[name] = f"missing: engine has {exp is not None}, plugin has {act is not None}"
        else:
            out[name] = byte_diff(act, exp)
    return out


def split_params(tp_cases: list[dict], ep_cases: list[dict], experts: int) -> list[tuple[str, int]]:
    """(case id, experts each rank holds) for TP=2 and EP=2 cases, refusal cases left out."""
    return [(c["id"], n) for cases, n in ((tp_cases, experts), (ep_cases, experts // 2))
            for c in cases if not c["id"].startswith("refuse")]


# --- whole-model family runs (serving_tests/test_families.py), shared by both engines' harness_models --


def checkpoint_tensors(path: str):
    """(name, tensor) of every .safetensors file of a checkpoint, in file order."""
    from safetensors import safe_open

    for shard in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not iterable
                yield name, f.get_tensor(name)


def module_methods(model: torch.nn.Module, quant=None) -> dict:
    """{module: its quant method class}; with `quant` (the engine's own config for the source), what that
    config gives each non-expert module of this model instead (None: the layer keeps its default)."""
    out = {}
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if method is None or (quant is not None and ".experts" in name):
            continue
        if quant is not None:
            method = quant.get_quant_method(module, name)
        out[name] = None if method is None else type(method).__name__
    return out


def model_summary(quant, model: torch.nn.Module, methods: dict, source_quant) -> dict:
    """The fields both harnesses report for a model built with the plugin's config `quant`."""
    return {
        "engine_config": None if source_quant is None else type(source_quant).__name__,
        "engine_methods": {} if source_quant is None else module_methods(model, source_quant),
        "config": type(quant).__name__,
        "inner": type(getattr(quant, "inner", None)).__name__,
        "inner_method": getattr(quant, "inner_method", None),
        "methods": methods,
        "params_after": sorted(n for n, _ in model.named_parameters()),
    }


def run_model_cases(cases: dict, build) -> dict:
    """{case id: build(path, source=..., process=...)}, or {"error": "<Type>: <message>"} for a case whose
    config, build or load raised (what the engine would print at launch: the negative controls)."""
    out = {}
    for case_id, case in cases.items():
        try:
            out[case_id] = build(case["path"], source=case.get("source"), process=case.get("process", False))
        except Exception as e:  # noqa: BLE001 - the negative controls report what the engine raised
            out[case_id] = {"error": f"{type(e).__name__}: {e}"}
    return out


def installed_engine() -> str | None:
    """The engine of this venv, by distribution (serving_tests/vllm would pass for a `vllm` module)."""
    import importlib.metadata

    for dist in ("vllm", "sglang"):
        try:
            importlib.metadata.version(dist)
            return dist
        except importlib.metadata.PackageNotFoundError:
            continue
    return None
