"""SGLang 0.5.23 plugin tests, on CPU, against SGLang's own code.

CPU substitutions (nothing an assertion compares comes from any of them):
- torchvision stand-in (serving_tests/stubs/torchvision): `import sglang` imports torchvision for
  multimodal preprocessing; PyPI's torchvision does not load beside CPU torch 2.13. Never called here.
- `override_platform(is_sm120=True)`: SGLang's DSv4 `Mxfp4MarlinMoEMethod` refuses to prepare
  Marlin weights unless the GPU is sm90/sm120; sm120 is the target, and it also selects the padding
  rule (non-Hopper: I -> 128, H -> 256) that the plugin's shape check mirrors.
- `--moe-runner-backend marlin` (server args + `initialize_moe_config()`): forces the Marlin MoE
  methods, as the documented launch command does.
- `marlin_utils_fp4.gptq_marlin_repack` -> the project's `to_marlin_weight`: the real op is a CUDA
  JIT kernel. It only runs in the engine's reference path (a); the golden cases
  (tests/formats/test_golden.py) pin `to_marlin_weight` to the engines' bytes, and the scale
  permutation/processing is SGLang's own Python in both paths.
- `marlin_make_workspace` -> a dummy tensor: it reads the CUDA SM count; the workspace is a runtime
  buffer, not a compared parameter.
- Parallel ranks are set with `get_parallel().override_permanently` on 2 spawned gloo ranks; SGLang's
  FusedMoE weight loader only reads the ranks (it communicates nothing while loading). On CPU SGLang's
  loader takes its `use_padded_loading` branch for both paths (a) and (b).
- The model's own name mapping (`DeepseekV4ForCausalLM.remap_weight_name_to_dpsk_hf_format` +
  `FusedMoE.make_expert_params_mapping`) feeds a single FusedMoE layer instead of a whole model.
"""

from __future__ import annotations

import pytest
from common import spawn_ranks, split_params
from layer_cases import EXPERTS, HIDDEN, layer_case, with_checkpoints

sglang = pytest.importorskip("sglang")


# codec-built converted tensors (serving_tests/synth.py): what the converter cannot be asked for
CASES = [
    # negative control: bytes converted for vLLM (bf16 rescale, fp32 globals) must NOT match SGLang's
    layer_case("negative-vllm-bytes", "nvfp4", "bfloat16", convert_for="vllm", small_scales=list(range(EXPERTS))),
]
EP_CASES = [layer_case("mxfp4-bf16-ep2", "mxfp4", "bfloat16", ep=True)]

# `--tp/--ep` padded MXFP4 output (serving_tests/synth.py padded_experts, the ROUND3 layout) loaded at
# the recorded split; SGLang's own path pads the unconverted source itself (I_shard 96 -> 128).
PAD_CASES = [layer_case("pad-mxfp4-bf16-tp2", "mxfp4", "bfloat16", inter=192, padded={"tp": 2, "ep": 1})]
# H 384 -> 512 as well: SGLang's own loader cannot load this source (see test_sglang_h_padding_...);
# the plugin's real region is compared with this rank's slice of the source instead
H_PAD_CASES = [layer_case("pad-mxfp4-h384-tp2", "mxfp4", "bfloat16", hidden=384, inter=192, padded={"tp": 2, "ep": 1})]
PAD_EP_CASES = [
    layer_case("pad-mxfp4-bf16-ep2", "mxfp4", "bfloat16", ep=True, inter=96, padded={"tp": 2, "ep": 2}),
    layer_case("refuse-mxfp4-tp2-at-ep2", "mxfp4", "bfloat16", ep=True, inter=192, padded={"tp": 2, "ep": 1}),
]

# the key cases on the real converter output: `dsv4-convert synth` + `*-to-marlin --target sglang`
CKPT_CASES = [
    layer_case("ckpt-mxfp4-bf16-tp2", "mxfp4", "bfloat16"),
    layer_case("ckpt-nvfp4-bf16-tp2", "nvfp4", "bfloat16"),
    layer_case("ckpt-nvfp4-fp16-tp2", "nvfp4", "float16"),
]
CKPT_EP_CASES = [layer_case("ckpt-nvfp4-bf16-ep2", "nvfp4", "bfloat16", ep=True)]
# the padded cases on the real converter's `--tp/--ep` output
CKPT_PAD_CASES = [{**c, "id": "ckpt-" + c["id"]} for c in PAD_CASES + H_PAD_CASES]
CKPT_PAD_EP_CASES = [{**c, "id": "ckpt-" + c["id"]} for c in PAD_EP_CASES if not c["id"].startswith("refuse")]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every case in one spawn of 2 gloo ranks (the engine import dominates the run time)."""
    tmp = tmp_path_factory.mktemp("ranks")
    cases = CASES + EP_CASES + PAD_CASES + PAD_EP_CASES + H_PAD_CASES + with_checkpoints(
        CKPT_CASES + CKPT_EP_CASES + CKPT_PAD_CASES + CKPT_PAD_EP_CASES, tmp, "sglang")
    return spawn_ranks("harness_sglang:run_cases", {"cases": cases}, tmp)


def _assert_equal(results, case_id, expected_local):
    for rank, res in enumerate(results):
        r = res[case_id]
        assert r["plugin_method"].startswith("Prepacked"), r
        assert r["local_experts"] == expected_local
        assert r["skipped"] == [], f"rank {rank}: converted tensors with no parameter: {r['skipped']}"
        bad = {k: v for k, v in r["diff"].items() if v is not None}
        assert not bad, f"rank {rank} {case_id}: {bad}"


@pytest.mark.parametrize(
    "case_id", [c["id"] for c in CASES + CKPT_CASES if not c["id"].startswith("negative")]
)
def test_tp2_plugin_params_byte_equal_engine(results, case_id):
    _assert_equal(results, case_id, expected_local=EXPERTS)


def test_tp2_engine_path_is_sglang_marlin_method(results):
    methods = {res[c["id"]]["engine_method"] for res in results for c in CASES + CKPT_CASES}
    assert methods == {"Mxfp4MarlinMoEMethod", "ModelOptNvFp4FusedMoEMethod"}


def test_negative_control_wrong_target_is_refused(results):
    """vLLM-target bytes (small scales: vLLM's bf16 rescale factors, recorded in the record) never reach SGLang's
    layer: the one record parser refuses a factor other than 1 where SGLang does no rescale (issue 37 item 6), before
    a byte is loaded. The byte-level control (the weights agree, the scales differ) is the vLLM suite's
    negative-sglang-bytes, whose SGLang-target record has no factor to refuse."""
    for res in results:
        refused = res["negative-vllm-bytes"].get("refused", "")
        assert "[converted_config.rescale_factor]" in refused and "SGLang has no rescale" in refused, \
            res["negative-vllm-bytes"]


@pytest.mark.parametrize("case_id", [c["id"] for c in EP_CASES + CKPT_EP_CASES])
def test_ep2_plugin_params_byte_equal_engine(results, case_id):
    _assert_equal(results, case_id, expected_local=EXPERTS // 2)


def _assert_padded(results, case_id, expected_local, h_pad=HIDDEN):
    for rank, res in enumerate(results):
        r = res[case_id]
        assert r["plugin_method"].startswith("Prepacked") and r["local_experts"] == expected_local, r
        assert r["skipped"] == [] and r["engine_skipped"] == [], r
        bad = {k: v for k, v in r["real_diff"].items() if v is not None}
        assert not bad, f"rank {rank} {case_id}: real region differs: {bad}"
        assert r["repack_is_identity"] and r["gemm_nonzero"], r
        assert r["gemm_same_w13_padding_random"] and r["gemm_same_w2_padding_random"], r
        assert not r["gemm_same_both_random"], r  # the control: zeros on one side are what makes it hold
        assert r["shapes"]["w13_weight"] == [expected_local, h_pad // 16, 4 * 128], r["shapes"]


@pytest.mark.parametrize("case_id, local", split_params(
    [c for c in PAD_CASES + CKPT_PAD_CASES if "h384" not in c["id"]], PAD_EP_CASES + CKPT_PAD_EP_CASES, EXPERTS))
def test_padded_layout_real_region_byte_equal_and_padding_inert(results, case_id, local):
    _assert_padded(results, case_id, expected_local=local)


def test_padded_layout_whole_tensors_byte_equal(results):
    """With I padding only, SGLang's own (GPU-branch) loader zero-fills the shard-dim tail it does not
    copy (fused_moe_triton/layer.py _load_w13/_load_w2), so even the padding bytes agree."""
    for res in results:
        for case_id in ("pad-mxfp4-bf16-tp2", "pad-mxfp4-bf16-ep2", *(c["id"] for c in CKPT_PAD_CASES + CKPT_PAD_EP_CASES
                                                                     if "h384" not in c["id"])):
            bad = {k: v for k, v in res[case_id]["diff"].items() if v is not None}
            assert not bad, (case_id, bad)


@pytest.mark.parametrize("case_id", [c["id"] for c in H_PAD_CASES + CKPT_PAD_CASES if "h384" in c["id"]])
def test_sglang_h_padding_plugin_loads_real_region_equal_to_source(results, case_id):
    _assert_padded(results, case_id, expected_local=EXPERTS, h_pad=512)
    for res in results:
        # SGLang's own path: create_weights rounds H to 256 (torch.empty), but _load_w13 copies the
        # [I_shard, H/2] source into a [I_shard, H_pad/2] slice: a size mismatch, so no reference
        assert "must match the size" in res[case_id]["engine_error"], res[case_id]


def test_padded_layout_refused_at_another_split(results):
    for res in results:
        msg = res["refuse-mxfp4-tp2-at-ep2"]["refused"]
        assert "converted padded for TP 2 / EP 1" in msg and "sglang runs TP 2 / EP 2" in msg, msg
        assert "--tp-size 2" in msg and "`--tp 2 --ep 2`" in msg


# the discovery and config tests both engines share: serving_tests/test_plugin_config.py
