"""The engine's own reason, where core/targets/served.py REFUSED says an engine release cannot serve a family x format
because it cannot load the SOURCE itself: the engine builds the source's model with its own construction and
loads it with its own loader (serving_tests/sglang/harness_refusal.py, the differential harness's set-up), and
the test passes only while that load fails with the quoted reason. If the engine ever loads it, the test fails:
the refusal is then stale and the family's differential case should run on that engine.

The real producers' outputs (tests/fixtures/producers: NVIDIA ModelOpt 0.47, llm-compressor 0.14) that an engine
cannot load are tested here as the producer wrote them, one spawned rank for all of them (the engine import
dominates the time); core/targets/served.py REFUSED and core/targets/engine_config.py quote these reasons.

Substitutions: those of serving_tests/test_differential.py and serving_tests/sglang/harness_differential.py
(CPU stand-ins for engine steps, never the weight loading this test is about); the source is a
`dsv4-convert synth --family` replica built from the release's public facts (synth/families.py), not its weights
(the producers' cases: the producers' own files, unchanged).
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from pathlib import Path

import pytest
from common import installed_engine, spawn_ranks
from differential import PRODUCERS, Case, make_source

from dsv4_convert.core.targets.served import REFUSED, engine_key

ENGINE = installed_engine()
# Kimi-K3.1's architecture: vLLM 0.34.0 has it, vLLM 0.33.0 and SGLang 0.5.23 do not (core/targets/engine_config.py)
NO_KIMI_K31 = ENGINE == "sglang" or (ENGINE == "vllm" and __import__("vllm").__version__.startswith("0.33."))
if ENGINE is None:
    pytest.skip("no engine installed (run serving_tests/run.sh)", allow_module_level=True)
VERSION = importlib.metadata.version(ENGINE)
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
sys.path.insert(0, str(Path(__file__).parent / ENGINE))

# GLM-5.3-Flash replicas whose architecture this release's registry lacks (core/targets/served.py REFUSED)
_NO_ARCHITECTURE = {"glm5-next": "nvfp4-modelopt-hf"} if ENGINE == "sglang" else {}


@pytest.mark.skipif(ENGINE != "sglang", reason="core/targets/served.py REFUSED: SGLang 0.5.23 x llama4")
def test_sglang_cannot_load_the_modelopt_llama4_source_itself(engine_loads):
    """nvidia/Llama-4-Scout-17B-16E-Instruct-FP4 layout (ModelOpt's stacked K-major experts with per-expert block
    scales `feed_forward.experts.gate_up_proj_weight_scale` [E, K/16, 2I]): SGLang 0.5.23's Llama4ForConditionalGeneration
    (mllama4.py) routes that name through `_handle_expert_scale_params`, which takes it for one scale shared by
    all experts and writes it into every expert's slot: `param.data[expert_id] = loaded_weight` cannot broadcast
    the whole stack into one expert (RuntimeError, expand)."""
    r = engine_loads["llama4"]
    assert "error" in r, f"SGLang loaded the ModelOpt Llama-4 source ({r}): core/targets/served.py's refusal is stale"
    assert r["error"].startswith("RuntimeError:") and "expand" in r["error"], r
    assert "_handle_expert_scale_params" in r["traceback"] and "mllama4.py" in r["traceback"], r["traceback"]


# Qwen3.8-Flash-Next's replicas (synth/qwen4_exp.py) an engine release cannot load itself
_QWEN4_EXP_SOURCES = {("sglang", "0.5.23"): ("qwen4-exp-text", "qwen4-exp-ple-nvfp4")}


# producer output -> its source format; the cases this engine release cannot load
_PRODUCER_CASES = {
    "modelopt-qwen3-moe-mxfp4-mlp-weight-only": "mxfp4-modelopt-hf",
    "modelopt-deepseek-v3-mxfp4-mlp-weight-only": "mxfp4-modelopt-hf",
    "modelopt-qwen3-moe-w4a16-mxfp4": "mxfp4-modelopt-hf",  # ModelOpt 0.48's spelling, W4A16_MXFP4
    "modelopt-deepseek-v3-nvfp4": "nvfp4-modelopt-hf",
    "llmc-deepseek-v3-nvfp4a16": "nvfp4-ct",
    **({"llmc-qwen3-moe-mxfp4a16": "mxfp4-ct", "llmc-mixtral-mxfp4a16": "mxfp4-ct"} if ENGINE == "sglang" else {}),
}


# MiniMax-M3 / M3.1 replicas (synth/families.py) this release refuses (core/targets/served.py REFUSED names the rows)
_MINIMAX = {("minimax-m3", "nvfp4-ct-mxfp8"), ("minimax-m3-vl", "nvfp4-ct-mxfp8"), ("minimax-m3", "nvfp4-modelopt-hf")}
RELEASE = engine_key(ENGINE, importlib.metadata.version(ENGINE))
_REFUSED_REPLICAS = sorted((r.family, r.source_format) for r in REFUSED
                           if r.engine == RELEASE and (r.family, r.source_format) in _MINIMAX)


@pytest.fixture(scope="module")
def engine_loads(tmp_path_factory):
    """Each source loaded alone by the engine (its own construction and loader), all in one spawned rank: the
    producers' outputs, a replica pruned per layer (differential.py `pruned`) and, on SGLang, the ModelOpt Llama-4
    replica and llm-compressor's DeepSeek-V3 with the keys its export lacks (`release-keys`)."""
    tmp = tmp_path_factory.mktemp("refusals")
    cases = {name: {"source": str(PRODUCERS / name), "dtype": "bfloat16", "fmt": fmt}
             for name, fmt in _PRODUCER_CASES.items()}
    pruned = make_source(tmp, Case("qwen3-moe", "nvfp4-ct", edit="pruned"))
    cases["pruned"] = {"source": str(pruned), "dtype": "bfloat16", "fmt": "nvfp4-ct"}
    if ENGINE == "sglang":
        src = make_source(tmp, Case("llama4", "nvfp4-modelopt-hf"))
        cases["llama4"] = {"source": str(src), "dtype": "bfloat16", "fmt": "nvfp4-modelopt-hf"}
        keys = Case("deepseek-v3", "nvfp4-ct", edit="release-keys", producer="llmc-deepseek-v3-nvfp4a16")
        cases["llmc-deepseek-v3-with-keys"] = {"source": str(make_source(tmp, keys)), "dtype": "bfloat16",
                                               "fmt": "nvfp4-ct"}
    for family in _QWEN4_EXP_SOURCES.get((ENGINE, VERSION), ()):  # Qwen3.8-Flash-Next's refusals (below)
        src = make_source(tmp, Case(family, "nvfp4-modelopt-hf"))
        cases[family] = {"source": str(src), "dtype": "bfloat16", "fmt": "nvfp4-modelopt-hf", "text_only": True}
    if NO_KIMI_K31:
        src = make_source(tmp, Case("kimi-k3", "mxfp4-ct", edit="k31"))
        cases["kimi-k31"] = {"source": str(src), "dtype": "bfloat16", "fmt": "mxfp4-ct"}
    for family, fmt in _NO_ARCHITECTURE.items():
        cases[family] = {"source": str(make_source(tmp, Case(family, fmt))), "dtype": "bfloat16", "fmt": fmt}
    for family, fmt in _REFUSED_REPLICAS:  # the VL wrapper built text-only, as its differential case
        src = make_source(tmp, Case(family, fmt))
        cases[f"{family}-{fmt}"] = {"source": str(src), "dtype": "bfloat16", "fmt": fmt,
                                    "text_only": family.endswith("-vl")}
    (result,) = spawn_ranks("harness_refusal:run", {"cases": cases}, tmp, world=1)
    return result


def _refused(result: dict, name: str) -> dict:
    r = result[name]
    assert "error" in r, f"{ENGINE} loaded {name} ({r}): the refusal in core/targets/served.py / engine_config.py is stale"
    return r


@pytest.mark.parametrize("name", ["modelopt-qwen3-moe-mxfp4-mlp-weight-only", "modelopt-deepseek-v3-mxfp4-mlp-weight-only",
                                  "modelopt-qwen3-moe-w4a16-mxfp4"])
def test_neither_engine_loads_the_modelopt_mxfp4_source_itself(engine_loads, name):
    """ModelOpt 0.47's MXFP4 export (quant_algo `mxfp4`) and 0.48's spelling of it (`W4A16_MXFP4`). vLLM 0.33 / 0.34:
    its ModelOpt override takes any algo holding "FP4" for modelopt_fp4, whose config then refuses an algo outside
    its list (modelopt.py `ModelOptQuantConfigBase.from_config`). SGLang 0.5.23: `_parse_modelopt_quant_config`
    maps no lower-case 'mxfp4', so the block's `quant_method: modelopt` builds ModelOptFp8Config, which refuses it;
    'W4A16_MXFP4' holds "FP4", so it builds ModelOptFp4Config, which refuses it (modelopt_quant.py from_config)."""
    r = _refused(engine_loads, name)
    if ENGINE == "vllm":
        assert "ModelOpt currently only supports:" in r["error"] and "quantizations in vLLM" in r["error"], r
        assert "MXFP4'" not in r["error"].split("supports:", 1)[1].split("]", 1)[0], r["error"]
    elif "w4a16" in name:
        assert r["error"] == ("ValueError: ModelOpt currently only supports: FP8, NVFP4, NVFP4_AWQ, W4A16_NVFP4 "
                              "quantizations in sglang. Please check the quantization config for your model's "
                              "configuration."), r
    else:
        assert r["error"].startswith("ValueError: ModelOptFp8Config only supports regular FP8 quantization, but "
                                     "found 'mxfp4'"), r


@pytest.mark.skipif(ENGINE != "sglang", reason="vLLM loads it: served (serving_tests/differential.py, its CT MXFP4 MoE method)")
@pytest.mark.parametrize("name", ["llmc-qwen3-moe-mxfp4a16", "llmc-mixtral-mxfp4a16"])
def test_sglang_cannot_load_the_compressed_tensors_mxfp4a16_source_itself(engine_loads, name):
    """llm-compressor 0.14's MXFP4A16 scheme quantises every Linear (attention too): SGLang 0.5.23's compressed-tensors
    lookup has no MXFP4 weight-only linear scheme (compressed_tensors.py `_get_scheme_from_parts`)."""
    r = _refused(engine_loads, name)
    assert r["error"] == "NotImplementedError: No compressed-tensors compatible scheme was found.", r
    assert "get_linear_scheme" in r["traceback"] and "_get_scheme_from_parts" in r["traceback"], r["traceback"]


@pytest.mark.skipif(ENGINE != "sglang", reason="vLLM loads it with the keys: served (serving_tests/differential.py)")
def test_sglang_cannot_load_the_llm_compressor_deepseek_v3_even_with_its_keys(engine_loads):
    """llm-compressor 0.14's DeepSeek-V3 NVFP4A16 with the keys validate asks for (the differential case's `release-keys`
    edit): SGLang 0.5.23's DeepSeek loader fuses q_a_proj and kv_a_proj_with_mqa by concatenating each tensor of the
    pair (deepseek_weight_loader.py do_load_weights), the two [1] weight_global_scale too, which the fused layer's
    [1] parameter refuses (linear.py weight_loader)."""
    r = _refused(engine_loads, "llmc-deepseek-v3-with-keys")
    assert r["error"].startswith("AssertionError: param.shape=torch.Size([1])") and \
        "loaded_weight.shape=torch.Size([2])" in r["error"], r
    assert "do_load_weights" in r["traceback"] and "linear.py" in r["traceback"], r["traceback"]


def test_no_engine_serves_fp4_experts_pruned_per_layer(engine_loads):
    """A Qwen3-MoE compressed-tensors NVFP4 replica whose layer 0 lost an expert to per-layer pruning (differential.py's
    `pruned` edit: `approximate_experts`). vLLM builds SubstitutedRoutedExperts and refuses quantised experts; SGLang
    names neither field anywhere, so it builds every expert and its loader skips what it has no parameter for: the
    load 'succeeds' with an expert that has no weights (core/targets/engine_config.py _PRUNED quotes both)."""
    if ENGINE == "vllm":
        r = _refused(engine_loads, "pruned")
        assert "expert substitution does not support: quantized MoE weights" in r["error"], r
        return
    import sglang

    r = engine_loads["pruned"]
    assert r.get("loaded"), r  # nothing refused it: the pruned expert is silently empty
    root = Path(sglang.__file__).parent
    readers = [p for p in root.rglob("*.py") if "approximate_experts" in p.read_text(errors="ignore")
               or "expert_substitution" in p.read_text(errors="ignore")]
    assert not readers, f"SGLang now reads per-layer pruning ({readers}): revisit engine_config.py _PRUNED"


@pytest.mark.parametrize("name", ["modelopt-deepseek-v3-nvfp4", "llmc-deepseek-v3-nvfp4a16"])
def test_neither_engine_builds_the_producers_deepseek_v3_config(engine_loads, name):
    """Both producers save DeepSeek-V3 through transformers 5, whose config has no moe_layer_freq, topk_method or
    scoring_func (core/targets/engine_config.py quotes what each engine reads; validate's source.engine_config says so)."""
    r = _refused(engine_loads, name)
    if ENGINE == "vllm":
        assert r["error"] == "KeyError: 'layers.0.mlp.gate.e_score_correction_bias'", r
    else:
        assert r["error"] == "AttributeError: 'DeepseekV3Config' object has no attribute 'moe_layer_freq'", r
        assert "_is_layer_sparse" in r["traceback"], r["traceback"]


@pytest.mark.parametrize("family", ["minimax-m3", "minimax-m3-vl"])
def test_minimax_m31_experts_are_built_as_mxfp8_by_the_release(engine_loads, family):
    """MiniMax-M3.1's block (`quant_method: mxfp8`, `moe_quant_algo: NVFP4`, compressed-tensors expert tensors).
    SGLang 0.5.23: QUANTIZATION_METHODS maps 'mxfp8' to Fp8Config (use_mxfp8), whose MoE method holds MXFP8 experts;
    MiniMaxM3Nvfp4Config (its M3.1 method) is built only for `--quantization minimax_m3_nvfp4`. vLLM 0.33.0:
    ModelOptMxFp8Config.from_config keeps no moe_quant_algo, so the experts get ModelOptMxFp8FusedMoE. Either way
    the packed NVFP4 `weight_packed` bytes (two codes a byte) do not fit the MXFP8 parameter; the expert loader raises.
    vLLM 0.34.0 loads it (its differential case passes): skipped there."""
    reason = next((r for r in REFUSED if (r.family, r.source_format, r.engine) == (family, "nvfp4-ct-mxfp8", RELEASE)), None)
    if reason is None or not reason.proof.endswith("::test_minimax_m31_experts_are_built_as_mxfp8_by_the_release"):
        pytest.skip(f"{RELEASE} loads it, or fails it for another reason (core/targets/served.py REFUSED says which)")
    r = _refused(engine_loads, f"{family}-nvfp4-ct-mxfp8")
    assert r["error"].startswith("RuntimeError: The size of tensor a") and "must match the size" in r["error"], r
    assert "weight_loader" in r["traceback"], r["traceback"]
    if ENGINE == "sglang":
        assert "_load_w13" in r["traceback"], r["traceback"]


@pytest.mark.skipif(RELEASE != "vllm 0.33", reason="vLLM 0.34.0 builds it (its differential case passes)")
@pytest.mark.parametrize("fmt", ["nvfp4-modelopt-hf", "nvfp4-ct-mxfp8"])
def test_vllm_033_cannot_build_the_minimax_m3_text_model(engine_loads, fmt):
    """vLLM 0.33.0's MiniMaxM3 attention reads `config.rope_theta` (and `partial_rotary_factor`), set only by its own
    MiniMaxM3TextConfig (a VL checkpoint's text_config); the text-only config is transformers' (model_type
    minimax_m2), which keeps both in `rope_parameters`."""
    r = _refused(engine_loads, f"minimax-m3-{fmt}")
    assert r["error"] == "AttributeError: 'MiniMaxM2Config' object has no attribute 'rope_theta'", r
    assert "minimax_m3/nvidia/model.py" in r["traceback"], r["traceback"]


@pytest.mark.skipif((ENGINE, VERSION) != ("sglang", "0.5.23"), reason="core/targets/served.py REFUSED: SGLang 0.5.23")
def test_sglang_has_no_qwen4_exp_text_model(engine_loads):
    """Qwen4ExpForCausalLM: SGLang 0.5.23 registers Qwen4ExpForConditionalGeneration alone (models/qwen4_exp.py
    `EntryClass = [Qwen4ExpForConditionalGeneration]`; its MTP draft is Qwen4ExpForCausalLMMTP)."""
    r = _refused(engine_loads, "qwen4-exp-text")
    assert r["error"] == ("ValueError: Qwen4ExpForCausalLM has no SGlang implementation and the Transformers "
                          "implementation is not compatible with SGLang."), r


@pytest.mark.skipif((ENGINE, VERSION) != ("sglang", "0.5.23"), reason="core/targets/engine_config.py: SGLang 0.5.23")
def test_sglang_cannot_load_qwen4_exp_nvfp4_ple_tables(engine_loads):
    """Qwen3.8-Flash-Next with NVFP4 n-gram tables (per-shard packed `weight` and `weight_scale`): SGLang 0.5.23 builds a
    PLE table BF16 or FP8 only (models/qwen4_exp.py _ple_table_is_fp8) and copies each `shard_<i>.weight` into it
    (load_qwen4_exp_ple_shard); the packed rows are half as wide as the table (RuntimeError)."""
    r = _refused(engine_loads, "qwen4-exp-ple-nvfp4")
    assert r["error"] == ("RuntimeError: The size of tensor a (16) must match the size of tensor b (8) at "
                          "non-singleton dimension 1"), r  # the replica's 16 columns, packed into 8 bytes
    assert "load_qwen4_exp_ple_shard" in r["traceback"] and "copy_ple_rows_to_tp_embedding" in r["traceback"], r


@pytest.mark.skipif(not NO_KIMI_K31, reason="vLLM 0.34 builds Kimi-K3.1 (test_differential.py proves Kimi-K3)")
def test_engine_has_no_kimi_k31_architecture(engine_loads):
    """vLLM 0.33.0: its config lookup has no model_type kimi_k31 (nor its registry KimiK31ForConditionalGeneration), so
    ModelConfig refuses the checkpoint before any model is built. SGLang 0.5.23: neither its config registry nor its
    model classes know kimi_k31 / KimiK31ForConditionalGeneration. core/targets/engine_config.py quotes both."""
    from importlib import import_module

    r = _refused(engine_loads, "kimi-k31")
    if ENGINE == "vllm":
        registry = import_module("vllm.model_executor.models.registry")
        assert "KimiK31ForConditionalGeneration" not in registry._VLLM_MODELS, "vLLM 0.33 has Kimi-K3.1 now"
        assert "model type `kimi_k31` but Transformers does not recognize this architecture" in r["error"], r
    else:
        assert "kimi_k31" in r["error"] or "KimiK31ForConditionalGeneration" in r["error"], r


@pytest.fixture(scope="module")
def kimi_k3_on_sglang(tmp_path_factory, case_dir):
    """The Kimi-K3 replicas on SGLang 0.5.23 (harness_kimi_k3.py): the NVFP4 source loaded by SGLang's own loader, and
    the MXFP4 conversion built (its routed experts' method); one spawned rank."""
    from differential import make_case

    tmp = tmp_path_factory.mktemp("kimi-k3")
    nvfp4 = make_source(case_dir, Case("kimi-k3", "nvfp4-ct", edit="h512"))
    mxfp4_src, mxfp4_conv = make_case(case_dir, Case("kimi-k3", "mxfp4-ct", edit="h512"), ENGINE, "bfloat16",
                                      allow_unservable=True)
    cases = {"nvfp4-source": {"source": str(nvfp4), "converted": None, "dtype": "bfloat16", "fmt": "nvfp4-ct"},
             "mxfp4-conversion": {"source": str(mxfp4_src), "converted": str(mxfp4_conv), "dtype": "bfloat16",
                                  "fmt": "mxfp4-ct"}}
    (result,) = spawn_ranks("harness_kimi_k3:run", {"cases": cases}, tmp, world=1)
    return result


@pytest.mark.skipif(ENGINE != "sglang", reason="core/targets/served.py REFUSED: SGLang 0.5.23 x kimi-k3 nvfp4-ct")
def test_sglang_cannot_load_the_compressed_tensors_nvfp4_kimi_k3_source_itself(kimi_k3_on_sglang):
    """SGLang 0.5.23 models/kimi_k3.py load_weights renames every checkpoint `weight_packed` to `weight` ("compressed-
    tensors MXFP4 stores as weight_packed; Mxfp4MoEMethod uses weight"), but its compressed-tensors NVFP4 MoE scheme
    names the experts' parameters `w13_weight_packed` / `w2_weight_packed`, and the loader skips an expert name that is
    not a parameter ("Skip experts of layers outside a truncated config"): the experts' FP4 weights are never loaded,
    silently (their block scales are)."""
    r = kimi_k3_on_sglang["nvfp4-source"]
    assert "error" not in r, r.get("traceback", r)
    packed = {n: v for n, v in r["nonzero"].items() if n.endswith(("w13_weight_packed", "w2_weight_packed"))}
    scales = {n: v for n, v in r["nonzero"].items() if n.endswith(("w13_weight_scale", "w2_weight_scale"))}
    assert packed and set(packed.values()) == {0}, f"SGLang loads the NVFP4 experts now ({packed}): refusal stale"
    assert scales and all(scales.values()), scales  # the walk: the same load does write the scales


@pytest.mark.skipif(ENGINE != "sglang", reason="core/targets/served.py REFUSED: SGLang 0.5.23 x kimi-k3 mxfp4-ct")
def test_sglang_kimi_k3_bypasses_the_plugins_moe_method_for_mxfp4(kimi_k3_on_sglang):
    """SGLang 0.5.23 models/kimi_k3.py KimiK3MoE: "For MXFP4 compressed-tensors on non-NPU, replace quant_config with
    Mxfp4Config", whenever `"mxfp4" in quant_config.quant_format`; the plugin's config answers the inner compressed-
    tensors config's fields (serving/plugin_config.py), so the routed experts get SGLang's own Mxfp4MoEMethod and never
    the plugin's: the Marlin-packed experts cannot be loaded into it."""
    r = kimi_k3_on_sglang["mxfp4-conversion"]
    assert "error" not in r, r.get("traceback", r)
    assert r["config"] == "SglangMarlinFp4Config", r  # the plugin's config was built for the model...
    assert r["methods"] and set(r["methods"].values()) == {"Mxfp4MoEMethod"}, r  # ...and bypassed for the experts


@pytest.mark.skipif(ENGINE != "sglang", reason="core/targets/served.py REFUSED: SGLang 0.5.23 x glm5-next")
def test_sglang_has_no_glm5_next_text_model(engine_loads):
    """A GLM-5.3-Flash text checkpoint (architectures [Glm5NextForCausalLM]): SGLang 0.5.23's glm5_next.py registers
    only Glm5NextForConditionalGeneration (`EntryClass`); its registry falls back to the Transformers backend, which
    has no such model either."""
    r = _refused(engine_loads, "glm5-next")
    assert r["error"].startswith("ValueError: Cannot find model module. 'Glm5NextForCausalLM' is not a registered model "
                                 "in the Transformers library"), r

