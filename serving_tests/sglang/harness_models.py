"""Runs inside a spawned gloo rank for serving_tests/test_families.py (its header lists the substitutions): the
whole model of a family, built by SGLang from the checkpoint's own config.json (ModelConfig, its
quantisation lookup, `_initialize_model`), loaded through the model's own `load_weights` with the plugin;
SGLang's own config for the source names the method it would give each non-expert module."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # read when huggingface_hub is imported: ServerArgs("dummy") stays local

import torch
from common import checkpoint_tensors, model_summary, module_methods, run_model_cases
from harness_sglang import sglang_cpu
from mla_cpu import use_cpu_rope_device


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _count_placements(model) -> set[int]:
    """Wrap every parameter's loader (SGLang's model loaders skip a name they cannot place, silently):
    the storages of the checkpoint tensors that reached a parameter."""
    from sglang.srt.model_loader.weight_utils import default_weight_loader

    placed: set[int] = set()
    for _, param in model.named_parameters():
        loader = getattr(param, "weight_loader", default_weight_loader)

        def counted(p, loaded, *args, _loader=loader, **kwargs):
            placed.add(_storage(loaded))
            return _loader(p, loaded, *args, **kwargs)

        # SGLang's newer parameter classes expose weight_loader as a read-only property over _weight_loader
        setattr(param, "_weight_loader" if hasattr(param, "_weight_loader") else "weight_loader", counted)
    return placed


def _quant_config(path: str):
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.loader import _get_quantization_config

    model_config = ModelConfig(path, dtype="bfloat16")
    return model_config, _get_quantization_config(model_config, LoadConfig())


def _build_and_load(path: str, *, source: str | None, process: bool) -> dict:
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader.loader import _initialize_model
    from sglang.srt.model_loader.utils import set_default_torch_dtype

    model_config, quant = _quant_config(path)
    with set_default_torch_dtype(torch.bfloat16):
        model = _initialize_model(model_config, LoadConfig(), quant)
    methods = module_methods(model)
    source_quant = _quant_config(source)[1] if source else None
    placed = _count_placements(model)
    tensors = list(checkpoint_tensors(path))  # kept alive: their storages are what `placed` records
    model.load_weights(iter(tensors))
    if process:  # the plugin's expert methods (no repack); SGLang's own NVFP4 linear processing needs a GPU
        for _, module in model.named_modules():
            if type(getattr(module, "quant_method", None)).__name__.startswith("Prepacked"):
                module.quant_method.process_weights_after_loading(module)
    return {**model_summary(quant, model, methods, source_quant),
            "not_placed": sorted(name for name, t in tensors if _storage(t) not in placed)}


def run(rank: int, world: int, *, cases: dict) -> dict:
    """cases: id -> {"path", "source" (compare with the engine's own config for it), "process"}; a case
    whose config, build or load raises reports {"error"}."""
    import sglang.srt.layers.rotary_embedding.base as rope
    from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel
    from sglang.srt.plugins import load_plugins
    from sglang.srt.runtime_context import get_parallel

    load_plugins()
    rope._is_cpu = True  # SGLang's non-CUDA rotary path imports vllm._custom_ops; its CPU path does not
    use_cpu_rope_device()  # serving_tests/sglang/mla_cpu.py (fam-mla)
    # compressed-tensors scheme selection asks torch.cuda for the GPU generation: the target's, sm_120
    torch.cuda.get_device_capability = lambda device=None: (12, 0)
    with sglang_cpu(world=world, rank=rank, ep=False, dtype=torch.bfloat16):
        get_parallel().override_permanently(pp_rank=0, attn_tp_rank=rank, attn_dp_rank=0, attn_cp_rank=0,
                                            moe_dp_rank=0)
        init_distributed_environment(world_size=world, rank=rank, local_rank=rank, backend="gloo",
                                     distributed_init_method="env://")
        initialize_model_parallel(backend="gloo")
        return run_model_cases(cases, _build_and_load)
