"""vLLM plugin tests (0.34.0 and 0.33.0: serving_tests/run.sh --matrix), on CPU, against vLLM's own code.

CPU substitutions (nothing an assertion compares comes from any of them):
- `VLLM_TARGET_DEVICE=cpu`: vLLM's CPU platform. Checkpoint names are mapped with the CUDA DeepSeek-V4
  model's weights mapper (`models/deepseek_v4/nvidia/model.py`), which is what runs on sm_120 (the CPU
  model's mapper renames `.input_scale`).
- `MarlinExperts._supports_current_device` -> True (forced Marlin backend): vLLM's backend oracle finds
  no MoE backend on CPU; `--moe-backend marlin` (set here in KernelConfig) is what the documented
  launch command uses on sm_120, and it is what vLLM picks there by itself.
- `vllm._custom_ops.gptq_marlin_repack` -> the project's `to_marlin_weight`: the op is CUDA-only. It
  runs only in the engine's reference path (a); tests/formats/test_golden.py pins `to_marlin_weight` to
  the engines' bytes. Scale permutation, S0E5M3 processing, the rescale factor and the globals are
  vLLM's own Python in path (a).
- `DeepseekV4FP8Config`'s `expert_dtype` / `moe_quant_algo` are set on the config object: vLLM reads
  them from the model's hf_config, and there is no model here.
- Layers are built under the model's dtype (`set_default_torch_dtype`, as vLLM's model loader does).
- A fresh `VllmConfig` per layer (vLLM registers each layer name once per config); one MoE layer is
  built with vLLM's `FusedMoEFactory` instead of a whole model, and fed through vLLM's own DSv4 weights
  mapper, E8M0 -> uint8 view and expert params mapping (as `DeepseekV4Model.load_weights` does).
- 2 spawned gloo ranks with vLLM's own `init_distributed_environment` / `initialize_model_parallel`.
- vLLM 0.34 on an x86 CPU: the triton-cpu check of `CpuPlatform.check_and_update_config` is lifted
  (serving_tests/vllm/cpu_platform.py says why; nothing compared comes from it).

W4A8: the engine table (core/targets/engines.py) says which releases serve it. On those (0.33) the W4A8 cases
must load byte-equal to vLLM's own W4A8 path; on the others (0.34, which removed W4A8 Marlin) the plugin
must refuse every W4A8 checkpoint before building its layer, naming the fix (convert without --w4a8).
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
vllm = pytest.importorskip("vllm")

from common import spawn_ranks, split_params
from layer_cases import EXPERTS, layer_case, with_checkpoints

from dsv4_convert.core.targets.engines import release_for

W4A8_SERVED = release_for("vllm", vllm.__version__).w4a8


# codec-built converted tensors (serving_tests/synth.py): what the converter cannot be asked for
CASES = [
    # small block scales: vLLM's bf16 rescale factor > 1
    layer_case("nvfp4-bf16-small-tp2", "nvfp4", "bfloat16", small_scales=[0, 1, 2, 3]),
    # negative control: SGLang's output (globals rounded to bf16) loaded by the vLLM plugin must NOT
    # match vLLM's fp32 globals. (With small scales the plugin's rescale step would re-derive vLLM's
    # scale bytes from SGLang's, so the control uses normal scales, where only the globals differ.)
    layer_case("negative-sglang-bytes", "nvfp4", "bfloat16", convert_for="sglang"),
]
EP_CASES = [
    layer_case("mxfp4-bf16-ep2", "mxfp4", "bfloat16", ep=True),
    # experts 0-1 (rank 0) have small scales: rank 0's rescale factor differs from the stored one
    layer_case("nvfp4-bf16-ep2-rescale", "nvfp4", "bfloat16", ep=True, small_scales=[0, 1]),
]

# `--tp/--ep` padded output (serving_tests/synth.py padded_experts, the ROUND3 layout), loaded at the
# recorded split; vLLM's own path pads the unconverted source itself. NVFP4: I_shard 96 -> 128 (the
# golden nvfp4_moe_vllm_bfloat16_pad shape); MXFP4: I_shard 96 -> 128 and H 384 -> 512.
PAD_CASES = [
    layer_case("pad-nvfp4-bf16-tp2", "nvfp4", "bfloat16", inter=192, padded={"tp": 2, "ep": 1},
               small_scales=[0, 1, 2, 3]),
    layer_case("pad-mxfp4-bf16-tp2", "mxfp4", "bfloat16", hidden=384, inter=192, padded={"tp": 2, "ep": 1}),
]
PAD_EP_CASES = [
    layer_case("pad-nvfp4-bf16-ep2", "nvfp4", "bfloat16", ep=True, inter=96, padded={"tp": 2, "ep": 2},
               small_scales=[0, 1]),
    layer_case("pad-mxfp4-bf16-ep2", "mxfp4", "bfloat16", ep=True, hidden=384, inter=96, padded={"tp": 2, "ep": 2}),
    # written padded for TP 2 / EP 1, served at TP 2 / EP 2: refused
    layer_case("refuse-mxfp4-tp2-at-ep2", "mxfp4", "bfloat16", ep=True, hidden=384, inter=192,
               padded={"tp": 2, "ep": 1}),
]

# W4A8 (`--w4a8`: MXFP4 weights for fp8 activations, the golden mxfp4_moe_vllm_bfloat16_a8 layout),
# loaded with VLLM_MARLIN_INPUT_DTYPE=fp8; and the two refusals when the kernel and bytes disagree
W4A8_CASES = [
    layer_case("w4a8-mxfp4-bf16-tp2", "mxfp4", "bfloat16", w4a8=True),
    layer_case("w4a8-mxfp4-bf16-pad-tp2", "mxfp4", "bfloat16", w4a8=True, hidden=384, inter=192,
               padded={"tp": 2, "ep": 1}),
]
W4A8_EP_CASES = [layer_case("w4a8-mxfp4-bf16-ep2", "mxfp4", "bfloat16", ep=True, w4a8=True)]
W4A8_REFUSED = [
    layer_case("refuse-w4a8-bytes-a16-kernel", "mxfp4", "bfloat16", w4a8=True, kernel_a8=False),
    layer_case("refuse-a16-bytes-w4a8-kernel", "mxfp4", "bfloat16", kernel_a8=True),
]

# the key cases on the real converter output: `dsv4-convert synth` + `*-to-marlin --target vllm`
CKPT_CASES = [
    layer_case("ckpt-mxfp4-bf16-tp2", "mxfp4", "bfloat16"),
    layer_case("ckpt-nvfp4-bf16-tp2", "nvfp4", "bfloat16"),
    layer_case("ckpt-nvfp4-fp16-tp2", "nvfp4", "float16"),
]
CKPT_EP_CASES = [layer_case("ckpt-nvfp4-bf16-ep2", "nvfp4", "bfloat16", ep=True)]
# the padded cases on the real converter's `--tp/--ep` output
CKPT_PAD_CASES = [{**c, "id": "ckpt-" + c["id"]} for c in PAD_CASES]
CKPT_PAD_EP_CASES = [{**c, "id": "ckpt-" + c["id"]} for c in PAD_EP_CASES if not c["id"].startswith("refuse")]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every case in one spawn of 2 gloo ranks (the engine import dominates the run time)."""
    tmp = tmp_path_factory.mktemp("ranks")
    cases = CASES + EP_CASES + PAD_CASES + PAD_EP_CASES + W4A8_CASES + W4A8_EP_CASES + W4A8_REFUSED + with_checkpoints(
        CKPT_CASES + CKPT_EP_CASES + CKPT_PAD_CASES + CKPT_PAD_EP_CASES, tmp, "vllm")
    return spawn_ranks("harness_vllm:run_cases", {"cases": cases}, tmp)


def _assert_equal(results, case_id, expected_local):
    for rank, res in enumerate(results):
        r = res[case_id]
        assert r["plugin_method"].startswith("Prepacked") and r["local_experts"] == expected_local, r
        assert r["skipped"] == [] and r["engine_skipped"] == [], r  # vLLM would raise KeyError
        bad = {k: v for k, v in r["diff"].items() if v is not None}
        assert not bad, f"rank {rank} {case_id}: {bad}"
        # the same parameters, each with the engine's dtype and shape (layers built under the model's dtype)
        assert r["params"]["plugin"] == r["params"]["engine"], r["params"]


@pytest.mark.parametrize(
    "case_id", [c["id"] for c in CASES + CKPT_CASES if not c["id"].startswith("negative")]
)
def test_tp2_plugin_params_byte_equal_engine(results, case_id):
    _assert_equal(results, case_id, expected_local=EXPERTS)


def test_tp2_engine_path_is_vllm_marlin_method(results):
    assert {res[c["id"]]["engine_method"] for res in results for c in CASES + CKPT_CASES} == {
        "Mxfp4MoEMethod",
        "ModelOptNvFp4FusedMoE",
    }


def test_negative_control_wrong_target_differs(results):
    for res in results:
        diff = res["negative-sglang-bytes"]["diff"]
        assert diff["w13_weight"] is None and diff["w13_weight_scale"] is None  # same bytes in both engines
        assert diff["w13_weight_scale_2"] is not None and diff["w2_weight_scale_2"] is not None


@pytest.mark.parametrize("case_id", [c["id"] for c in EP_CASES + CKPT_EP_CASES])
def test_ep2_plugin_params_byte_equal_engine(results, case_id):
    _assert_equal(results, case_id, expected_local=EXPERTS // 2)


def test_ep2_rank_rescale_factor_was_recomputed(results):
    stored, rank0 = results[0]["nvfp4-bf16-ep2-rescale"]["rescale"]["w13"]
    assert stored == 1.0 and rank0 > 1.0  # rank 0 re-encoded its scales; rank 1 kept the stored bytes
    assert results[1]["nvfp4-bf16-ep2-rescale"]["rescale"]["w13"] == [1.0, 1.0]


@pytest.mark.parametrize("case_id, local", split_params(PAD_CASES + CKPT_PAD_CASES, PAD_EP_CASES + CKPT_PAD_EP_CASES, EXPERTS))
def test_padded_layout_byte_equal_engine(results, case_id, local):
    _assert_equal(results, case_id, expected_local=local)


def test_real_converter_padded_output_was_tested(results):
    assert {"ckpt-pad-nvfp4-bf16-tp2", "ckpt-pad-mxfp4-bf16-ep2"} <= set(results[0])


def test_padded_shapes_are_vllms_padded_sizes(results):
    # w13_weight [E, H/16, 4 I]: I_shard 96 -> 128 for both formats, H 384 -> 512 for MXFP4 only
    assert results[0]["pad-nvfp4-bf16-tp2"]["shapes"]["w13_weight"] == [EXPERTS, 256 // 16, 4 * 128]
    assert results[1]["pad-mxfp4-bf16-ep2"]["shapes"]["w2_weight"] == [EXPERTS // 2, 128 // 16, 2 * 512]


def test_padded_layout_refused_at_another_split(results):
    for res in results:
        msg = res["refuse-mxfp4-tp2-at-ep2"]["refused"]
        assert "converted padded for TP 2 / EP 1" in msg and "vllm runs TP 2 / EP 2" in msg, msg
        assert "--tensor-parallel-size 2" in msg and "`--tp 2 --ep 2`" in msg


def _assert_w4a8(results, case_id, expected_local):
    if W4A8_SERVED:
        _assert_equal(results, case_id, expected_local=expected_local)
        return
    for res in results:  # refused when the config is read: no plugin layer was built
        assert "plugin_method" not in res[case_id], res[case_id]
        msg = res[case_id]["refused"]
        assert f"vLLM {vllm.__version__} has no W4A8 Marlin" in msg and "without --w4a8" in msg, msg


@pytest.mark.parametrize("case_id", [c["id"] for c in W4A8_CASES])
def test_tp2_w4a8_byte_equal_engine_or_refused(results, case_id):
    _assert_w4a8(results, case_id, expected_local=EXPERTS)


def test_ep2_w4a8_byte_equal_engine_or_refused(results):
    _assert_w4a8(results, "w4a8-mxfp4-bf16-ep2", expected_local=EXPERTS // 2)


@pytest.mark.parametrize("case_id, message", [
    ("refuse-w4a8-bytes-a16-kernel", "converted with --w4a8.*VLLM_MARLIN_INPUT_DTYPE=fp8"),
    ("refuse-a16-bytes-w4a8-kernel", "unset VLLM_MARLIN_INPUT_DTYPE, or re-convert with --w4a8"),
])
def test_w4a8_mismatch_with_the_kernel_refused(results, case_id, message):
    import re

    if not W4A8_SERVED:
        if case_id == "refuse-a16-bytes-w4a8-kernel":
            pytest.skip(f"vLLM {vllm.__version__} has no W4A8 Marlin kernel for W4A16 bytes to mismatch")
        message = "has no W4A8 Marlin kernels.*without --w4a8"

    for res in results:
        assert re.search(message, res[case_id]["refused"]), res[case_id]


# the discovery and config tests both engines share: serving_tests/test_plugin_config.py
