"""The differential proof: for each case of serving_tests/differential.py (family x source format) and the
engine of this venv (vLLM or SGLang, found by distribution), the engine builds the whole model twice with
its own construction under the model's dtype (bf16; fp16 where the case lists it): once from the source
checkpoint through the engine's own quantisation method, once from the plugin's conversion of it; both
are loaded by the model's own `load_weights` and processed by `process_weights_after_loading`. Every
parameter and buffer must then exist in both, with the same dtype, shape and bytes: the experts (weights,
block scales, global and input scales) and every other layer.

CPU substitutions (each replaces one engine step that cannot run on a CPU, with the project's byte-exact
equivalent; nothing else is changed):
- vLLM and SGLang: the CUDA op `gptq_marlin_repack` (the engines' own repack of the source's experts)
  -> the project's `to_marlin_weight` (formats/marlin/weight.py), pinned to both engines' bytes by the
  golden cases (tests/formats/test_golden.py, /work/shared/golden made by the engines on a GPU).
- vLLM: `ops.scaled_fp8_quant` with a static per-tensor scale (the CUDA op `static_scaled_fp8_quant`, which
  FP8 linear processing calls to requantise a fused layer's shards to one scale: Qwen3.5's ModelOpt FP8
  `in_proj_qkvz`, `qkv_proj`) -> vLLM's own torch path for it, `QuantFP8.forward_native`; the same FP8
  method processes those layers in both models.
- vLLM: `dispatch_cpu_unquantized_gemm` -> nothing: the CPU platform's packing of unquantised linear and
  embedding weights for its own GEMM (on a CUDA GPU those methods keep the weights as loaded).
- vLLM: `VLLM_TARGET_DEVICE=cpu`; the Marlin MoE experts' device check -> True (`--moe-backend marlin`,
  the documented sm_120 launch); vLLM's own `EmulationNvFp4LinearKernel` listed for the CPU platform
  (vLLM lists no NVFP4 linear kernel there: "Failed to find a kernel"), so NVFP4 dense / shared-expert
  layers are created, loaded and processed by vLLM's own code; they are the same method in both models.
- vLLM: weight-only FP4 dense layers (ModelOpt W4A16_NVFP4, compressed-tensors NVFP4A16): vLLM forces its Marlin
  FP4 linear kernel, whose availability check (`is_fp4_marlin_supported`, a CUDA GPU) answers as on the sm_120
  GPU, and its Marlin MXFP4 linear kernel is listed for the CPU platform (serving_tests/vllm/harness_models.py
  `_marlin_fp4_linear_runs_here`); their processing is vLLM's own, the same method in both models.
- The producers' cases (`Case.producer`): the source is a real ModelOpt / llm-compressor export
  (tests/fixtures/producers), copied unchanged, not a synth replica.
- SGLang: serving_tests/sglang/harness_differential.py lists its own (the platform override, the Marlin
  workspace, the rotary embedding's CPU branch, the GPU generation asked by compressed-tensors).
- The MLA families (DeepSeek-R1/V3/V3.2, Kimi-K2): vLLM: the CPU's AMX detection -> False (its reference CPU
  GEMM and CPU_MLA backend instead of AMX kernels whose ops the wheel lacks on CPU) and V3.2's sparse-MLA
  kernel lookup -> the dense CPU_MLA backend ("Sparse Attention is not supported on CPU."); SGLang: the rotary
  embedding's accelerator lookup -> "cpu" (YaRN's cos/sin cache). serving_tests/{vllm,sglang}/mla_cpu.py; the
  same stand-in in both models, never a compared tensor. vLLM, a quantised `kv_b_proj` (llm-compressor's
  DeepSeek-V3): the CUDA op `marlin_gemm`, which MLA's weight processing runs on an identity matrix to dequantise it,
  -> the project's emulation of that product (validate/emulate.py); the same engine method and bytes in both
  models, so W_UK / W_UV are compared as the engine processes them.
- vLLM: the torchvision stand-in (serving_tests/stubs) also on the spawned ranks' PYTHONPATH: vLLM inspects a
  multimodal wrapper's class (Qwen3.5, Llama-4, Gemma-4) in a subprocess that imports transformers' image
  processors; no multimodal code runs. Those wrappers are built text-only (`text_only` cases: vLLM's own
  `--language-model-only`), since their replicas hold no vision tensors.
- Nemotron-H (non-gated relu2 experts): vLLM's `FusedMoEConfig` platform check for a non-gated MoE (CUDA, XPU,
  ROCm only) -> the CUDA answer, the served target's (serving_tests/vllm/nemotron_cpu.py); its Mamba-2 layers
  are built and loaded by both engines' own code (no kernel runs at load on CPU).
- DeepSeek-V4 (vLLM): the model class is the one a CUDA user gets, `models/deepseek_v4/nvidia/model.py`'s
  DeepseekV4ForCausalLM; on the CPU platform vLLM's registry would give its CPU model (`models/deepseek_v4/cpu`),
  a different model (its own attention class and weights mapper). While it is built, loaded and processed: the
  device capability -> 12.0 (sm_120; it picks the attention class, FlashInfer's SM120 sparse MLA, whose
  FlashInfer specialisation lookup -> present), `torch.cuda.Stream` / `Event` -> placeholders (scheduling of its
  attention's input GEMMs), and the FP8 block-linear kernel lookup (attention, shared experts) -> vLLM's sm_120
  choice, CUTLASS block FP8, whose weight processing is torch code (on CPU vLLM lists only AMX kernels).
  serving_tests/vllm/dsv4_cpu.py; the same stand-ins in both models, never a compared tensor.
- DeepSeek-V3.2 and GLM-5.x (vLLM): the CUDA DSA class (`models/deepseek_v32/nvidia/model.py`), built under the
  same capability stand-in as DeepSeek-V4's (serving_tests/vllm/dsv4_cpu.py).
- DeepSeek-V4 (SGLang): the mHC kernels' JIT warm-up at the end of `load_weights` -> nothing (it asks the CUDA
  SM count and runs kernels on dummy inputs). serving_tests/sglang/dsv4_cpu.py.
- DeepSeek-V4.1 (vLLM; serving_tests/vllm/dsv41_cpu.py, each with its reason): the CUDA model class and sm_120 as
  for V4; the `deepseek_v4_fp8` config class CUDA builds (the V4.1 one; the CPU platform imports V4's, which builds
  plain fp8 for model_type deepseek_v41); the MXFP8 linear kernel -> vLLM's own EmulationMxfp8LinearKernel (sm_120
  runs Marlin MXFP8 for the 32x32 dense linears, a CUDA repack; its pick for the grouped wo_a BMM is this kernel);
  the Engram tables built with `--engram-config '{"cpu_offload": false}'` (host offload pins memory, CUDA only);
  the device index 0 and an sm_120 SM count (188) while it is built. SGLang builds it with the server's model and
  tokenizer path set (both engines' Engram hash reads the tokenizer). The same in both models, never a compared
  tensor but the dense MXFP8 linears, which both models process with the same emulation kernel.
- MiniMax-M3 / M3.1 (vLLM 0.34): the CUDA model class (`models/minimax_m3/nvidia`, the registry's pick off ROCm); its
  MLP asks the CuTe DSL module `ops/dense_gemm1_mxfp8` (it imports `cutlass`, CUDA only) whether a fused MXFP8 GEMM
  replaces gate_up_proj + activation: that module answers as on sm_120 (`can_fuse_gemm1` False: the shipped function
  requires capability family 100), the `ops` package registered without its `__init__` (a CuTe DSL kernel import).
  serving_tests/vllm/minimax_m3_cpu.py; the fused kernel owns no parameter. vLLM 0.33 needs no stand-in. M3.1's MXFP8
  attention and shared experts get vLLM's own EmulationMxfp8LinearKernel, as DeepSeek-V4.1's (dsv41_cpu.py): the same
  method and kernel in both models.
- DeepSeek-V4's synth replica has sliding-window layers only (config `compress_ratios` 0, as Flash's first two):
  no compressor or indexer is built (vLLM's compressor takes head sizes 512 / 128 only, beyond synth's shrunk dims).
- Qwen3.8-Flash-Next (vLLM 0.33.0): its QSA attention's build-time FlashAttention check -> the CUDA answer
  (serving_tests/vllm/qwen4_exp_cpu.py; the implementation object owns no parameter), and the QSA indexer's per-token
  top-k scratch buffer (torch.empty, non-persistent, written by a forward pass) compared by dtype and shape only
  (serving_tests/differential_state.py SCRATCH); the same in both models.
- Kimi-K3 (vLLM; serving_tests/vllm/kimi_k3_cpu.py, each with its reason): vLLM's own GEMM + all-reduce switch off
  (`VLLM_KIMI_K3_GEMM_AR=0`: its cute_dsl kernels), prefix caching off (as GLM-5.3-Flash below: a hybrid MLA model),
  the CUDA stream placeholders of DeepSeek-V4's stand-in.
- GLM-5.3-Flash (vLLM): built with vLLM's own `--no-enable-prefix-caching` (serving_tests/vllm/glm5next_cpu.py: the
  hybrid hook sets `mamba_block_size` for prefix caching, which the CPU platform then turns off for an MLA model, and
  VllmConfig refuses the pair); SGLang: the engine's fused KDA projections (it fuses them for the ModelOpt source's
  config, not for the plugin's) compared split into the plugin's unfused modules (serving_tests/sglang/
  harness_kda_split.py). No KDA, mHC or indexer kernel runs at load on CPU.
- One spawned gloo rank (TP 1); tiny models (synth's shrunk sizes).
What no CPU runs: any forward pass; the GPU suite (tests/gpu) runs the engines' kernels on these bytes.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from common import installed_engine, spawn_ranks
from differential import CASES, make_case
from differential_state import scratch_bytes

ENGINE = installed_engine()
if ENGINE is None:
    pytest.skip("no engine installed (run serving_tests/run.sh)", allow_module_level=True)
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
sys.path.insert(0, str(Path(__file__).parent / ENGINE))  # the engine's harness_differential

def _refused_here(case) -> bool:
    """The installed release itself cannot load this source (core/targets/served.py REFUSED; its own test node in
    serving_tests/test_engine_refusals.py shows the engine's reason): no differential proof runs for it."""
    import importlib.metadata

    from dsv4_convert.core.targets.served import REFUSED, engine_key

    key = engine_key(ENGINE, importlib.metadata.version(ENGINE))
    return any((r.family, r.source_format, r.engine) == (case.family, case.fmt, key) for r in REFUSED)


RUNS = [(case, dtype) for case in CASES if ENGINE in case.engines and not _refused_here(case) for dtype in case.dtypes]
IDS = [f"{case.id}-{dtype}" for case, dtype in RUNS]


@pytest.fixture(scope="module")
def results(tmp_path_factory, case_dir, request):
    """Every selected case in one spawned rank (the engine import dominates the run time)."""
    tmp = tmp_path_factory.mktemp("differential")
    selected = {item.callspec.params.get("case") for item in request.session.items if hasattr(item, "callspec")}
    cases = {}
    for (case, dtype), case_id in zip(RUNS, IDS):
        if case_id not in selected:
            continue
        src, conv = make_case(case_dir, case, ENGINE, dtype)
        cases[case_id] = {"source": str(src), "converted": str(conv), "dtype": dtype, "fmt": case.fmt,
                          "text_only": case.text_only}
    t0 = time.monotonic()
    out = spawn_ranks("harness_differential:run", {"cases": cases}, tmp, world=1)[0]
    print(f"\n[differential] {ENGINE}: {len(cases)} cases built twice in {time.monotonic() - t0:.0f} s")
    return out


# Parameters the engine's own method creates that hold nothing (never loaded, never read by the Marlin
# kernel; their bytes are whatever torch.empty gave): the plugin does not create them.
UNINITIALISED = {
    # SGLang's ModelOptNvFp4FusedMoEMethod.create_weights swizzles the still-empty block scales for its
    # FlashInfer/CUTLASS kernels; its Marlin branch of process_weights_after_loading never touches them
    "sglang": ("w13_blockscale_swizzled", "w2_blockscale_swizzled"),
}


# parts a family's proof must compare (a model that dropped them would compare the rest and pass): DeepSeek-V4.1's
# Engram tables, vision tower and routed experts, in each engine's own parameter names
# Engram tables, vision tower and routed experts; Qwen3.8-Flash-Next's PLE n-gram tables (FP8 / NVFP4 / BF16 rows, the
# storage the conversion's `ple_embedding_dtype` names), hyper-connections and routed experts
_QWEN4_EXP = ("ple_embedding.ngram_embedding.weight", "hyper_connection", "experts.w13_weight")
MUST_COMPARE = {"deepseek-v41": ("engram.embed", "vision.", "aligner.", "experts.w13_weight"),
                # Kimi-K3: the routed experts (latent width), the latent projections, KDA's and MLA's attention
                "kimi-k3": ("experts.w13_weight", "experts.w2_weight_scale", "routed_expert_up_proj", "A_log",
                            "kv_b_proj"),
                # GLM-5.3-Flash: the KDA layer (its short convolutions, A_log), mHC, the kpool indexer, the experts
                **{f: ("conv1d", "A_log", "hc_attn_fn", "index_kpool_compress_gate", "experts.w13_weight")
                   for f in ("glm5-next", "glm5-next-vl")},
                **dict.fromkeys(("qwen4-exp", "qwen4-exp-text", "qwen4-exp-nvfp4", "qwen4-exp-ple-nvfp4"), _QWEN4_EXP),
                # MiniMax-M3 / M3.1: the routed experts, the quantised shared experts and attention (their block
                # scales: FP8 / NVFP4 in nvidia's MIXED_PRECISION, MXFP8 in M3.1) and the F32 router (both engines' names)
                **{f: ("experts.w13_weight", "shared_experts.gate_up_proj.weight_scale", "qkv_proj.weight_scale",
                       "gate.weight") for f in ("minimax-m3", "minimax-m3-vl")}}


@pytest.mark.parametrize("case", IDS)
def test_plugin_load_equals_the_engines_load_of_the_source(results, case):
    r = results[case]
    assert "error" not in r, r.get("traceback", r)
    assert r["compared"] > 0
    family = next(c.family for c, dtype in RUNS if f"{c.id}-{dtype}" == case)
    missing = [part for part in MUST_COMPARE.get(family, ()) if not any(part in n for n in r["compared_names"])]
    assert not missing, f"no compared parameter holds {missing}: {r['compared_names']}"
    empty = UNINITIALISED.get(ENGINE, ())
    problems = [f"only the engine's model has {n}" for n in r["only_engine"] if n.rsplit(".", 1)[-1] not in empty]
    problems += [f"only the plugin's model has {n}" for n in r["only_plugin"]]
    problems += [f"{name}: {what}" for name, what in r["differ"].items() if not scratch_bytes(ENGINE, name, what)]
    assert not problems, "\n".join(problems)
