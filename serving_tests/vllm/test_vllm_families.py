"""vLLM 0.33.0, on CPU: the whole model of each family, built by vLLM from the checkpoint's own
config.json (its model class, its layers, its quantisation lookup) and loaded through the model's own
`load_weights` (that architecture's weight-name mapping): once the source with vLLM's own config, once
the conversion with the plugin. Every linear layer kind (attention, router, shared experts) must get the
method vLLM gives it for the source, the routed experts the plugin's Marlin method, and every tensor of
the conversion must find its parameter.

CPU substitutions (nothing an assertion compares comes from them):
- `VLLM_TARGET_DEVICE=cpu` and `MarlinExperts._supports_current_device` -> True: vLLM's CPU platform
  finds no MoE backend; `--moe-backend marlin` (set in KernelConfig) is the documented sm_120 launch.
- One spawned gloo rank (vLLM's own `init_distributed_environment`), a 1-layer model of 256 hidden.
What could not run on CPU: the plugin's `process_weights_after_loading` runs (no repack, it builds the
Marlin kernel object); the source's does not (vLLM repacks with the CUDA-only `gptq_marlin_repack`), and
no forward pass runs (vLLM has no NVFP4 / Marlin kernel on CPU: "Failed to find a kernel").
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
vllm = pytest.importorskip("vllm")

from common import spawn_ranks
from families import FAMILIES, make_family

ATTN_KV_SCALES = {"k_scale", "v_scale", "q_scale", "prob_scale"}  # created by vLLM, absent from both checkpoints
# compressed-tensors keeps its input global as `input_global_scale` (loaded into a parameter of its own);
# the ModelOpt-named input scales keep their defaults, which W4A16 Marlin never reads
NOT_IN_CT = {"w13_input_scale", "w2_input_scale"}
BLOCK_FP8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]}


def _stale(tmp, conv):
    """The conversion with the stale block of nvidia/DeepSeek-V3-0324-FP4 recorded as the source's."""
    out = tmp / "stale-block"
    shutil.copytree(conv, out)
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"]["original_quantization_config"] = dict(BLOCK_FP8)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("families")
    cases = {}
    for family in FAMILIES:
        src, conv = make_family(tmp, family, "vllm")
        cases[f"{family}-source"] = {"path": str(src)}
        cases[f"{family}-plugin"] = {"path": str(conv), "process": True}
    _, conv = make_family(tmp, "glm4-moe-modelopt", "vllm", no_block=True)
    cases["glm4-moe-modelopt-noblock-plugin"] = {"path": str(conv), "process": True}
    cases["negative-stale-block"] = {"path": str(_stale(tmp, conv))}
    return spawn_ranks("harness_models:run", {"cases": cases}, tmp, world=1)[0]


def _non_expert(methods: dict) -> dict:
    return {k: v for k, v in methods.items() if ".experts" not in k}


@pytest.mark.parametrize("family", FAMILIES)
def test_non_expert_layers_get_the_engines_own_methods(results, family):
    src, plug = results[f"{family}-source"], results[f"{family}-plugin"]
    assert "error" not in src and "error" not in plug, (src, plug)
    assert plug["inner"] == src["config"], (plug, src)  # e.g. ModelOptNvFp4Config, CompressedTensorsConfig
    assert _non_expert(plug["methods"]) == _non_expert(src["methods"])
    kinds = {k.rsplit(".", 1)[-1] if ".layers." in k else k for k in plug["methods"]}
    assert {"qkv_proj", "o_proj", "gate", "gate_up_proj", "down_proj", "attn"} <= kinds, kinds


@pytest.mark.parametrize("family", FAMILIES)
def test_routed_experts_get_the_plugin_method_and_every_tensor_a_parameter(results, family):
    plug = results[f"{family}-plugin"]
    experts = {k: v for k, v in plug["methods"].items() if k.endswith(".experts.routed_experts")}
    assert experts and set(experts.values()) == {"PrepackedNvFp4MarlinMoE"}, plug["methods"]
    # model.load_weights raised for no tensor (vLLM raises on a name it cannot place), and every
    # parameter but the attention scales vLLM makes itself was loaded
    allowed = ATTN_KV_SCALES | (NOT_IN_CT if family.endswith("-ct") else set())
    assert {n.rsplit(".", 1)[-1] for n in plug["not_loaded"]} <= allowed, plug["not_loaded"]
    assert not any("global_scale" in n and "ct_" in n for n in plug["params_after"])  # kept globals dropped


def test_no_block_in_config_json_builds_modelopt_fp4_from_hf_quant_config(results):
    r = results["glm4-moe-modelopt-noblock-plugin"]
    assert r["inner_method"] == "modelopt_fp4" and r["inner"] == "ModelOptNvFp4Config", r
    assert {n.rsplit(".", 1)[-1] for n in r["not_loaded"]} <= ATTN_KV_SCALES


def test_negative_control_a_stale_fp8_block_fails_the_load(results):
    """vLLM follows config.json's block; a block-FP8 block over BF16/NVFP4 layers cannot load, with the
    engine's code as with the plugin's. Whatever the exact failure, the checks above would catch it."""
    r = results["negative-stale-block"]
    failed = "error" in r or {n.rsplit(".", 1)[-1] for n in r["not_loaded"]} - ATTN_KV_SCALES
    assert failed, r
    if "error" not in r:
        assert r["inner"] == "Fp8Config" and r["inner_method"] == "fp8"
