"""The CPU side of `validate --kernel`'s whole layers (the non-gated one with relu2; MiniMax-M3's gated one with the
clamped SwiGLU-OAI its config declares) and its whole non-gated layer (validate/kernel_moe.py run_layer: w13 with one
shard, ReLU-squared, then w2 on every (token, expert) row, as fused_marlin_moe chains its two MoE GEMMs), and
which stacks kernel_runner builds for a gated and a non-gated layer.

Substitution: the engine's Marlin MoE GEMM (`moe_wna16_marlin_gemm`, CUDA only) -> a torch stand-in that follows
its routing contract (sorted_token_ids, expert_ids, moe_block_size, top_k: a row is sorted_id // top_k, an output
row is sorted_id) on dense weights: it shows that the chaining feeds the second GEMM the rows the engine feeds it.
The GPU suite (tests/gpu/test_families_kernel_gpu.py) runs the real kernels on a converted Nemotron-H replica.
"""

from __future__ import annotations

import torch

from dsv4_convert.core.checkpoint.tensor_model import Role
from dsv4_convert.core.sources.structure import ClampedSwiglu, moe_activation
from dsv4_convert.validate.kernel_moe import Stack, clamped_swiglu, reference_layer, relu2, run_layer
from dsv4_convert.validate.kernel_runner import _LAYER, _SWIGLU_LAYER, _stacks, _whole_layer


class _RoutingGemm:
    """moe_wna16_marlin_gemm's routing contract on dense [E, N, K] weights, keyed by the stack's qweight."""
    fe2m1 = 0
    repack_op = None

    def __init__(self):
        self.dense = {}

    def stack(self, w: torch.Tensor) -> Stack:
        e, n, k = w.shape
        q = torch.zeros(e, k // 16, 2 * n, dtype=torch.int32)  # the Marlin shape run_stack reads N and K from
        self.dense[q.data_ptr()] = w
        return Stack(q, torch.zeros(e, k // 16, n, dtype=torch.float8_e4m3fn), None, w)

    def moe_gemm(self, *, a, b_q_weight, sorted_token_ids, expert_ids, num_tokens_past_padded, moe_block_size,
                 top_k, size_m, size_n, size_k, **_):
        w = self.dense[b_q_weight.data_ptr()]
        assert a.shape == (size_m, size_k) and w.shape[1:] == (size_n, size_k)
        out = torch.zeros(size_m * top_k, size_n)
        for block in range(int(num_tokens_past_padded[0]) // moe_block_size):
            e = int(expert_ids[block])
            for s in sorted_token_ids[block * moe_block_size:(block + 1) * moe_block_size].tolist():
                if s < size_m * top_k:  # the sentinel pads each expert's run
                    out[s] = a[s // top_k].float() @ w[e].t()
        return out.to(a.dtype)


def test_a_non_gated_layer_chains_the_two_gemms_as_the_engines_do(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev: type("P", (), {"multi_processor_count": 4}))
    g = torch.Generator().manual_seed(0)
    experts, hidden, inter, rows = 5, 64, 48, 7
    provider = _RoutingGemm()
    w13 = provider.stack(torch.randn(experts, inter, hidden, generator=g) / 8)  # up_proj alone: N = I
    w2 = provider.stack(torch.randn(experts, hidden, inter, generator=g) / 8)
    x = torch.randn(rows, hidden, generator=g)
    y = run_layer(provider, w13, w2, x)
    assert y.shape == (rows, experts, hidden)
    assert torch.allclose(y, reference_layer(w13, w2, x), rtol=1e-5, atol=1e-5)
    # every (token, expert) row is that expert's own MLP: relu2(x W13_e^T) W2_e^T
    for e in range(experts):
        assert torch.allclose(y[:, e], relu2(x @ w13.reference[e].t()) @ w2.reference[e].t(), rtol=1e-5, atol=1e-5)


def test_relu2_is_the_square_of_the_relu():
    y = torch.tensor([-2.0, -0.0, 0.5, 3.0], dtype=torch.bfloat16)
    assert torch.equal(relu2(y), torch.tensor([0.0, 0.0, 0.25, 9.0], dtype=torch.bfloat16))


def test_a_non_gated_layer_stacks_w13_from_the_up_projection_alone():
    gated = {0: {Role.GATE: 1, Role.UP: 2, Role.DOWN: 3}}
    non_gated = {0: {Role.GATE: 1, Role.DOWN: 3}}  # Nemotron-H: up_proj has the gate's role (vLLM's w1)
    assert _stacks(gated) == (("w13", (Role.GATE, Role.UP)), ("w2", (Role.DOWN,)))
    assert _stacks(non_gated) == (("w13", (Role.GATE,)), ("w2", (Role.DOWN,)))


M3 = ClampedSwiglu(alpha=1.702, limit=7.0)  # transformers 5.20 MiniMaxM3VLTextConfig's swiglu_alpha / swiglu_limit


def test_a_gated_layer_with_the_clamped_swiglu_chains_the_two_gemms_as_the_engines_do(monkeypatch):
    """w13 = [gates; ups] (N = 2I), the clamped SwiGLU-OAI on it, w2 on every (token, expert) row."""
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev: type("P", (), {"multi_processor_count": 4}))
    g = torch.Generator().manual_seed(1)
    experts, hidden, inter, rows = 4, 64, 32, 5
    provider = _RoutingGemm()
    w13 = provider.stack(torch.randn(experts, 2 * inter, hidden, generator=g))  # large enough to reach the clamp
    w2 = provider.stack(torch.randn(experts, hidden, inter, generator=g) / 8)
    x = torch.randn(rows, hidden, generator=g)
    y = run_layer(provider, w13, w2, x, M3)
    assert torch.allclose(y, reference_layer(w13, w2, x, M3), rtol=1e-5, atol=1e-4)
    h = x @ w13.reference[0].t()
    assert (h.abs() > M3.limit).any()  # the clamp is exercised
    gate, up = h[:, :inter].clamp(max=7.0), h[:, inter:].clamp(-7.0, 7.0)
    assert torch.allclose(y[:, 0], (gate * torch.sigmoid(1.702 * gate) * (up + 1.0)) @ w2.reference[0].t(),
                          rtol=1e-5, atol=1e-4)
    # the walk fails on a made-up activation: plain SiLU-and-mul (no clamp, no +1) gives another layer
    silu = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
    assert not torch.allclose(y[:, 0], silu @ w2.reference[0].t(), rtol=1e-2, atol=1e-2)


def test_the_clamp_bounds_the_gate_above_and_the_up_on_both_sides():
    y = torch.tensor([[10.0, -10.0, 3.0, 9.0, -9.0, -2.0]])  # gates 10, -10, 3; ups 9, -9, -2
    out = clamped_swiglu(y, M3)
    same = clamped_swiglu(torch.tensor([[7.0, -10.0, 3.0, 7.0, -7.0, -2.0]]), M3)
    assert torch.equal(out, same)  # 10 -> 7 (gate, above), 9 -> 7 and -9 -> -7 (up); -10 stays (gate: above only)
    assert out[0, 1] != clamped_swiglu(torch.tensor([[7.0, -7.0, 3.0, 9.0, -9.0, -2.0]]), M3)[0, 1]


def test_which_whole_layer_a_layer_runs():
    gated, non_gated = _stacks({0: {Role.GATE: 1, Role.UP: 2, Role.DOWN: 3}}), _stacks({0: {Role.GATE: 1, Role.DOWN: 3}})
    assert _whole_layer(non_gated, None) == _LAYER and _whole_layer(gated, M3) == _SWIGLU_LAYER
    assert _whole_layer(gated, None) is None  # plain SiLU-and-mul: the two stacks' own cases


def test_the_activation_comes_from_the_config_the_engine_reads():
    m3 = {"architectures": ["MiniMaxM3SparseForConditionalGeneration"],
          "text_config": {"hidden_act": "swigluoai", "swiglu_alpha": 1.702, "swiglu_limit": 7.0}}
    assert moe_activation(m3) == M3 and moe_activation(m3["text_config"]) == M3
    # DeepSeek-V4's swiglu_limit clamps a SiLU-and-mul (hidden_act silu): not this activation
    assert moe_activation({"hidden_act": "silu", "swiglu_limit": 10.0}) is None
    assert moe_activation({"hidden_act": "swigluoai"}) is None  # gpt-oss's fixed constants live in its own method
