"""The whole model of each family, on CPU, with the engine's own code (vLLM 0.33.0 in .venv-vllm,
SGLang 0.5.23 in .venv-sglang; this file runs in both, parametrised by the engine it finds): the engine
builds the model from the checkpoint's config.json (its model class, its layers, its quantisation
lookup) and loads it through the model's own `load_weights` (that architecture's weight-name mapping),
the conversion with the plugin; the engine's own config for the source (built by its whole lookup from
the source's config.json) names the method it would give each non-expert module of that model. Every
linear layer kind (attention, dense MLP, shared experts) must get that method,
the routed experts the plugin's Marlin method, and every tensor of the conversion must reach a
parameter (vLLM raises on a name it cannot place; SGLang skips it silently, so the SGLang harness
counts what reaches a parameter's loader).

CPU substitutions (nothing an assertion compares comes from them):
- vLLM: `dispatch_cpu_unquantized_gemm` -> nothing (the CPU platform's packing of unquantised weights,
  with a vllm._C op the CPU wheel lacks; a CUDA GPU keeps them as loaded).
- vLLM: `VLLM_TARGET_DEVICE=cpu`; `MarlinExperts._supports_current_device` -> True (no MoE backend on
  CPU; `--moe-backend marlin`, set in KernelConfig, is the documented sm_120 launch).
- SGLang: the torchvision stand-in, `override_platform(is_sm120=True)`, `--moe-runner-backend marlin`,
  the dummy Marlin workspace (serving_tests/sglang/test_sglang_plugin.py lists why), the parallel ranks
  written with `get_parallel().override_permanently`, the rotary embedding's CPU branch (its
  non-CUDA branch imports `vllm._custom_ops`, which the SGLang venv does not have; unrelated to
  quantisation), and `torch.cuda.get_device_capability` -> (12, 0), which SGLang's compressed-tensors
  scheme selection asks (sm_120, the target, as `override_platform(is_sm120=True)` says).
- The MLA families (DeepSeek-R1/V3/V3.2, Kimi-K2; fam-mla): vLLM: the CPU's AMX detection -> False (vLLM then
  picks its reference CPU GEMM and the CPU_MLA backend instead of AMX kernels whose ops the wheel lacks on CPU),
  and V3.2's sparse MLA kernel lookup -> the dense CPU_MLA backend ("Sparse Attention is not supported on
  CPU."); SGLang: the rotary embedding's accelerator lookup -> "cpu" (YaRN's cos/sin cache). Both listed in
  serving_tests/{vllm,sglang}/mla_cpu.py; the models' construction and weight loading are the engines' own.
- One spawned gloo rank, a 1-layer model of hidden 256.
- vLLM lists no NVFP4 linear kernel for the CPU platform ("Failed to find a kernel"): the harness lists
  vLLM's own `EmulationNvFp4LinearKernel` for it, so the NVFP4 dense / shared-expert layers of the ModelOpt
  releases can be created and loaded (never run).
What could not run on CPU: the source's whole model (SGLang's compressed-tensors MoE needs CUDA to be
built; both engines repack with a CUDA-only op), so the source is compared through the engine's config
for it; SGLang's own processing of NVFP4 linear layers (it needs a Blackwell GPU or the Marlin FP4 GEMM
backend's CUDA ops), so under SGLang only the plugin's expert methods are processed; and any forward pass.
The plugin's `process_weights_after_loading` runs (no repack).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from common import installed_engine, spawn_ranks
from families import CASES, ENGINE_REFUSES, ONE_ENGINE_CASES, make_family

ENGINE = installed_engine()
if ENGINE is None:
    pytest.skip("no engine installed (run serving_tests/run.sh)", allow_module_level=True)
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
sys.path.insert(0, str(Path(__file__).parent / ENGINE))  # the engine's harness_models

# parameters the engine creates that neither checkpoint holds: vLLM's attention scales, and the
# ModelOpt-named input scales of a compressed-tensors conversion (it keeps its input global as
# `input_global_scale`, loaded into a parameter of its own; W4A16 Marlin reads neither)
ATTN_KV_SCALES = {"k_scale", "v_scale", "q_scale", "prob_scale", "k_zero_point", "v_zero_point", "q_zero_point"}
NOT_IN_CT = {"w13_input_scale", "w2_input_scale"}
EXPERTS_METHOD = {"vllm": "PrepackedNvFp4MarlinMoE", "sglang": "PrepackedNvFp4MarlinMoEMethod"}
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
    """Every case in one spawned process (the engine import dominates the run time)."""
    tmp = tmp_path_factory.mktemp("families")
    cases = {}
    for family, fmt in ENGINE_CASES:
        src, conv = make_family(tmp, family, fmt, ENGINE)
        cases[f"{family}-{fmt}"] = {"path": str(conv), "source": str(src), "process": True}
    # nvidia/DeepSeek-V3-0324-FP4 as shipped: config.json's stale block-FP8 block; the source, and its conversion
    src, conv = make_family(tmp, "deepseek-v3-0324", "nvfp4-modelopt-hf", ENGINE)
    cases["v3-0324"] = {"path": str(conv), "source": str(src)}
    src, conv = make_family(tmp, "glm4-moe", "nvfp4-modelopt-hf", ENGINE, no_block=True)
    cases["noblock"] = {"path": str(conv), "source": str(src), "process": True}
    cases["negative-stale-block"] = {"path": str(_stale(tmp, conv))}
    out = spawn_ranks("harness_models:run", {"cases": cases}, tmp, world=1)[0]
    return {**out, "__paths__": {k: c["path"] for k, c in cases.items()}}


def _non_expert(methods: dict) -> dict:
    return {k: v for k, v in methods.items() if ".experts" not in k}


def _unquantised(method) -> bool:
    return method is None or method.startswith("Unquantized")


def _same_methods(plugin: dict, engine: dict) -> dict:
    """Modules whose method differs; the engine's config answers None where the layer keeps its own
    unquantised default (embeddings, lm_head), which is what the plugin's layer then holds too. An
    unquantised answer matches any unquantised method: a model that builds its lm_head without asking the
    quantisation config (SGLang's MiniMax-M2) holds the embedding's unquantised method, and the engine's
    config, asked here for that module anyway, answers with the linear one; both keep the BF16 weight."""
    return {k: (v, engine.get(k)) for k, v in _non_expert(plugin).items()
            if engine.get(k) != v and not (k in engine and _unquantised(engine.get(k)) and _unquantised(v))}


# GLM's MTP layer (`model.layers.<num_hidden_layers>.*`, in mtp.safetensors) is the speculative draft's:
# the main model's loader skips it (SGLang's GLM NextN model loads it; not built here)
GLM_MTP_LAYER = "model.layers.2."  # synth's GLM has 2 layers


def _unplaced(r: dict, family: str) -> set:
    """What the load left out, beyond what neither checkpoint holds."""
    allowed = ATTN_KV_SCALES | (NOT_IN_CT if family.endswith("nvfp4-ct") else set())
    left = set(r.get("not_loaded", [])) - set(r.get("absent_from_source", []))  # the source lacks them too
    not_placed = {n for n in r.get("not_placed", []) if not n.startswith(GLM_MTP_LAYER) and not _fused_mla(n, r)}
    return {n for n in left if n.rsplit(".", 1)[-1] not in allowed} | not_placed


ENGINE_CASES = (*CASES, *ONE_ENGINE_CASES[ENGINE])
def _fused_mla(name: str, r: dict) -> bool:
    module, _, leaf = name.rpartition(".")
    parent, _, proj = module.rpartition(".")
    return proj in SGLANG_MLA_FUSED and f"{parent}.{SGLANG_MLA_FUSED[proj]}.{leaf}" in r.get("params_after", [])


IDS = [f"{family}-{fmt}" for family, fmt in ENGINE_CASES]
# MLA (DeepSeek-V3 family): its attention linears, q_a_proj + kv_a_proj_with_mqa fused by both engines
MLA_KINDS = {"q_b_proj", "kv_b_proj", "o_proj"}
# SGLang concatenates q_a_proj and kv_a_proj_with_mqa before it loads the fused parameter, so the placement
# counter (by storage) never sees the two checkpoint tensors themselves: placed when the fused parameter is
SGLANG_MLA_FUSED = {"q_a_proj": "fused_qkv_a_proj_with_mqa", "kv_a_proj_with_mqa": "fused_qkv_a_proj_with_mqa"}


@pytest.mark.parametrize("case", IDS)
def test_non_expert_layers_get_the_engines_own_methods(results, case):
    plug = results[case]
    assert "error" not in plug, plug
    assert plug["inner"] == plug["engine_config"], plug  # ModelOpt NVFP4 / compressed-tensors, as the engine
    assert set(_non_expert(plug["methods"])) == set(plug["engine_methods"]), plug
    assert not _same_methods(plug["methods"], plug["engine_methods"]), _same_methods(plug["methods"],
                                                                                      plug["engine_methods"])
    kinds = {k.rsplit(".", 1)[-1] for k in plug["methods"] if ".layers." in k}
    attention = MLA_KINDS if "fused_qkv_a_proj" in " ".join(kinds) else {"qkv_proj", "o_proj"}
    assert attention <= kinds, kinds  # attention (and the dense MLP / shared experts a family has)
    if case.startswith(("deepseek-v3", "kimi-k2")):  # MLA's fused first projection
        assert {"fused_qkv_a_proj", "fused_qkv_a_proj_with_mqa"} & kinds, kinds
    if case.startswith("deepseek-v32"):  # the sparse-attention indexer's linears, as the engine builds them
        assert {"wq_b"} <= kinds and ({"wk_weights_proj"} <= kinds or {"wk", "weights_proj"} <= kinds), kinds
    if case.startswith("glm4-moe"):  # a dense MLP layer and shared experts (NVFP4 in the ModelOpt release)
        for kind in (".0.mlp.gate_up_proj", ".0.mlp.down_proj", "shared_experts.gate_up_proj",
                     "shared_experts.down_proj"):
            assert any(k.endswith(kind) for k in plug["methods"]), (kind, plug["methods"])


@pytest.mark.parametrize("case", IDS)
def test_routed_experts_get_the_plugin_method_and_every_tensor_a_parameter(results, case):
    plug = results[case]
    experts = {k: v for k, v in plug["methods"].items() if ".experts" in k}  # mlp.experts, block_sparse_moe.experts
    assert experts and set(experts.values()) == {EXPERTS_METHOD[ENGINE]}, plug["methods"]
    assert not _unplaced(plug, case), plug
    assert not any("ct_weight_global_scale" in n for n in plug["params_after"])  # kept globals dropped


def test_no_block_in_config_json_builds_modelopt_fp4_from_hf_quant_config(results):
    r = results["noblock"]
    assert r.get("inner_method") == "modelopt_fp4" and "Fp4Config" in r["inner"], r
    assert r["inner"] == r["engine_config"] and not _same_methods(r["methods"], r["engine_methods"]), r
    assert not _unplaced(r, "noblock"), r


def test_negative_control_a_stale_fp8_block_fails_the_load(results):
    """The engines follow config.json's block; the plugin follows the recorded one. A block-FP8 block
    over the BF16 / NVFP4 layers must fail: an error, or layers the checks above see as not loaded."""
    r = results["negative-stale-block"]
    assert "error" in r or _unplaced(r, "noblock") or r["inner_method"] == "fp8", r
    if "error" not in r:
        assert _same_methods(r["methods"], results["glm4-moe-nvfp4-modelopt-hf"]["engine_methods"]), r


def test_v3_0324_as_shipped_is_built_as_block_fp8_by_the_engine_itself(results):
    """nvidia/DeepSeek-V3-0324-FP4's config.json keeps the block-FP8 block of the model before FP4 export: the
    engine's own config for that source is FP8 (it follows config.json, not hf_quant_config.json); `validate`
    reports the block (structure.quant_config.stale_block). Its conversion records `serves_from`
    hf_quant_config.json, so the plugin hands the non-expert layers to the engine's ModelOpt NVFP4 method, as for
    the deepseek-v3 case above (hf_quant_config.json only; the differential case deepseek-v3-0324 proves the bytes)."""
    r = results["v3-0324"]
    assert "error" not in r and r["engine_config"] == "Fp8Config" and r["inner_method"] == "modelopt_fp4", r


# what SGLang builds for a checkpoint: its own ModelConfig (with the plugin registered) and model-class choice
_SGLANG_ARCH = """
import sys
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.model_loader.utils import get_model_architecture
for path in sys.argv[1:]:
    config = ModelConfig(path, dtype="bfloat16")
    print(config.quantization, get_model_architecture(config)[1])
"""


@pytest.mark.skipif(ENGINE != "sglang", reason="only SGLang refuses a family (families.py ENGINE_REFUSES)")
@pytest.mark.parametrize("fmt", ["nvfp4-modelopt-hf", "nvfp4-ct"])
def test_sglang_refuses_mixtral_with_its_own_reason(tmp_path, fmt):
    """SGLang 0.5.23 turns a quantised MixtralForCausalLM into QuantMixtralForCausalLM (per-expert linear layers,
    no fused MoE) for any conversion, and for the ModelOpt source too: no layer for the plugin's Marlin MoE. A
    compressed-tensors source keeps SGLang's fused MixtralForCausalLM (its own list of exceptions), its conversion
    does not."""
    import subprocess

    assert ("sglang", "mixtral") in ENGINE_REFUSES
    src, conv = make_family(tmp_path, "mixtral", fmt, ENGINE)
    stubs = str(Path(__file__).parent / "stubs")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join([stubs, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", _SGLANG_ARCH, str(conv), str(src)], capture_output=True, text=True,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.split("\n")
    source = {"nvfp4-modelopt-hf": "modelopt_fp4 QuantMixtralForCausalLM",
              "nvfp4-ct": "compressed-tensors MixtralForCausalLM"}[fmt]
    assert "marlin_fp4 QuantMixtralForCausalLM" in lines and source in lines, lines


@pytest.mark.parametrize("which", ["converted", "stale"])
def test_doctor_asks_the_installed_engine(results, tmp_path_factory, which):
    """`dsv4-convert doctor PATH` in this engine's environment: the engine builds the plugin's config from
    the checkpoint (serving/probe.py) without loading weights; a stale block is a finding, never "ready"."""
    import subprocess

    path = results["__paths__"]["noblock" if which == "converted" else "negative-stale-block"]
    stubs = str(Path(__file__).parent / "stubs")  # SGLang's import needs the torchvision stand-in
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join([stubs, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "dsv4_convert.cli", "doctor", path, "--json"],
                          capture_output=True, text=True, env=env)
    report = json.loads(proc.stdout)
    (probe,) = report["checkpoint"]["engine_probe"]
    assert probe["engine"] == ENGINE and "error" not in probe, probe
    probe_findings = [f for f in report["findings"] if f.startswith(ENGINE)]
    if which == "converted":
        assert probe["inner_method"] == "modelopt_fp4" and not probe_findings, report
    else:
        assert probe["inner_method"] == "fp8" and "not proven" in " ".join(probe_findings), report
    assert proc.returncode == 1  # never "ready": on CPU there is no GPU either
