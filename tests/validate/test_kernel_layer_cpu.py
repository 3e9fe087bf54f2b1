"""The CPU side of `validate --kernel`'s whole non-gated layer (validate/kernel_moe.py run_layer: w13 with one
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
from dsv4_convert.validate.kernel_moe import Stack, reference_layer, relu2, run_layer, situ, swiglu_limited
from dsv4_convert.validate.kernel_runner import _stacks


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


def test_a_gated_layer_with_a_swiglu_limit_chains_the_clamped_swiglu(monkeypatch):
    """GLM-5.3-Flash: w13 = gate | up (N = 2I), the engines' SwiGLU clamped at swiglu_limit, then w2; the input
    is scaled so that the clamp bites (the runner does the same), and each expert's row is its own clamped MLP."""
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev: type("P", (), {"multi_processor_count": 4}))
    g = torch.Generator().manual_seed(1)
    experts, hidden, inter, rows, limit = 3, 64, 32, 5, 0.5
    provider = _RoutingGemm()
    w13 = provider.stack(torch.randn(experts, 2 * inter, hidden, generator=g) / 8)
    w2 = provider.stack(torch.randn(experts, hidden, inter, generator=g) / 8)
    x = torch.randn(rows, hidden, generator=g)
    act = swiglu_limited(limit)
    y = run_layer(provider, w13, w2, x, act)
    assert y.shape == (rows, experts, hidden)
    assert torch.allclose(y, reference_layer(w13, w2, x, act), rtol=1e-5, atol=1e-5)
    for e in range(experts):
        h = x @ w13.reference[e].t()
        gate, up = h[:, :inter], h[:, inter:]
        assert (gate > limit).any() and (up.abs() > limit).any()  # the clamp is reached on both halves
        mlp = torch.nn.functional.silu(gate.clamp(max=limit)) * up.clamp(-limit, limit)
        assert torch.allclose(y[:, e], mlp @ w2.reference[e].t(), rtol=1e-5, atol=1e-5)
    # without the clamp the layer differs: the activation is not a no-op here
    assert not torch.allclose(y, reference_layer(w13, w2, x, swiglu_limited(1e9)), rtol=1e-3, atol=1e-3)


def test_swiglu_limited_clamps_the_gate_above_and_the_up_projection_both_ways():
    y = torch.tensor([[-20.0, 3.0, 20.0, 20.0, -20.0, 2.0]])  # gate [-20, 3, 20] | up [20, -20, 2]
    out = swiglu_limited(10.0)(y)
    silu = torch.nn.functional.silu
    expected = torch.stack([silu(torch.tensor(-20.0)) * 10.0, silu(torch.tensor(3.0)) * -10.0,
                            silu(torch.tensor(10.0)) * 2.0])
    assert torch.allclose(out[0], expected)


def test_the_swiglu_limit_is_read_for_glm5_next_only():
    from dsv4_convert.core.sources.structure import swiglu_limit

    glm = {"architectures": ["Glm5NextForConditionalGeneration"], "text_config": {"swiglu_limit": 10.0}}
    assert swiglu_limit(glm) == 10.0
    assert swiglu_limit({"architectures": ["Glm5NextForCausalLM"], "swiglu_limit": 7}) == 7.0
    # gpt-oss's swiglu_limit belongs to its own activation (alpha 1.702, up + 1): not this clamp
    assert swiglu_limit({"architectures": ["GptOssForCausalLM"], "swiglu_limit": 7.0}) is None
    assert swiglu_limit({"architectures": ["Glm5NextForCausalLM"]}) is None


def test_situ_is_vllms_situ_and_mul():
    """vLLM 0.34 SituAndMul.forward_native, written out: beta * tanh(gate / beta) * sigmoid(gate) * linear_beta *
    tanh(up / linear_beta), in fp32, returned in the input's dtype; without linear_beta the up projection passes."""
    gate, up = torch.tensor([-6.0, 0.5, 9.0]), torch.tensor([30.0, -2.0, 100.0])
    y = torch.cat([gate, up])[None]
    want = 4.0 * torch.tanh(gate / 4.0) * torch.sigmoid(gate) * (25.0 * torch.tanh(up / 25.0))
    assert torch.allclose(situ(4.0, 25.0)(y)[0], want)
    assert torch.allclose(situ(4.0, None)(y)[0], 4.0 * torch.tanh(gate / 4.0) * torch.sigmoid(gate) * up)
    assert situ(4.0, 25.0)(y.to(torch.bfloat16)).dtype == torch.bfloat16


def test_a_gated_layer_with_situ_chains_it(monkeypatch):
    """Kimi-K3: w13 = gate | up (N = 2I), SiTU, then w2; each expert's row is its own SiTU MLP, and the activation
    bends there (a plain SwiGLU gives another layer)."""
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev: type("P", (), {"multi_processor_count": 4}))
    g = torch.Generator().manual_seed(2)
    experts, hidden, inter, rows = 3, 64, 32, 5
    provider = _RoutingGemm()
    w13 = provider.stack(torch.randn(experts, 2 * inter, hidden, generator=g))
    w2 = provider.stack(torch.randn(experts, hidden, inter, generator=g) / 8)
    x = torch.randn(rows, hidden, generator=g)
    act = situ(4.0, 25.0)
    y = run_layer(provider, w13, w2, x, act)
    assert torch.allclose(y, reference_layer(w13, w2, x, act), rtol=1e-5, atol=1e-5)
    for e in range(experts):
        h = x @ w13.reference[e].t()
        gate, up = h[:, :inter], h[:, inter:]
        mlp = 4.0 * torch.tanh(gate / 4.0) * torch.sigmoid(gate) * 25.0 * torch.tanh(up / 25.0)
        assert torch.allclose(y[:, e], mlp @ w2.reference[e].t(), rtol=1e-4, atol=1e-4)
    silu = lambda t: torch.nn.functional.silu(t.chunk(2, -1)[0]) * t.chunk(2, -1)[1]  # noqa: E731
    assert not torch.allclose(y, reference_layer(w13, w2, x, silu), rtol=1e-3, atol=1e-3)


def test_the_situ_betas_are_read_for_kimi_k3_only():
    from dsv4_convert.core.sources.structure import situ_betas

    k3 = {"architectures": ["KimiK3ForConditionalGeneration"],
          "text_config": {"activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0}}
    assert situ_betas(k3) == (4.0, 25.0)
    assert situ_betas({"architectures": ["KimiK31ForConditionalGeneration"], "text_config": {}}) == (1.0, None)
    assert situ_betas({"architectures": ["Glm5NextForCausalLM"], "activation_situ_beta": 4.0}) is None
