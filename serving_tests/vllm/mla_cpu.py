"""CPU stand-ins for vLLM kernels that the MLA families (DeepSeek-R1/V3/V3.2, Kimi-K2) reach while the model is
built and its weights processed on CPU; the model's construction, its parameters and its weight loading are
vLLM's own. Nothing a test compares is produced by them:
- `torch.cpu._is_amx_tile_supported` -> False: on an AMX CPU vLLM picks AMX kernels (the sgl-kernel
  weight-packed GEMM for unquantised linears and embeddings, the AMX_MLA attention backend) whose ops
  (`torch.ops._C.convert_weight_packed`) the wheel does not carry for CPU; without AMX it picks its reference
  CPU paths (oneDNN / torch GEMM, the CPU_MLA backend), as on a CPU without AMX.
- the attention backend lookup for sparse MLA (DeepSeek-V3.2): vLLM's CPU platform raises "Sparse Attention
  is not supported on CPU."; the dense CPU_MLA backend stands in for the sparse kernel (the attention
  layer's parameters and the indexer's are the same for either kernel: MLAAttention's W_UK / W_UV come from
  kv_b_proj).
- `torch.ops._C.marlin_gemm` (a CUDA op the CPU wheel lacks) -> the project's emulation of the Marlin FP4 product
  (validate/emulate.py `marlin_dequantize`, the GPU suite's reference): MLA's weight processing dequantises a
  quantised `kv_b_proj` (llm-compressor quantises attention) by running the layer on an identity matrix
  (quant_utils.py get_and_maybe_dequant_weights), through vLLM's own weight-only FP4 Marlin linear. kv_b_proj is a
  non-expert layer, processed by the same engine method from the same bytes in both models; the stand-in only
  turns those bytes into W_UK / W_UV on a CPU.
"""

from __future__ import annotations


def use_cpu_reference_kernels() -> None:
    import torch
    from vllm.platforms.cpu import CpuPlatform

    torch.cpu._is_amx_tile_supported = lambda: False
    if not hasattr(torch.ops._C, "marlin_gemm"):
        torch.ops._C.marlin_gemm = _emulated_fp4_marlin_gemm
    if getattr(CpuPlatform, "_dsv4_dense_for_sparse", False):
        return
    pick = CpuPlatform.get_attn_backend_cls.__func__

    def dense_for_sparse(cls, selected_backend, attn_selector_config, num_heads=None):
        return pick(cls, selected_backend, attn_selector_config._replace(use_sparse=False), num_heads)

    CpuPlatform.get_attn_backend_cls = classmethod(dense_for_sparse)
    CpuPlatform._dsv4_dense_for_sparse = True


def _emulated_fp4_marlin_gemm(a, c, b_q_weight, b_bias, b_scales, *rest):
    """What vLLM's `marlin_gemm` computes for FP4 weights (float8_e4m3fn scales: NVFP4; e8m0: MXFP4), emulated in
    fp32 from the Marlin-ordered bytes, in the activations' dtype. vLLM 0.33's op takes `a_scales` (fp8 activations)
    after `b_scales`; 0.34's does not."""
    import torch

    from dsv4_convert.core.checkpoint.tensor_model import Quant
    from dsv4_convert.validate.emulate import marlin_dequantize

    if len(rest) == 11:  # 0.33: a_scales first
        a_scales, *rest = rest
        assert a_scales is None, "only 16-bit activations are emulated"
    global_scale, b_zeros, _workspace, _type_id, size_m, size_n, size_k = rest[:7]
    assert c is None and b_zeros is None, "only the weight-only FP4 Marlin linear is emulated"
    quant = Quant.NVFP4 if b_scales.dtype == torch.float8_e4m3fn else Quant.MXFP4
    act = {torch.bfloat16: "bfloat16", torch.float16: "float16"}[a.dtype]
    w = marlin_dequantize(b_q_weight, b_scales, global_scale, quant=quant, act_dtype=act, w4a8=False, n=size_n,
                          k=size_k)
    out = a[:size_m].float() @ w.T
    return (out if b_bias is None else out + b_bias.float()).to(a.dtype)
