"""One stack of experts through the engine's Marlin MoE GEMM, against an fp32 reference, on the GPU.

Routing follows vLLM's `moe_align_block_size` contract: `sorted_token_ids` lists, expert by expert,
the flat (token * top_k + slot) indices routed to it, each expert's run padded to a multiple of the
block size with the sentinel M * top_k; `expert_ids` names the expert of every block; and
`num_tokens_post_padded` is the padded length. To test every stacked expert on the same
activations, every token is routed to every expert (top_k = experts in the stack): output row
m * top_k + e is x[m] @ W_e^T.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..formats.constants import E2M1_VALUES, MXFP4_GROUP, NVFP4_GROUP
from ..formats.e2m1 import unpack_nibbles
from ..formats.e8m0 import e8m0_to_float

__all__ = ["Stack", "moe_align", "run_stack", "run_layer", "reference_layer", "relu2", "situ", "swiglu_limited",
           "swigluoai_limited", "clamped_swiglu", "dequant", "repack_source"]


@dataclass
class Stack:
    """Experts of one layer's w13 or w2, as the engine stacks them (all on one device).
    qweight int32 [E, K/16, 2N]; scales [E, K/g, N] (float8_e4m3fn or float8_e8m0fnu); globals
    float32 [E] or None (MXFP4); reference float32 [E, N, K]: what the numbers should be."""
    qweight: torch.Tensor
    scales: torch.Tensor
    globals: torch.Tensor | None
    reference: torch.Tensor


def moe_align(topk_ids: torch.Tensor, num_experts: int, block: int):
    """vLLM's moe_align_block_size, in torch: (sorted_token_ids, expert_ids, num_tokens_post_padded)."""
    flat = topk_ids.reshape(-1).long()
    numel = flat.numel()
    counts = torch.bincount(flat, minlength=num_experts).cpu()
    padded = (counts + block - 1) // block * block
    starts = torch.cumsum(padded, 0) - padded
    total = int(padded.sum())
    capacity = numel + num_experts * (block - 1)
    sorted_ids = torch.full((capacity,), numel, dtype=torch.int32)
    expert_ids = torch.zeros((capacity + block - 1) // block, dtype=torch.int32)
    order = torch.argsort(flat.cpu(), stable=True)
    pos = 0
    for e in range(num_experts):
        c, s = int(counts[e]), int(starts[e])
        sorted_ids[s:s + c] = order[pos:pos + c].to(torch.int32)
        expert_ids[s // block:(s + int(padded[e])) // block] = e
        pos += c
    dev = topk_ids.device
    return sorted_ids.to(dev), expert_ids.to(dev), torch.tensor([total], dtype=torch.int32, device=dev)


def run_stack(provider, stack: Stack, x: torch.Tensor, *, block: int = 16, per_expert_rows: bool = False) -> torch.Tensor:
    """x [M, K] (activation dtype) through the provider's MoE GEMM on every expert: [M, E, N] fp32.
    `per_expert_rows`: x is [M*E, K], row m*E+e for expert e (the first GEMM's activated output): the
    engines' second MoE GEMM (fused_marlin_moe: top_k=1, size_m = M*top_k, the same routing)."""
    e, rows, cols = stack.qweight.shape
    size_k, size_n = rows * 16, cols // 2
    m = x.shape[0] // e if per_expert_rows else x.shape[0]
    dev = x.device
    topk_ids = torch.arange(e, device=dev).repeat(m, 1)
    sorted_ids, expert_ids, post = moe_align(topk_ids, e, block)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    workspace = torch.zeros(sms * 4, dtype=torch.int32, device=dev)
    weights = torch.ones(m, e, dtype=torch.float32, device=dev)
    # by name (validate/kernel_provider.py maps them onto each release's op): a_scales exists up to vLLM 0.33 only
    # (W4A8); act-order (g_idx, perm) and expert parallelism (is_ep) are SGLang's, all absent here
    out = provider.moe_gemm(
        a=x.contiguous(), c_or_none=None, b_q_weight=stack.qweight.contiguous(), b_bias_or_none=None,
        b_scales=stack.scales.contiguous(), a_scales=None, global_scale=stack.globals, b_zeros_or_none=None,
        g_idx_or_none=None, perm_or_none=None, workspace=workspace, sorted_token_ids=sorted_ids, expert_ids=expert_ids,
        num_tokens_past_padded=post, topk_weights=weights, moe_block_size=block, top_k=1 if per_expert_rows else e,
        mul_topk_weights=False, is_ep=False, b_type=provider.fe2m1, size_m=m * e if per_expert_rows else m,
        size_n=size_n, size_k=size_k, use_atomic_add=False, use_fp32_reduce=True, is_zp_float=False)
    return out.float().reshape(m, e, size_n)


def reference_product(stack: Stack, x: torch.Tensor) -> torch.Tensor:
    return torch.einsum("mk,enk->men", x.float(), stack.reference)


def relu2(y: torch.Tensor) -> torch.Tensor:
    """The engines' activation of a non-gated MoE (Nemotron-H `mlp_hidden_act: relu2`), on the first GEMM's
    output in its dtype: vLLM's RELU2_NO_MUL and SGLang's fused_marlin_moe `relu2` (not gated) both square
    the ReLU (`torch.square(F.relu(x))`), no gate product."""
    return torch.square(torch.relu(y))


def swiglu_limited(limit: float):
    """The engines' clamped SwiGLU on the first GEMM's output [..., 2I] (gate rows, then up rows), in its dtype:
    gate clamped to at most `limit`, up to [-limit, limit], then silu(gate) * up (vLLM 0.34 SiluAndMulWithClamp,
    the `swiglu_limit` of FusedMoEFactory; SGLang 0.5.23 glm5_next.py swiglu_clamped)."""
    def act(y: torch.Tensor) -> torch.Tensor:
        gate, up = y.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate.clamp(max=limit)) * up.clamp(min=-limit, max=limit)
    return act


def situ(beta: float, linear_beta: float | None):
    """Kimi's SiTU on the first GEMM's output [..., 2I] (gate rows, then up rows), computed in fp32 and returned in its
    dtype: beta * tanh(gate / beta) * sigmoid(gate) * up, the up projection soft-clipped to linear_beta * tanh(up /
    linear_beta) when set (vLLM 0.34 SituAndMul.forward_native, the `situ_and_mul` of its fused MoE; SGLang 0.5.23
    passes the same betas as gemm1_alpha / gemm1_clamp_limit)."""
    def act(y: torch.Tensor) -> torch.Tensor:
        gate, up = (h.float() for h in y.chunk(2, dim=-1))
        up = up if linear_beta is None else linear_beta * torch.tanh(up / linear_beta)
        return (beta * torch.tanh(gate / beta) * torch.sigmoid(gate) * up).to(y.dtype)
    return act


def swigluoai_limited(alpha: float, limit: float, beta: float = 1.0):
    """The engines' clamped SwiGLU-OAI on the first GEMM's output [..., 2I] (gate rows, then up rows), in its dtype:
    gate clamped to at most `limit`, up to [-limit, limit], then gate * sigmoid(alpha * gate) * (up + beta) (vLLM 0.34
    MiniMax-M3's `swigluoai_uninterleave`, SiluAndMulWithClamp.forward_native with beta 1; SGLang 0.5.23 minimax_m3.py
    gemm1_alpha / gemm1_clamp_limit)."""
    def act(y: torch.Tensor) -> torch.Tensor:
        gate, up = y.chunk(2, dim=-1)
        gate, up = gate.clamp(max=limit), up.clamp(min=-limit, max=limit)
        return gate * torch.sigmoid(alpha * gate) * (up + beta)
    return act


def clamped_swiglu(limit: float, alpha: float | None):
    """The clamped SwiGLU a family's engines run: silu(gate) * up (GLM-5.3-Flash), or with `alpha` MiniMax-M3's
    SwiGLU-OAI (core/sources/structure.py swiglu_limit / swiglu_alpha)."""
    return swiglu_limited(limit) if alpha is None else swigluoai_limited(alpha, limit)


def run_layer(provider, w13: Stack, w2: Stack, x: torch.Tensor, activation=relu2) -> torch.Tensor:
    """An MoE layer as the engines run it: x [M, H] -> w13 GEMM -> `activation` in the activation dtype (relu2 of a
    non-gated layer, N = I; swiglu_limited of a gated one, N = 2I) -> w2 GEMM on every (token, expert) row:
    [M, E, H] fp32."""
    y1 = activation(run_stack(provider, w13, x).to(x.dtype))
    m, e, i = y1.shape
    return run_stack(provider, w2, y1.reshape(m * e, i), per_expert_rows=True)


def reference_layer(w13: Stack, w2: Stack, x: torch.Tensor, activation=relu2) -> torch.Tensor:
    """The fp32 reference of run_layer."""
    return torch.einsum("mei,ehi->meh", activation(reference_product(w13, x)), w2.reference)


def rel_errors(y: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per expert relative Frobenius error [E] (inf where the kernel gave non-finite numbers)."""
    diff = (y.double() - ref.double()).norm(dim=(0, 2))
    norm = ref.double().norm(dim=(0, 2))
    rel = torch.where(norm > 0, diff / norm.clamp_min(1e-300), torch.where(diff == 0, 0.0, float("inf")))
    return torch.where(torch.isfinite(y).all(dim=2).all(dim=0), rel, torch.full_like(rel, float("inf")))


def dequant(quant: str, packed: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor | None) -> torch.Tensor:
    """Source FP4 (packed u8 [N, K/2], block scales [N, K/g], ModelOpt global) -> float32 [N, K] on the
    tensors' device. A padded layout is padded before (formats/padded_layout.pad_source)."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    values = table[unpack_nibbles(packed.contiguous().view(torch.uint8)).long()]
    n, k = values.shape
    group = NVFP4_GROUP if quant == "nvfp4" else MXFP4_GROUP
    if quant == "nvfp4":
        s = scale.contiguous().view(torch.float8_e4m3fn).float()
        g = global_scale.float().reshape(()).to(packed.device) if global_scale is not None else 1.0
        return (values.reshape(n, -1, group) * s.unsqueeze(-1) * g).reshape(n, k)
    table = e8m0_to_float(torch.arange(256, dtype=torch.uint8)).to(packed.device)
    w = values.reshape(n, -1, group) * table[scale.contiguous().view(torch.uint8).long()].unsqueeze(-1)
    return w.reshape(n, k)


def repack_source(provider, packed: torch.Tensor) -> torch.Tensor:
    """The engine's own repack of source bytes [N, K/2] (already in the engine's padded shape), as its
    weight loading does it: view as int32 [N, K/8], transpose to [K/8, N], gptq_marlin_repack(num_bits=4)."""
    b = packed.contiguous().view(torch.uint8)
    n, k2 = b.shape
    q = b.view(torch.int32).t().contiguous()
    return provider.repack(b_q_weight=q, perm=torch.empty(0, dtype=torch.int32, device=q.device), size_k=k2 * 2,
                           size_n=n, num_bits=4, is_a_8bit=False)
