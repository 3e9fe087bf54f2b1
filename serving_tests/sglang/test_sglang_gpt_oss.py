"""SGLang gpt-oss MXFP4 through the plugin, byte-equal per rank with SGLang's own gpt-oss Marlin path.

Both paths load real safetensors files: `dsv4-convert synth --format mxfp4-gptoss` (SGLang's own
input, quant_method "mxfp4") and its `mxfp4-to-marlin --target sglang` conversion (the plugin's),
through SGLang's own `GptOssForCausalLM.load_weights` (`_load_weights_mxfp4` for the source,
`_load_normal_weights` for the converted checkpoint, as SGLang picks by quant_method).

CPU substitutions (nothing compared comes from any of them), in addition to test_sglang_plugin.py's
(torchvision stub, `override_platform(is_sm120=True)`, `--moe-runner-backend marlin`, the
`gptq_marlin_repack` CUDA op -> the project's `to_marlin_weight`, the dummy workspace, ranks set with
`get_parallel().override_permanently` on spawned gloo ranks):
- quant_method "mxfp4" is added to SGLang's registry (`Mxfp4Config`): SGLang registers it on CUDA
  (and cpu/gfx95/xpu); this CPU build's platform checks report none of them.
- the model is a `GptOssForCausalLM` shell (`__new__`, its config from the source config.json) holding
  one FusedMoE built with `GptOssSparseMoeBlock`'s arguments (gemm1_alpha, swiglu limit, hidden_act with GptOssConfig's default "silu", with_bias,
  `use_weight_loader_fused` for a non-"mxfp4" quant_method), instead of the whole model: attention,
  router and embedding are not experts and load through SGLang's code unchanged.
"""

from __future__ import annotations

import pytest
from common import spawn_ranks

import synth

sglang = pytest.importorskip("sglang")

H, I, E = 256, 256, 4  # per-rank I 128 at TP 2 (SGLang's MXFP4 Marlin rounds I to 128, H to 256)
SPLITS = {"tp1": (1, False), "tp2": (2, False), "ep2": (2, True)}


@pytest.fixture(scope="module", params=list(SPLITS))
def results(request, tmp_path_factory):
    world, ep = SPLITS[request.param]
    tmp = tmp_path_factory.mktemp("gptoss")
    src, conv = synth.make_checkpoints(tmp, "mxfp4", engine="sglang", act_dtype="bfloat16", experts=E,
                                       hidden=H, inter=I, source="mxfp4-gptoss")
    return request.param, spawn_ranks("harness_gpt_oss:run", {"src": src, "conv": conv, "ep": ep}, tmp,
                                      world=world)


def test_gpt_oss_plugin_byte_equal_sglang_gpt_oss_marlin(results):
    split, ranks = results
    world, ep = SPLITS[split]
    for rank, r in enumerate(ranks):
        assert "__error__" not in r, r.get("__error__")
        assert r["engine_method"] == "Mxfp4MoEMethod"
        assert r["plugin_method"] == "PrepackedMxfp4MarlinMoEMethod"
        assert r["local_experts"] == (E // world if ep else E)
        assert r["bias_nonzero"]
        # SGLang zeroes the down bias on every MoE TP rank but 0
        assert r["w2_bias_zero"] == (not ep and rank > 0)
        assert r["diff"] == {k: None for k in r["diff"]}, (split, rank, r["diff"])
        assert r["gemm1_alpha"] == r["engine_gemm1_alpha"] == 1.702
        # negative control: without SGLang's de-interleave the w13 bias is not SGLang's
        assert r["negative_no_deinterleave"] is not None


def test_gpt_oss_every_plugin_parameter_loaded(results):
    # "unloaded" = still its initial bytes after loading; SGLang loads zeros as the down bias of MoE TP
    # ranks > 0 (checked byte-equal with its own path above), so only that one may look unloaded
    for r in results[1]:
        assert r["unloaded"] == (["w2_weight_bias"] if r["w2_bias_zero"] else []), r["unloaded"]
