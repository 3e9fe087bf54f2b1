"""gpt-oss MXFP4 through the vLLM 0.33.0 plugin, on CPU, against vLLM's own gpt-oss Marlin path.

Both paths load real safetensors files: `dsv4-convert synth --format mxfp4-gptoss` (the engine's
input) and its `mxfp4-to-marlin --target vllm` conversion (the plugin's), through vLLM's own
GptOssForCausalLM weights mapper and GptOssModel.load_weights (`_load_weights_mxfp4` for the source,
`_load_weights_other` for `marlin_fp4`), into one gpt-oss MoE layer built as vLLM's MLPBlock builds it.

CPU substitutions, besides those listed in test_vllm_plugin.py (`VLLM_TARGET_DEVICE=cpu`, the forced
Marlin backend, `gptq_marlin_repack` -> the project's `to_marlin_weight` in the engine path, 2 gloo
ranks):
- GptOssModel is created without its __init__ (no attention, embedding or other layers) and holds
  only the one MoE layer at its model path; `config` / `parallel_config` carry the fields its
  load_weights reads. Its load_weights code itself is vLLM's.
- The w13 comparison: vLLM's w13 rows are interleaved (g0, u0, g1, u1, ...) and the plugin's are
  [gates; ups], so vLLM's rows before its repack (captured after loading) are taken in the order
  perm = [0, 2, ..., 2*I_p-2, 1, 3, ..., 2*I_p-1] and packed with the project codec; and vLLM's own
  final w13 scale bytes are taken back to source rows with the project's inverse codec and permuted.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
vllm = pytest.importorskip("vllm")

from common import spawn_ranks

import synth

H, I, E = 256, 256, 4
# split id: (ranks, expert parallel, converted with --tp/--ep, hidden, intermediate). "pad-tp2": H 384 ->
# 512 and I_shard 96 -> 128, padded by the converter (`--tp 2`) and by vLLM's own path from the source
# (gpt-oss-20b's H = I = 2880 pads the same way at TP 2: I_shard 1440 -> 1536, H -> 3072)
SPLITS = {"tp1": (1, False, None, H, I), "tp2": (2, False, None, H, I), "ep2": (2, True, None, H, I),
          "pad-tp2": (2, False, (2, 1), 384, 192), "pad-ep2": (2, True, (2, 2), 384, 192)}


@pytest.fixture(scope="module", params=list(SPLITS))
def results(request, tmp_path_factory):
    world, ep, layout, hidden, inter = SPLITS[request.param]
    tmp = tmp_path_factory.mktemp("gptoss")
    tp_ep = {} if layout is None else {"tp": layout[0], "ep": layout[1]}
    src, conv = synth.make_checkpoints(tmp, "mxfp4", engine="vllm", act_dtype="bfloat16", experts=E,
                                       hidden=hidden, inter=inter, source="mxfp4-gptoss", **tp_ep)
    return request.param, spawn_ranks("harness_gpt_oss:run", {"src": src, "conv": conv, "ep": ep}, tmp,
                                      world=world)


def test_gpt_oss_plugin_byte_equal_vllm_gpt_oss_marlin(results):
    split, ranks = results
    for rank, r in enumerate(ranks):
        assert r["engine_method"] == "GptOssMxfp4MoEMethod"
        assert r["plugin_method"] == "PrepackedGptOssMxfp4MarlinMoE"
        assert r["bias_nonzero"]
        assert r["diff"] == {k: None for k in r["diff"]}, (split, rank)
        # negative control: without the row permutation the plugin's w13 / bias are not vLLM's
        assert r["control"]["w13_weight"] and r["control"]["w13_bias"], r["control"]


def test_gpt_oss_every_converted_tensor_loaded(results):
    split, ranks = results
    for r in ranks:
        # every plugin parameter received checkpoint bytes through vLLM's loader (the streamed route
        # reports the fused parameter name once it loaded an expert into it)
        assert set(r["plugin_loaded"]) >= {
            "routed_experts.w13_weight", "routed_experts.w13_weight_scale", "routed_experts.w2_weight",
            "routed_experts.w2_weight_scale", "routed_experts.w13_bias", "routed_experts.w2_bias",
        }, (split, r["plugin_loaded"])
        assert r["local_experts"] == (E // 2 if split.endswith("ep2") else E)
        if split == "pad-tp2":  # vLLM's padded per-rank sizes: I_p = 128, H_p = 512
            assert r["shapes"] == {"w13_weight": [E, 32, 512], "w2_weight": [E, 8, 1024], "w13_bias": [E, 256],
                                   "w2_bias": [E, 512]}


def test_gpt_oss_activation_is_swigluoai_on_deinterleaved_halves(results):
    _, ranks = results
    for r in ranks:
        assert r["engine_activation"] == "swigluoai"
        assert r["plugin_activation"] == r["kernel_activation"] == "swigluoai_uninterleave"
        alpha, limit = r["vllm_swigluoai"]
        assert r["act_constants"] == [alpha, 1.0, limit] == [1.702, 1.0, 7.0]


def test_gpt_oss_emulated_moe_output_equal(results):
    # the expert outputs from the final tensors of both paths (validate/emulate.py dequantisation, each
    # path's own activation) are exactly equal: the de-interleave and SWIGLUOAI_UNINTERLEAVE change nothing
    split, ranks = results
    for r in ranks:
        out = r["emulated_max_abs_diff"]
        assert out["max_abs_out"] > 0 and out["max_abs_diff"] == 0.0, (split, out)
