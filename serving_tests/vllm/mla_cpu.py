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
"""

from __future__ import annotations


def use_cpu_reference_kernels() -> None:
    import torch
    from vllm.platforms.cpu import CpuPlatform

    torch.cpu._is_amx_tile_supported = lambda: False
    if getattr(CpuPlatform, "_dsv4_dense_for_sparse", False):
        return
    pick = CpuPlatform.get_attn_backend_cls.__func__

    def dense_for_sparse(cls, selected_backend, attn_selector_config, num_heads=None):
        return pick(cls, selected_backend, attn_selector_config._replace(use_sparse=False), num_heads)

    CpuPlatform.get_attn_backend_cls = classmethod(dense_for_sparse)
    CpuPlatform._dsv4_dense_for_sparse = True
