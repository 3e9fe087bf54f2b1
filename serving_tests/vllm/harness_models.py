"""Runs inside a spawned gloo rank for test_vllm_families.py (its header lists the substitutions): the
whole model of a family, built by vLLM from the checkpoint's own config.json, loaded through the
model's own `load_weights` (its weight-name mapping), once for the source with vLLM's own quantisation
config and once for the conversion with the plugin."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch


def _weights(path: str):
    from safetensors import safe_open

    for shard in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not iterable
                yield name, f.get_tensor(name)


def _marlin_runs_here() -> None:
    """The Marlin experts class refuses a machine without a CUDA sm80+ GPU; the backend is what
    `--moe-backend marlin` asks for on sm_120."""
    from vllm.model_executor.layers.fused_moe.experts import marlin_moe

    for cls in vars(marlin_moe).values():
        if isinstance(cls, type) and "_supports_current_device" in vars(cls):
            cls._supports_current_device = staticmethod(lambda: True)


def _vllm_config(path: str):
    from vllm.config import KernelConfig, ModelConfig, VllmConfig

    model_config = ModelConfig(model=path, dtype="bfloat16", skip_tokenizer_init=True, enforce_eager=True)
    return VllmConfig(model_config=model_config, kernel_config=KernelConfig(moe_backend="marlin"))


def _source_methods(source: str, model) -> dict:
    """What vLLM's own config for the source (its whole lookup, from the source's config.json) gives each
    non-expert module of the same model: the method the engine would build there."""
    quant = _vllm_config(source).quant_config
    out = {"__config__": type(quant).__name__}
    for name, module in model.named_modules():
        if getattr(module, "quant_method", None) is not None and ".experts" not in name:
            method = quant.get_quant_method(module, name)
            out[name] = type(method).__name__ if method is not None else None
    return out


def _build_and_load(path: str, *, source: str | None, process: bool) -> dict:
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import initialize_model, process_weights_after_loading
    from vllm.utils.torch_utils import set_default_torch_dtype

    vllm_config = _vllm_config(path)
    model_config, quant = vllm_config.model_config, vllm_config.quant_config
    with set_current_vllm_config(vllm_config), set_default_torch_dtype(model_config.dtype):
        model = initialize_model(vllm_config=vllm_config)
        methods = {name: type(m.quant_method).__name__ for name, m in model.named_modules()
                   if getattr(m, "quant_method", None) is not None}
        engine = _source_methods(source, model) if source else {}
        names = [name for name, _ in _weights(path)]
        loaded = model.load_weights(_weights(path))
        if process:
            process_weights_after_loading(model, model_config, torch.device("cpu"))
    params = {name for name, _ in model.named_parameters()}
    return {
        "engine_config": engine.pop("__config__", None),
        "engine_methods": engine,
        "config": type(quant).__name__,
        "inner": type(getattr(quant, "inner", None)).__name__,
        "inner_method": getattr(quant, "inner_method", None),
        "methods": methods,
        "tensors": len(names),
        "not_loaded": sorted(params - set(loaded)),
        "params_after": sorted(params) if not process else sorted(n for n, _ in model.named_parameters()),
    }


def run(rank: int, world: int, *, cases: dict) -> dict:
    """cases: id -> {"path": checkpoint, "source": compare with the engine's own config for it, "process":
    run process_weights_after_loading}. A case whose config or load raises reports {"error": ...}."""
    from vllm.config import ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.plugins import load_general_plugins

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    load_general_plugins()
    _marlin_runs_here()
    with set_current_vllm_config(VllmConfig(parallel_config=ParallelConfig(tensor_parallel_size=world))):
        init_distributed_environment(world_size=world, rank=rank, local_rank=rank, backend="gloo",
                                     distributed_init_method="env://")
        initialize_model_parallel(tensor_model_parallel_size=world)
    out = {}
    for case_id, case in cases.items():
        try:
            out[case_id] = _build_and_load(case["path"], source=case.get("source"),
                                           process=case.get("process", False))
        except Exception as e:  # noqa: BLE001 - the negative controls report what the engine raised
            out[case_id] = {"error": f"{type(e).__name__}: {e}"}
    return out
