"""Kimi-K3 / K3.1 in the family, served and engine-config tables (pure; the proofs are serving_tests'): both
architectures name the kimi-k3 family, its release's expert names parse to that family's scheme, vLLM 0.33 and 0.34
serve both formats with compressed-tensors for the non-expert layers, and Kimi-K3.1's architecture is refused by exactly the releases whose registries lack it.

No substitutions: the tables are the code under test; the configs are the keys those tables read."""

from __future__ import annotations

import pytest

from dsv4_convert.core.checkpoint.tensor_model import Role
from dsv4_convert.core.sources.families import family_of
from dsv4_convert.core.sources.naming import parse_expert_name
from dsv4_convert.core.targets.served import entries, inner_method, refusal

K3 = {"architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3"}
K31 = {"architectures": ["KimiK31ForConditionalGeneration"], "model_type": "kimi_k31"}
BLOCKS = {"mxfp4-ct": {"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized"},
          "nvfp4-ct": {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"}}


def test_both_architectures_are_kimi_k3_and_its_expert_names_parse():
    assert family_of(K3).name == family_of(K31).name == "kimi-k3"
    parsed = parse_expert_name("language_model.layers.4.block_sparse_moe.experts.9.w2.weight_packed")
    assert parsed is not None and parsed.scheme is family_of(K3).source_scheme
    assert (parsed.layer, parsed.expert, parsed.role) == ("4", 9, Role.DOWN)


def test_the_plugin_hands_kimi_k3s_non_expert_layers_to_compressed_tensors():
    """Both formats' blocks resolve to compressed-tensors on both engines (vLLM's architecture hook, which swaps the
    MXFP4 block for `mxfp4` in its own load of the source, is not part of the plugin's walk: docs/SERVING.md)."""
    for fmt, block in BLOCKS.items():
        for engine in ("vllm", "sglang"):
            assert inner_method(engine, block, "kimi_k3") == "compressed-tensors", (fmt, engine)
    assert {m for e in entries("kimi-k3") for m in e.methods} == {"compressed-tensors"}


@pytest.mark.parametrize("fmt", sorted(BLOCKS))
def test_served_on_vllm_033_and_034_not_on_sglang(fmt):
    assert {e.engine for e in entries("kimi-k3", fmt)} == {"vllm 0.33", "vllm 0.34"}
    for key in ("vllm 0.33", "vllm 0.34", "vllm"):
        assert refusal(K3, fmt, key, BLOCKS[fmt]) is None, key
    assert "sglang 0.5.23 itself cannot serve a kimi-k3" in refusal(K3, fmt, "sglang", BLOCKS[fmt])


def test_kimi_k31_is_refused_where_the_release_has_no_such_architecture():
    block = BLOCKS["mxfp4-ct"]
    assert refusal(K31, "mxfp4-ct", "vllm 0.34", block) is None
    assert refusal(K31, "mxfp4-ct", "vllm", block) is None  # vLLM 0.34 has it: the engine as a whole serves it
    assert "model type `kimi_k31` but Transformers does not recognize" in refusal(K31, "mxfp4-ct", "vllm 0.33", block)
    for engine in ("sglang", "sglang 0.5.23"):
        assert "no model class KimiK31ForConditionalGeneration" in refusal(K31, "mxfp4-ct", engine, block)
    # the walk fails on the K3 architecture: it is no K3.1 and vLLM 0.33 has it
    assert refusal(K3, "mxfp4-ct", "vllm 0.33", block) is None


def test_vllm_builds_its_native_mxfp4_method_for_kimi_k3_only():
    """vLLM's Kimi-K3 hook swaps a compressed-tensors MXFP4 block for `mxfp4` (Mxfp4MoEMethod); any other model type
    keeps the compressed-tensors MoE method, and NVFP4 is never swapped (core/targets/engines.py native_ct)."""
    from dsv4_convert.core.targets.engines import ENGINES

    vllm = ENGINES["vllm"]
    assert not vllm.builds_ct_method("mxfp4-pack-quantized", "kimi_k3")
    assert not vllm.builds_ct_method("mxfp4-pack-quantized", "kimi_k31")
    assert vllm.builds_ct_method("mxfp4-pack-quantized", "qwen3_moe")
    assert vllm.builds_ct_method("nvfp4-pack-quantized", "kimi_k3")
    assert not vllm.builds_ct_method(None, "kimi_k3")
    assert ENGINES["sglang"].builds_ct_method("mxfp4-pack-quantized", "kimi_k3")
