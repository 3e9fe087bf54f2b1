"""Runs inside a spawned gloo rank for serving_tests/test_differential.py: for each case, SGLang builds the
whole model twice under the model's dtype, as its model loader does (ModelConfig, its quantisation
lookup `_get_quantization_config`, `_initialize_model` under `set_default_torch_dtype`, the model's own
`load_weights` and every module's `process_weights_after_loading`: DefaultModelLoader's
`load_weights_and_postprocess`): once from the
source (SGLang's own method for it), once from the conversion (the plugin); every parameter and buffer
of the two is compared by name, dtype, shape and bytes.

CPU substitutions, beyond those of test_differential.py's header (each one engine step, never compared):
- the torchvision stand-in (serving_tests/stubs), `override_platform(is_sm120=True, is_blackwell=True)`
  (what SGLang's probes answer on the target sm_120 GPU: `is_blackwell` covers majors 10, 11, 12),
  `--moe-runner-backend marlin`, the parallel ranks written with `get_parallel().override_permanently`;
- quant_method "mxfp4" (Mxfp4Config) added to the registry, as a CUDA build registers it (gpt-oss);
- `marlin_make_workspace` -> a dummy tensor (it reads the CUDA SM count; a runtime buffer, not loaded);
- the rotary embedding's CPU branch (its non-CUDA branch imports `vllm._custom_ops`, absent here);
- `torch.cuda.get_device_capability` -> (12, 0) (sm_120), asked by compressed-tensors' scheme selection;
  (9, 0) for a compressed-tensors source (CAPABILITY below: SGLang's only Marlin path for it);
- `scaled_fp8_quant` with a static per-tensor scale (CUDA op `sgl_per_tensor_quant_fp8`; FP8 processing
  requantises a fused layer's shards with it: Qwen3.5's ModelOpt FP8 `in_proj_qkvz`, `qkv_proj`) -> SGLang's
  own torch fallback for it (`_native_static_quant_fp8`); the same FP8 method in both models;
- DeepSeek-V4: the mHC kernels' JIT warm-up after loading -> nothing (serving_tests/sglang/dsv4_cpu.py);
- GLM-5.3-Flash: SGLang fuses the KDA projections for the ModelOpt source but not for the plugin's config (its own
  rule): the engine's fused KDA tensors are compared split into the plugin's modules (harness_kda_split.py);
- SGLang's dense NVFP4 layers processed for `--fp4-gemm-backend marlin` (its sm_120 default,
  flashinfer_cutlass, moves tensors to CUDA while processing); the same method in both models.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # read when huggingface_hub is imported: ServerArgs("dummy") stays local

import torch
from common import checkpoint_tensors
from differential_state import model_state, run_diff_cases, state_diff, zero_fill
from dsv4_cpu import use_cpu_stand_ins
from harness_gpt_oss import _register_mxfp4_as_on_cuda
from harness_kda_split import kda_fused_as_unfused
from harness_sglang import sglang_cpu
from kimi_k3_cpu import use_cpu_kimi_k3
from mla_cpu import use_cpu_rope_device


def _model(path: str, dtype: str, draft: bool = False):
    """SGLang's model loader on `path` (`draft`: the MTP draft model, as its draft worker builds it)."""
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.loader import DefaultModelLoader, _get_quantization_config, _initialize_model
    from sglang.srt.model_loader.utils import set_default_torch_dtype
    from sglang.srt.runtime_context import get_context

    model_config = ModelConfig(path, dtype=dtype, is_draft_model=draft)
    quant = _get_quantization_config(model_config, LoadConfig())
    # the server's --model-path (its tokenizer path by default): DeepSeek-V4.1's Engram hash reads the tokenizer
    served = get_context().override_server_args(model_path=path, tokenizer_path=path)
    served.install()
    try:
        with set_default_torch_dtype(model_config.dtype):
            model = _initialize_model(model_config, LoadConfig(), quant)
            zero_fill(model)
            DefaultModelLoader.load_weights_and_postprocess(model, checkpoint_tensors(path), torch.device("cpu"))
    finally:
        served.restore()
    return model


# SGLang serves a compressed-tensors W4A4 NVFP4 MoE through Marlin only below capability 10.0 (its
# weight-only fallback, CompressedTensorsW4A16Nvfp4MoE); at 12.0 it picks its SM100 FlashInfer/CUTLASS
# scheme, which is not Marlin. The Marlin reference for such a source is that fallback.
CAPABILITY = {"nvfp4-ct": (9, 0)}
SM120 = (12, 0)


def use_capability_of(fmt: str) -> None:
    """torch.cuda.get_device_capability answers the GPU generation SGLang would run `fmt` on (CAPABILITY):
    what compressed-tensors' scheme selection asks while the model is built."""
    capability = CAPABILITY.get(fmt, SM120)
    torch.cuda.get_device_capability = lambda device=None: capability


def _diff(*, source: str, converted: str, dtype: str, fmt: str, text_only: bool = False) -> dict:
    """`text_only` (a multimodal wrapper's replica has no vision tensors): SGLang builds its tower in both
    models all the same, zero-filled and compared like the rest."""
    use_capability_of(fmt)
    engine = model_state(_model(source, dtype))
    plugin = model_state(_model(converted, dtype))
    return state_diff(kda_fused_as_unfused(engine, plugin), plugin)  # GLM-5.3-Flash: harness_kda_split.py


def _native_static_fp8_quant(input, scale=None, num_token_padding=None, use_per_token_if_dynamic=False):
    """`scaled_fp8_quant` with a given per-tensor scale (FP8 linear processing requantises a fused layer's
    shards to one scale with it): SGLang's own torch fallback for that step (fp8_kernel.py
    `_native_static_quant_fp8`, its non-CUDA path), in place of the CUDA op `sgl_per_tensor_quant_fp8`."""
    assert scale is not None and scale.numel() == 1 and not num_token_padding, "only the static per-tensor form"
    fp8 = torch.float8_e4m3fn
    info = torch.finfo(fp8)
    return torch.clamp(input / scale, info.min, info.max).to(fp8), scale


def run(rank: int, world: int, *, cases: dict) -> dict:
    """cases: id -> {"source", "converted": checkpoint paths, "dtype": the model dtype}."""
    import sglang.srt.layers.rotary_embedding.base as rope
    from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel
    from sglang.srt.layers.quantization import fp4_utils
    from sglang.srt.plugins import load_plugins
    from sglang.srt.runtime_context import get_parallel, override_platform

    load_plugins()
    _register_mxfp4_as_on_cuda()
    rope._is_cpu = True
    use_cpu_rope_device()  # MLA families: serving_tests/sglang/mla_cpu.py
    use_cpu_stand_ins()  # DeepSeek-V4: serving_tests/sglang/dsv4_cpu.py
    use_cpu_kimi_k3()  # Kimi-K3's CUDA streams: serving_tests/sglang/kimi_k3_cpu.py
    from sglang.srt.layers.quantization import modelopt_quant
    from sglang.srt.layers.quantization import utils as quant_utils

    for module in (quant_utils, modelopt_quant):  # FP8 layers (both models): the CUDA per-tensor quant op
        if hasattr(module, "scaled_fp8_quant"):
            module.scaled_fp8_quant = _native_static_fp8_quant
    out = {}
    for dtype in sorted({c["dtype"] for c in cases.values()}):  # the server's --dtype, one per context
        with sglang_cpu(world=world, rank=rank, ep=False, dtype=getattr(torch, dtype)), \
                override_platform(is_blackwell=True):  # what SGLang says of sm_120 (major 12 is Blackwell)
            # dense NVFP4 layers (the same SGLang method in both models): processed for --fp4-gemm-backend
            # marlin, since sm_120's default (flashinfer_cutlass) moves the scales to CUDA while processing
            fp4_utils.FP4_GEMM_RUNNER_BACKEND = fp4_utils.Fp4GemmRunnerBackend.MARLIN
            get_parallel().override_permanently(pp_rank=0, attn_tp_rank=rank, attn_dp_rank=0, attn_cp_rank=0,
                                                moe_dp_rank=0)
            if not out:
                init_distributed_environment(world_size=world, rank=rank, local_rank=rank, backend="gloo",
                                             distributed_init_method="env://")
                initialize_model_parallel(backend="gloo")
            out.update(run_diff_cases({k: c for k, c in cases.items() if c["dtype"] == dtype}, _diff))
    return out
