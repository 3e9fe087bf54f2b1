"""validate --kernel calls the Marlin ops by their schema's argument names (vLLM 0.34.0 dropped `a_scales`
and `is_a_8bit`). Runs on CPU: the argument mapping is pure; the GPU run with both vLLM kernel builds is
tests/gpu (docs/VALIDATE.md has its results).

Substitution: the "op" is a plain function that returns the positional arguments it was given (the real
ops need a CUDA build); the schemas are the engine table's, read from vLLM's released libraries."""

from __future__ import annotations

import pytest
import torch

from dsv4_convert.core.engines import GEMM_ARGS_033, GEMM_ARGS_034, RELEASES
from dsv4_convert.core.errors import UsageError
from dsv4_convert.validate.kernel_provider import KernelProvider, schema_names

CALL = {name: i for i, name in enumerate(GEMM_ARGS_033)} | {"a_scales": None}


def _provider(gemm_args, repack_args):
    return KernelProvider("test", lambda *a: a, gemm_args, lambda *a: a, repack_args, 0)


@pytest.mark.parametrize("key", sorted(RELEASES))
def test_each_release_gets_its_own_positional_order(key):
    r = RELEASES[key]
    got = _provider(r.gemm_args, r.repack_args).moe_gemm(**CALL)
    assert list(got) == [CALL[n] for n in r.gemm_args]
    assert len(got) == {GEMM_ARGS_033: 26, GEMM_ARGS_034: 25}[r.gemm_args]
    rep = _provider(r.gemm_args, r.repack_args).repack(b_q_weight="q", size_k=1, size_n=2, num_bits=4,
                                                         is_a_8bit=False)
    assert list(rep) == ["q", 1, 2, 4] + ([False] if "is_a_8bit" in r.repack_args else [])


def test_a_w4a8_input_is_never_dropped_silently():
    p = _provider(GEMM_ARGS_034, RELEASES["vllm 0.34"].repack_args)
    with pytest.raises(UsageError) as e:
        p.moe_gemm(**{**CALL, "a_scales": torch.ones(1)})
    assert e.value.error_id == "kernel.schema_unknown" and "a_scales" in e.value.message
    with pytest.raises(UsageError, match="is_a_8bit"):
        p.repack(b_q_weight="q", size_k=1, size_n=2, num_bits=4, is_a_8bit=True)


def test_a_missing_argument_names_it():
    with pytest.raises(UsageError, match="missing \\['blocks_per_sm'\\]"):
        _provider(GEMM_ARGS_034, ()).moe_gemm(**{k: v for k, v in CALL.items() if k != "blocks_per_sm"})


def test_a_torch_ops_names_come_from_its_registered_schema():
    assert schema_names(torch.ops.aten.addmm) == ("self", "mat1", "mat2", "beta", "alpha")
