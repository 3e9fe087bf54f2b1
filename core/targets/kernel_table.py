"""The kernel part of the engine table (core/targets/engines.py `Release.kernels`): per engine release, where its Marlin
MoE GEMM and repack are (a prebuilt extension, or CUDA sources the engine JIT-compiles on first use), their
argument lists, and for a JIT, how the engine builds them. `validate --kernel` (validate/kernel_provider.py) and
`doctor` read these values; no other module holds a kernel fact. Pure: no engine import.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GEMM_ARGS_033", "GEMM_ARGS_034", "GEMM_ARGS_SGLANG_0523", "REPACK_ARGS_033", "REPACK_ARGS_034",
           "REPACK_ARGS_SGLANG_0523", "SGLANG_0523_KERNELS", "VLLM_033_KERNELS", "VLLM_034_KERNELS", "JitBuild",
           "JitTarget", "KernelOps", "jit_target"]

# The Marlin ops' argument names, in their schema's order, as vLLM registers them (csrc/moe/torch_bindings.cpp,
# csrc/torch_bindings.cpp; read from the released wheels' `_moe_C` / `_C` libraries). vLLM 0.34.0 removed
# the W4A8 path: `a_scales` from the MoE GEMM (26 -> 25 arguments), `is_a_8bit` from the repack (5 -> 4).
GEMM_ARGS_034 = ("a", "c_or_none", "b_q_weight", "b_bias_or_none", "b_scales", "global_scale", "b_zeros_or_none",
                 "workspace", "sorted_token_ids", "expert_ids", "num_tokens_past_padded", "topk_weights",
                 "moe_block_size", "top_k", "mul_topk_weights", "b_type_id", "size_m", "size_n", "size_k",
                 "use_atomic_add", "use_fp32_reduce", "is_zp_float", "thread_k", "thread_n", "blocks_per_sm")
GEMM_ARGS_033 = GEMM_ARGS_034[:5] + ("a_scales",) + GEMM_ARGS_034[5:]
REPACK_ARGS_034 = ("b_q_weight", "size_k", "size_n", "num_bits")
REPACK_ARGS_033 = REPACK_ARGS_034 + ("is_a_8bit",)
# SGLang 0.5.23's own ops are Python functions over JIT-built modules (sglang/kernels/ops/moe/moe_wna16_marlin.py,
# sglang/kernels/ops/quantization/gptq_marlin_repack.py): their parameters, in order. Beside vLLM's: act-order
# (g_idx, perm, is_k_full), is_ep, the weight type as a ScalarType (`b_q_type`), no thread_k / thread_n /
# blocks_per_sm, three routing-table promises with defaults; the repack takes a `perm` tensor.
GEMM_ARGS_SGLANG_0523 = (
    "a", "c_or_none", "b_q_weight", "b_bias_or_none", "b_scales", "global_scale_or_none", "b_zeros_or_none",
    "g_idx_or_none", "perm_or_none", "workspace", "sorted_token_ids", "expert_ids", "num_tokens_post_padded",
    "topk_weights", "moe_block_size", "top_k", "mul_topk_weights", "is_ep", "b_q_type", "size_m", "size_n", "size_k",
    "is_k_full", "use_atomic_add", "use_fp32_reduce", "is_zp_float", "expert_ids_are_sorted", "zero_inactive_output",
    "has_inactive_prefix_count")
REPACK_ARGS_SGLANG_0523 = ("b_q_weight", "perm", "size_k", "size_n", "num_bits")


@dataclass(frozen=True, slots=True)
class JitTarget:
    """One rule of a JIT loader's choice of target: a GPU of capability in [lo, hi) is compiled for
    sm_<major><minor><suffix>, where the compiler is at least `min_nvcc` (first matching rule wins; none: no suffix)."""
    lo: tuple[int, int]
    hi: tuple[int, int]
    suffix: str
    min_nvcc: tuple[int, int] = (0, 0)


@dataclass(frozen=True, slots=True)
class JitBuild:
    """How an engine compiles its kernels on first use: the toolkit it finds, what it needs, where it caches."""
    toolkit_env: tuple[str, ...]  # environment variables naming the CUDA toolkit, in the order the loader reads them
    toolkit_default: str  # the toolkit when none is named and no nvcc is on PATH
    targets: tuple[JitTarget, ...]  # the target it compiles for the local GPU
    python: tuple[str, ...]  # modules the loader imports (the build and the load)
    commands: tuple[str, ...]  # programs it runs from PATH (besides the toolkit's nvcc)
    cache_env: str  # the variable naming its build cache
    cache_default: str
    cache_globs: tuple[str, ...]  # the Marlin MoE GEMM's and the repack's built libraries inside the cache
    failure_text: str  # how its loader's error for a failed build begins (the compiler's output follows)


@dataclass(frozen=True, slots=True)
class KernelOps:
    """Where one engine release's Marlin MoE GEMM and repack are, and how `validate --kernel` calls them.
    validate passes every op argument by its own name (vLLM's, see the op call in validate/kernel_moe.py);
    `renames` maps the op's name where it differs, `fixed` sets what validate never varies."""
    provider: str  # the --kernel-provider name
    build: str  # "extension": prebuilt into libraries of `dist`; "jit": compiled from CUDA sources in `dist` on first use
    dist: str  # the distribution that holds the kernels (libraries or sources)
    module: str  # importing it registers the torch ops / defines the op functions; it builds nothing
    gemm: str  # "torch.ops.<library>.<op>", or "<module>:<function>" for a Python function
    repack: str
    gemm_args: tuple[str, ...]  # the GEMM's argument names, in order (its schema or signature)
    repack_args: tuple[str, ...]
    scalar_types: str  # module with `scalar_types.float4_e2m1f`, from distribution `scalar_dist`
    scalar_dist: str
    b_type: str  # the GEMM takes the weight type as its ScalarType "id" (int) or as the ScalarType "object"
    renames: tuple[tuple[str, str], ...] = ()  # (op argument, validate's name for it)
    fixed: tuple[tuple[str, object], ...] = ()  # (op argument, the value validate always passes)
    libraries: tuple[str, ...] = ()  # extension: globs of the Marlin libraries inside the package (doctor: SASS)
    sources: tuple[str, ...] = ()  # jit: the GEMM's and the repack's CUDA sources inside the package
    jit: JitBuild | None = None


def _vllm_kernels(gemm_args: tuple[str, ...], repack_args: tuple[str, ...]) -> KernelOps:
    """vLLM's prebuilt ops (vllm/_custom_ops.py registers them from `_moe_C` / `_C`)."""
    return KernelOps("vllm", "extension", "vllm", "vllm._custom_ops", "torch.ops._moe_C.moe_wna16_marlin_gemm",
                     "torch.ops._C.gptq_marlin_repack", gemm_args, repack_args, "vllm.scalar_type", "vllm", "id",
                     renames=(("b_type_id", "b_type"),),
                     fixed=(("thread_k", -1), ("thread_n", -1), ("blocks_per_sm", -1)),  # the kernel picks its tiles
                     libraries=("_moe_C*.so",))


# SGLang 0.5.23's JIT (sglang/kernels/jit/utils): arch.py `_cuda_arch_suffix` picks the target of the local GPU
# (9.x -> a; 12.0 -> f with an nvcc >= 12.9, else a; other >= 10 -> a; older: none; the nvcc version from
# `nvcc --version`, else torch.version.cuda); toolchain.py finds nvcc at $CUDA_HOME, $CUDA_PATH, beside `nvcc` on
# PATH, else /usr/local/cuda, and runs `ninja`; loader.py loads the build
# with tvm_ffi; cache.py keeps builds under $SGLANG_JIT_CACHE_DIR/<target>/<module>/ (module names from
# moe_wna16_marlin.py: one per dtype / EP / bias / sorting variant).
SGLANG_JIT = JitBuild(
    toolkit_env=("CUDA_HOME", "CUDA_PATH"), toolkit_default="/usr/local/cuda",
    targets=(JitTarget((9, 0), (10, 0), "a"), JitTarget((12, 0), (12, 1), "f", min_nvcc=(12, 9)),
             JitTarget((10, 0), (1000, 0), "a")),
    python=("tvm_ffi",), commands=("ninja",), cache_env="SGLANG_JIT_CACHE_DIR", cache_default="~/.cache/sglang/jit",
    cache_globs=("*/sgl_kernel_jit_moe_wna16_marlin_*/*/*/*.so", "*/sgl_kernel_jit_gptq_marlin_repack/*/*/*.so"),
    failure_text="Failed to build JIT module")  # compile/ninja.py build()

VLLM_033_KERNELS = _vllm_kernels(GEMM_ARGS_033, REPACK_ARGS_033)
VLLM_034_KERNELS = _vllm_kernels(GEMM_ARGS_034, REPACK_ARGS_034)

# SGLang 0.5.23 ships no prebuilt Marlin op (its kernel wheel sglang-kernel 0.4.10 has none): the JIT compiles
# them from the sglang package's own CUDA sources on first use, one module per activation dtype / EP / bias /
# sorting variant (sglang/kernels/ops/moe/moe_wna16_marlin.py); the weight type comes from sgl_kernel.scalar_type
# (sglang/srt/layers/moe/fused_moe_triton/fused_marlin_moe.py). The kernel reads the NVFP4 global in the
# activation dtype (marlin_moe/marlin_template.h: `scale2_ptr` as scalar_t): EngineFacts.global_dtype "act".
SGLANG_0523_KERNELS = KernelOps(
    "sglang", "jit", "sglang", "sglang.kernels.ops.moe.moe_wna16_marlin",
    "sglang.kernels.ops.moe.moe_wna16_marlin:moe_wna16_marlin_gemm",
    "sglang.kernels.ops.quantization.gptq_marlin_repack:gptq_marlin_repack",
    GEMM_ARGS_SGLANG_0523, REPACK_ARGS_SGLANG_0523, "sgl_kernel.scalar_type", "sglang-kernel", "object",
    renames=(("global_scale_or_none", "global_scale"), ("num_tokens_post_padded", "num_tokens_past_padded"),
             ("b_q_type", "b_type")),
    # what SGLang's server passes without expert parallelism (fused_marlin_moe.py: is_k_full, and
    # `expert_ids_are_sorted=expert_map is None`: validate's routing lists each expert's blocks in order)
    fixed=(("is_k_full", True), ("expert_ids_are_sorted", True), ("zero_inactive_output", False),
           ("has_inactive_prefix_count", False)),
    sources=("kernels/jit/csrc/gemm/marlin_moe/moe_wna16_marlin.cuh",
             "kernels/jit/csrc/gemm/marlin/gptq_marlin_repack.cuh"),
    jit=SGLANG_JIT)


def jit_target(jit: JitBuild, capability: tuple[int, int], nvcc: tuple[int, ...]) -> str:
    """The target `jit` compiles for a GPU of `capability` with compiler version `nvcc`: "sm_120f"."""
    suffix = next((t.suffix for t in jit.targets if t.lo <= capability < t.hi and tuple(nvcc) >= t.min_nvcc), "")
    return f"sm_{capability[0]}{capability[1]}{suffix}"
