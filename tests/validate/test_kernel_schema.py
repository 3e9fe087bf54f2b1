"""validate --kernel calls the Marlin ops by name, mapped onto each release's own argument list (core/targets/kernel_table.py):
vLLM 0.34.0 dropped `a_scales` and `is_a_8bit`; SGLang 0.5.23's JIT ops name three arguments differently, take
act-order / EP arguments and the weight type as a ScalarType, and read the NVFP4 global in the activation dtype.
Runs on CPU: the argument mapping is pure; the GPU runs with the kernel builds are tests/gpu (docs/VALIDATE.md).

Substitution: the "op" is a plain function that returns the positional arguments it was given (the real
ops need a CUDA build); the argument lists are the engine table's, read from vLLM's released libraries and
SGLang's sources (serving_tests/sglang/test_sglang_kernels.py checks the SGLang one against the installed wheel).
"""

from __future__ import annotations

import pytest
import torch

from dsv4_convert.core.errors import UsageError
from dsv4_convert.core.targets.engines import RELEASES
from dsv4_convert.core.targets.kernel_table import GEMM_ARGS_033, GEMM_ARGS_034, GEMM_ARGS_SGLANG_0523
from dsv4_convert.validate.kernel_moe import Stack, run_stack
from dsv4_convert.validate.kernel_provider import KernelProvider, schema_names

# validate's call (validate/kernel_moe.py run_stack's names), each value unique so its position shows
CALL = {name: f"<{name}>" for name in (
    "a", "c_or_none", "b_q_weight", "b_bias_or_none", "b_scales", "global_scale", "b_zeros_or_none", "workspace",
    "sorted_token_ids", "expert_ids", "num_tokens_past_padded", "topk_weights", "moe_block_size", "top_k",
    "mul_topk_weights", "b_type", "size_m", "size_n", "size_k", "use_atomic_add", "use_fp32_reduce", "is_zp_float")}
CALL |= {"a_scales": None, "g_idx_or_none": None, "perm_or_none": None, "is_ep": False}


def _provider(key: str) -> KernelProvider:
    k = RELEASES[key].kernels
    return KernelProvider("test", lambda *a: a, k.gemm_args, lambda *a: a, k.repack_args, 0, dict(k.renames),
                          dict(k.fixed), ops=k)


@pytest.mark.parametrize("key", sorted(RELEASES))
def test_each_release_gets_its_own_positional_order(key):
    k = RELEASES[key].kernels
    got = _provider(key).moe_gemm(**CALL)
    assert len(got) == {GEMM_ARGS_033: 26, GEMM_ARGS_034: 25, GEMM_ARGS_SGLANG_0523: 29}[k.gemm_args]
    renames, fixed = dict(k.renames), dict(k.fixed)
    for name, value in zip(k.gemm_args, got):
        assert value == (fixed[name] if name in fixed else CALL[renames.get(name, name)]), name
    perm = torch.empty(0, dtype=torch.int32)
    rep = _provider(key).repack(b_q_weight="q", perm=perm, size_k=1, size_n=2, num_bits=4, is_a_8bit=False)
    want = {"b_q_weight": "q", "perm": perm, "size_k": 1, "size_n": 2, "num_bits": 4, "is_a_8bit": False}
    assert list(rep) == [want[a] for a in k.repack_args]


def test_sglang_gets_its_own_names_and_the_servers_fixed_values():
    """The values the SGLang server passes without expert parallelism (fused_marlin_moe.py: is_k_full,
    `expert_ids_are_sorted=expert_map is None`), and validate's values under SGLang's names."""
    got = dict(zip(GEMM_ARGS_SGLANG_0523, _provider("sglang 0.5.23").moe_gemm(**CALL)))
    assert got["global_scale_or_none"] == "<global_scale>" and got["b_q_type"] == "<b_type>"
    assert got["num_tokens_post_padded"] == "<num_tokens_past_padded>"
    assert got["is_k_full"] is True and got["expert_ids_are_sorted"] is True and got["is_ep"] is False
    assert got["g_idx_or_none"] is None and got["perm_or_none"] is None


def test_the_global_reaches_an_act_dtype_kernel_in_the_activation_dtype(monkeypatch):
    """SGLang's kernel reads `scale2_ptr` as the activation type: an fp32 global would be read as garbage bits."""
    k = RELEASES["sglang 0.5.23"].kernels
    seen = {}

    def gemm(*args):
        seen.update(zip(k.gemm_args, args))
        return torch.zeros(8 * 2, 64, dtype=torch.bfloat16)

    p = KernelProvider("t", gemm, k.gemm_args, None, (), "fe2m1", dict(k.renames), dict(k.fixed), "act", k)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev: type("P", (), {"multi_processor_count": 4}))
    stack = Stack(torch.zeros(2, 128 // 16, 2 * 64, dtype=torch.int32), torch.zeros(2, 8, 64, dtype=torch.float8_e4m3fn),
                  torch.tensor([0.25, 3.0]), None)
    run_stack(p, stack, torch.zeros(8, 128, dtype=torch.bfloat16))
    assert seen["global_scale_or_none"].dtype == torch.bfloat16
    assert seen["global_scale_or_none"].tolist() == [0.25, 3.0] and seen["b_q_type"] == "fe2m1"


def test_a_w4a8_input_is_never_dropped_silently():
    p = _provider("vllm 0.34")
    with pytest.raises(UsageError) as e:
        p.moe_gemm(**{**CALL, "a_scales": torch.ones(1)})
    assert e.value.error_id == "kernel.schema_unknown" and "a_scales" in e.value.message
    with pytest.raises(UsageError, match="is_a_8bit"):
        p.repack(b_q_weight="q", size_k=1, size_n=2, num_bits=4, is_a_8bit=True)
    with pytest.raises(UsageError, match="perm"):  # a real permutation is not absent
        p.repack(b_q_weight="q", perm=torch.arange(4), size_k=1, size_n=2, num_bits=4)


def test_a_missing_argument_names_it():
    with pytest.raises(UsageError, match="missing \\['size_k'\\]"):
        _provider("vllm 0.34").moe_gemm(**{k: v for k, v in CALL.items() if k != "size_k"})


def test_a_torch_ops_names_come_from_its_registered_schema():
    assert schema_names(torch.ops.aten.addmm) == ("self", "mat1", "mat2", "beta", "alpha")


def test_a_failed_jit_build_is_one_kernel_build_finding_with_its_fix():
    from dsv4_convert.validate.checks.kernel import KernelCase, kernel_build
    case = KernelCase("0", "w13", "bfloat16", "sglang 0.5.23 (JIT)", "source")
    assert list(kernel_build(case, None)) == []
    case.build_error = ("sglang 0.5.23 (JIT) compiles its Marlin MoE kernel on first use ... failed", "install nvcc")
    (f,) = kernel_build(case, None)
    assert f.message.endswith("failed. Fix: install nvcc") and f.layer == "0"
