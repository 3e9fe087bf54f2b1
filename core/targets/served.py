"""The one table of what the serving plugins are proven to load: family x source format x engine version.

An entry is servable exactly when its proof exists and passes: each entry names the serving_tests
node ids that load that family's converted checkpoint through the plugin with that engine version's own
code. The converter's gate (`convert.unservable_family`), validate's pre-flight (`marlin.serving_methods`),
`plan`, `doctor` and the README's support matrix all read this table and nothing else. A family, format or
engine version without an entry is not served, whatever its architecture string says; a checkpoint whose
architecture is in no family is not served either.

`methods` are the methods (core/targets/inner_methods.py names) the engine built for the non-expert layers in
that proof: a source of the same family and format whose quantisation block resolves to another method
(ModelOpt MIXED_PRECISION where the proof had NVFP4) is not proven, so it is refused too.

serving_tests/conftest.py fails an engine's run when a proof of an entry for that engine version is
collected and does not pass; tests/core/test_served.py checks that every entry names a test that exists
and every proof case (serving_tests/families.py CASES) has its entry. Pure: no engine import.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..sources.families import Family, family_of
from .engine_config import source_load_refusal
from .engines import EngineError, engine_inner_method, release_for
from .inner_methods import stale_block
from .minimax_m3 import MINIMAX_M3_FORMATS, MINIMAX_M3_REFUSED
from .refusals import Refused, producer_refusals

__all__ = ["Served", "SERVED", "Refused", "REFUSED", "ENGINE_VERSIONS", "engine_key", "entries", "source_block", "inner_method",
           "refusal"]

# the engine releases the serving proofs run under (serving_tests/locks), by core/targets/engines.py release key
# ("<engine> <series>"); a release without rows here (vLLM 0.34 until its proofs run) serves nothing
ENGINE_VERSIONS = ("sglang 0.5.23", "vllm 0.33", "vllm 0.34")  # the releases whose proofs ran: serving_tests/run.sh --matrix


def engine_key(engine: str, version: str) -> str:
    """The release key of an installed `version` ("0.33.0" -> "vllm 0.33", core/targets/engines.py release_for); the
    version itself when no release of the engine table covers it (then nothing is served on it)."""
    try:
        return release_for(engine, version).key
    except EngineError:
        return f"{engine} {version}"


def _engine_of(key: str) -> str:
    return key.split(" ", 1)[0]


@dataclass(frozen=True)
class Served:
    """One proven combination. `proofs`: the serving_tests node ids, each run in that engine version's venv."""
    family: str           # core/sources/families.py FAMILIES name
    source_format: str    # core/checkpoint/tensor_model.py SourceFormat value of the converted source
    engine: str           # release key: "vllm 0.33"
    methods: frozenset    # the engine's methods for the non-expert layers that the proof loaded
    proofs: tuple[str, ...]

    @property
    def engine_name(self) -> str:
        return _engine_of(self.engine)

    @property
    def version(self) -> str:
        return self.engine.split(" ", 1)[1]


_FAM = "serving_tests/test_families.py::"
_DIFF = "serving_tests/test_differential.py::test_plugin_load_equals_the_engines_load_of_the_source"


def _differential(family: str, fmt: str, dtype: str = "bfloat16") -> str:
    """The differential proof (serving_tests/differential.py CASES): the engine builds the whole model under the
    model's dtype twice, the source loaded by its own method and the conversion by the plugin; every parameter
    equal in name, dtype, shape and bytes."""
    return f"{_DIFF}[{family}-{fmt}-{dtype}]"


def _whole_model(family: str, fmt: str) -> tuple[str, ...]:
    """The whole-model load of serving_tests/test_families.py (both tests, the case id `family-fmt`)."""
    return tuple(f"{_FAM}{t}[{family}-{fmt}]" for t in (
        "test_non_expert_layers_get_the_engines_own_methods",
        "test_routed_experts_get_the_plugin_method_and_every_tensor_a_parameter"))


def _dsv4(engine: str, case: str) -> tuple[str, ...]:
    return (f"serving_tests/{engine}/test_{engine}_plugin.py::test_tp2_plugin_params_byte_equal_engine[{case}]",
            "serving_tests/test_plugin_config.py::test_config_builds_the_engines_own_config_for_dsv4_fp8")


def _gpt_oss(engine: str) -> tuple[str, ...]:
    return (f"serving_tests/{engine}/test_{engine}_gpt_oss.py::test_gpt_oss_plugin_byte_equal_{engine}_gpt_oss_marlin",)


def _method(engine: str, block: dict, model_type: str) -> frozenset:
    """The engine's own name of the method it builds from `block` (core/targets/inner_methods.py): DeepSeek-V4's block
    FP8 is `deepseek_v4_fp8` in vLLM and `fp8` in SGLang, gpt-oss's `gpt_oss_mxfp4` / `mxfp4`."""
    return frozenset({engine_inner_method(engine, block, model_type)})


def _refused(family: str, fmt: str, key: str) -> bool:
    """The engine release itself refuses this family x format (REFUSED): it gets no row."""
    return any((r.family, r.source_format, r.engine) == (family, fmt, key) for r in REFUSED)


_MIXED = {"sglang 0.5.23": ("modelopt_mixed",)}  # releases proven with Qwen3-MoE's MIXED_PRECISION export


def _rows(key: str) -> tuple[Served, ...]:
    e = _engine_of(key)
    dsv4_fp8 = _method(e, {"quant_method": "fp8", "weight_block_size": [128, 128]}, "deepseek_v4")
    return (
        # the whole model (vLLM: the CUDA DeepSeek-V4 class), then the layer-level proof (TP 2, the engine's MoE layer)
        Served("deepseek-v4", "mxfp4-dsv4", key, dsv4_fp8,
               (_differential("deepseek-v4", "mxfp4-dsv4"), *_dsv4(e, "ckpt-mxfp4-bf16-tp2"))),
        Served("deepseek-v4", "nvfp4-modelopt-dsv4", key, dsv4_fp8,
               (_differential("deepseek-v4", "nvfp4-modelopt-dsv4"), *_dsv4(e, "ckpt-nvfp4-bf16-tp2"))),
        # DeepSeek-V4.1 (Engram, vision tower, DSpark stages copied as they are): its 32x32 FP8 block; the plugin's
        # config answers the inner config's fields, which V4.1's loader reads (weight_block_size)
        Served("deepseek-v41", "mxfp4-dsv4", key,
               _method(e, {"quant_method": "fp8", "weight_block_size": [32, 32], "expert_dtype": "fp4"}, "deepseek_v41"),
               (_differential("deepseek-v41", "mxfp4-dsv4"),
                "serving_tests/test_draft_differential.py::test_plugin_draft_equals_the_engines_draft_of_the_source"
                "[deepseek-v41-mxfp4-dsv4-bfloat16]",  # the DSpark draft (mtp.0-2, its own expert count)
                "serving_tests/test_plugin_config.py::test_config_answers_the_inner_configs_fields_for_dsv41")),
        Served("gpt-oss", "mxfp4-gptoss", key, _method(e, {"quant_method": "mxfp4"}, "gpt_oss"),
               (_differential("gpt-oss", "mxfp4-gptoss-kv-heads"), *_gpt_oss(e))),
        # also ModelOpt 0.47's W4A16_NVFP4 / NVFP4 MLP-only and llm-compressor 0.14's NVFP4A16 exports as written
        # (tests/fixtures/producers); on SGLang, Qwen3-30B-A3B's MIXED_PRECISION export (modelopt_mixed)
        Served("qwen3-moe", "nvfp4-modelopt-hf", key, frozenset({"modelopt_fp4", *_MIXED.get(key, ())}),
               (_differential("qwen3-moe", "nvfp4-modelopt-hf"), _differential("qwen3-moe", "nvfp4-modelopt-hf", "float16"),
                _differential("qwen3-moe", "nvfp4-modelopt-hf-2507"), *_whole_model("qwen3-moe", "nvfp4-modelopt-hf"),
                _differential("qwen3-moe", "nvfp4-modelopt-hf-modelopt-w4a16-nvfp4"),
                _differential("qwen3-moe", "nvfp4-modelopt-hf-modelopt-nvfp4-mlp-only"),
                *((_differential("qwen3-moe", "nvfp4-modelopt-hf-mixed-precision"),) if key in _MIXED else ()))),
        Served("qwen3-moe", "nvfp4-ct", key, frozenset({"compressed-tensors"}),
               (_differential("qwen3-moe", "nvfp4-ct"), *_whole_model("qwen3-moe", "nvfp4-ct"),
                _differential("qwen3-moe", "nvfp4-ct-llmc-nvfp4a16"))),
        # also the hf_quant_config.json-only source (test_no_block_in_config_json_builds_modelopt_fp4_...)
        Served("glm4-moe", "nvfp4-modelopt-hf", key, frozenset({"modelopt_fp4"}),
               (_differential("glm4-moe", "nvfp4-modelopt-hf"), *_whole_model("glm4-moe", "nvfp4-modelopt-hf"),
                f"{_FAM}test_no_block_in_config_json_builds_modelopt_fp4_from_hf_quant_config")),
        Served("glm4-moe", "nvfp4-ct", key, frozenset({"compressed-tensors"}),
               (_differential("glm4-moe", "nvfp4-ct-fused-globals"), *_whole_model("glm4-moe", "nvfp4-ct"))),
        # DeepSeek-R1 / R1-0528 FP4 (MLA, hf_quant_config.json only) and Kimi-K2 (model_type kimi_k2) replicas;
        # V3-0324-FP4 as shipped (stale block-FP8 config.json) is built as FP8 by the engines themselves
        # (test_v3_0324_as_shipped_is_built_as_block_fp8_by_the_engine_itself); its conversion serves from
        # hf_quant_config.json (`serves_from`), proven against the source without the stale block
        Served("deepseek-v3", "nvfp4-modelopt-hf", key, frozenset({"modelopt_fp4"}),
               (_differential("deepseek-v3", "nvfp4-modelopt-hf"), _differential("kimi-k2", "nvfp4-modelopt-hf"),
                _differential("deepseek-v3-0324", "nvfp4-modelopt-hf"),
                *_whole_model("deepseek-v3", "nvfp4-modelopt-hf"), *_whole_model("kimi-k2", "nvfp4-modelopt-hf"))),
        Served("deepseek-v32", "nvfp4-modelopt-hf", key, frozenset({"modelopt_fp4"}),
               (_differential("deepseek-v32", "nvfp4-modelopt-hf"), *_whole_model("deepseek-v32", "nvfp4-modelopt-hf"))),
        Served("minimax-m2", "nvfp4-modelopt-hf", key, frozenset({"modelopt_fp4"}),
               (_differential("minimax-m2", "nvfp4-modelopt-hf"), *_whole_model("minimax-m2", "nvfp4-modelopt-hf"))),
        *((Served("mixtral", "nvfp4-modelopt-hf", key, frozenset({"modelopt_fp4"}),
                  (_differential("mixtral", "nvfp4-modelopt-hf"), *_whole_model("mixtral", "nvfp4-modelopt-hf"))),)
          if not _refused("mixtral", "nvfp4-modelopt-hf", key) else ()),
        # llm-compressor 0.14's NVFP4A16 Mixtral, and its DeepSeek-V3 with the config keys the export lacks (validate's
        # fix; as written, engine_config.py refuses it)
        *(Served(f, "nvfp4-ct", key, frozenset({"compressed-tensors"}), (_differential(f, f"nvfp4-ct-llmc-nvfp4a16{e}"),))
          for f, e in (("mixtral", ""), ("deepseek-v3", "-release-keys")) if not _refused(f, "nvfp4-ct", key)),
        # llm-compressor 0.14's MXFP4A16 on vLLM (its CT MXFP4 MoE method never pads: engines.py _VLLM_CT_PAD)
        *(Served(f, "mxfp4-ct", key, frozenset({"compressed-tensors"}), (_differential(f, "mxfp4-ct-llmc-mxfp4a16"),))
          for f in ("qwen3-moe", "mixtral") if not _refused(f, "mxfp4-ct", key)),
    )


_GLM5_NEXT = (("nvfp4-modelopt-hf", "modelopt_fp4"), ("nvfp4-ct", "compressed-tensors"))  # its releases' formats
# (family, format, release) the engine refuses, e.g. SGLang's quantised-Mixtral model (fam-mla's row)
REFUSED: tuple[Refused, ...] = (
    *(Refused("mixtral", fmt, "sglang 0.5.23",
              "SGLang builds a quantised Mixtral as QuantMixtralForCausalLM for any quantization but fp8, "
              "compressed-tensors, gptq_marlin, awq_marlin and quark_int4fp8_moe (model_loader/utils.py "
              "get_model_architecture: 'Special handling for quantized Mixtral. FIXME(woosuk): This is a temporary "
              f"hack.'), with every expert its own linear layer: no fused MoE layer for the plugin's Marlin method{more}",
              f"serving_tests/test_families.py::test_sglang_refuses_mixtral_with_its_own_reason[{fmt}]")
      for fmt, more in (("nvfp4-modelopt-hf", ""), ("nvfp4-ct", " (the compressed-tensors source gets "
                                                     "MixtralForCausalLM; its conversion, marlin_fp4, does not)"))),
    Refused("llama4", "nvfp4-modelopt-hf", "sglang 0.5.23",
            "SGLang cannot load the ModelOpt source itself: mllama4.py _handle_expert_scale_params takes a stacked "
            "`experts.gate_up_proj_weight_scale` for a single scale for all experts (RuntimeError: expand)",
            "serving_tests/test_engine_refusals.py::test_sglang_cannot_load_the_modelopt_llama4_source_itself"),
    *(Refused("glm5-next", fmt, "sglang 0.5.23", "SGLang 0.5.23 registers no Glm5NextForCausalLM (glm5_next.py's "
              "EntryClass is [Glm5NextForConditionalGeneration] alone) and its Transformers fallback has none either: "
              "\"Cannot find model module. 'Glm5NextForCausalLM' is not a registered model in the Transformers library\"",
              "serving_tests/test_engine_refusals.py::test_sglang_has_no_glm5_next_text_model") for fmt, _ in _GLM5_NEXT),
    # Qwen3.8-Flash-Next's text class: SGLang registers the multimodal one alone (its NVFP4 n-gram tables, which SGLang
    # cannot load either, are core/targets/engine_config.py's: a fact of the checkpoint's tensors, not of its family)
    Refused("qwen4-exp-text", "nvfp4-modelopt-hf", "sglang 0.5.23",
            "SGLang 0.5.23 registers no Qwen4ExpForCausalLM: models/qwen4_exp.py's EntryClass is "
            "[Qwen4ExpForConditionalGeneration] alone ('Qwen4ExpForCausalLM has no SGlang implementation and the "
            "Transformers implementation is not compatible with SGLang.')",
            "serving_tests/test_engine_refusals.py::test_sglang_has_no_qwen4_exp_text_model"),
    *producer_refusals(ENGINE_VERSIONS),  # the real producers' outputs (core/targets/refusals.py)
    # Kimi-K3 on SGLang 0.5.23 (models/kimi_k3.py), each shown by serving_tests/test_engine_refusals.py
    Refused("kimi-k3", "nvfp4-ct", "sglang 0.5.23", "SGLang cannot load the compressed-tensors NVFP4 source itself: "
            "Kimi-K3's load_weights renames every `weight_packed` to `weight` (for Mxfp4MoEMethod), its NVFP4 MoE names "
            "them `w13_weight_packed`, and the loader skips the unknown name: the experts' weights never load",
            "serving_tests/test_engine_refusals.py::test_sglang_cannot_load_the_compressed_tensors_nvfp4_kimi_k3_source_itself"),
    Refused("kimi-k3", "mxfp4-ct", "sglang 0.5.23", "SGLang's KimiK3MoE bypasses the plugin's MoE method: \"For MXFP4 "
            "compressed-tensors on non-NPU, replace quant_config with Mxfp4Config\" (any config whose quant_format holds "
            "'mxfp4'): the experts get SGLang's Mxfp4MoEMethod, which cannot hold Marlin-packed experts",
            "serving_tests/test_engine_refusals.py::test_sglang_kimi_k3_bypasses_the_plugins_moe_method_for_mxfp4"),
    *MINIMAX_M3_REFUSED,  # MiniMax-M3 / M3.1 (core/targets/minimax_m3.py quotes the engines)
)


# fam-hybrid: (family, source format, the engines' method for the non-expert layers, the engine releases whose
# differential proof (serving_tests/differential.py CASES, bf16) passes)
_HYBRID = (
    ("qwen3.5-moe", "nvfp4-modelopt-hf", "modelopt_mixed"),
    ("qwen3.5-moe", "nvfp4-ct", "compressed-tensors"),
    ("qwen3-next", "nvfp4-modelopt-hf", "modelopt_fp4"),
    ("qwen3-next", "nvfp4-ct", "compressed-tensors"),
    ("llama4", "nvfp4-modelopt-hf", "modelopt_fp4"),  # not on SGLang 0.5.23: REFUSED says why
    ("gemma4-moe", "nvfp4-modelopt-hf", "modelopt_fp4"),
    # Nemotron-H / Nemotron-3-Nano: Mamba-2 + attention + non-gated relu2 experts (w13 = up_proj alone)
    ("nemotron-h", "nvfp4-modelopt-hf", "modelopt_fp4"),
    ("gemma4-moe", "nvfp4-ct", "compressed-tensors"),  # RedHatAI/gemma-4-26B-A4B-it-NVFP4
)


# issue 35's families (the newest releases' models), proven by their differential case alone, as _HYBRID's
_NEW_FAMILIES = (
    ("glm5-moe", "nvfp4-modelopt-hf", "modelopt_fp4"),  # GLM-5.x: V3.2's DSA model in vLLM, DeepseekV2 in SGLang
    ("kimi-k25", "nvfp4-modelopt-hf", "modelopt_fp4"),  # Kimi-K2.5 / K2.6: Kimi-K2's text model, served text-only
    # GLM-5.3-Flash (KDA + MLA, kpool indexer, mHC): both classes on vLLM 0.33 / 0.34, the VL one on SGLang (REFUSED)
    *((family, fmt, method) for family in ("glm5-next", "glm5-next-vl") for fmt, method in _GLM5_NEXT),
    # Kimi-K3 (KDA + MLA, latent MoE, SiTU; text-only). For the MXFP4 source vLLM's architecture hook swaps the block for
    # `mxfp4` (models/config.py KimiK3ForConditionalGenerationConfig: Mxfp4MoEMethod for its experts); the plugin's
    # non-expert layers get compressed-tensors (vLLM's walk on the recorded block), every one BF16 either way: the
    # proof compares them. SGLang 0.5.23 refuses both (REFUSED); K3.1's architecture: core/targets/engine_config.py
    *(("kimi-k3", fmt, "compressed-tensors") for fmt in ("mxfp4-ct", "nvfp4-ct")),
    # MiniMax-M3 / M3.1, text and VL (served text-only): core/targets/minimax_m3.py
    *((family, fmt, method) for family in ("minimax-m3", "minimax-m3-vl") for fmt, method in MINIMAX_M3_FORMATS),
)
_FIRST_CASE = {("kimi-k3", "mxfp4-ct"): "h512", ("kimi-k3", "nvfp4-ct"): "h512"}  # a family's first case, when edited


# further differential cases of a family (serving_tests/differential.py), named in its row after the first
# I = 192: SGLang pads non-gated experts at load; I = 96: written padded for TP 1 (the non-gated tile rule)
_MORE_PROOFS = {("nemotron-h", "nvfp4-modelopt-hf"): ("i192", "i96"),
                ("kimi-k25", "nvfp4-modelopt-hf"): ("nvidia-names",)}  # nvidia's `language_model.layers.*` excludes


# further replicas of a family (synth/families.py FamilySpec.name), each its own differential case, named in its row
_REPLICA_PROOFS = {("nemotron-h", "nvfp4-modelopt-hf"): ("nemotron-3-super",)}  # LatentMoE (moe_latent_size)


def _hybrid_rows(key: str) -> tuple[Served, ...]:
    return tuple(Served(family, fmt, key, frozenset({method}),
                        (_differential(family, "-".join(filter(None, (fmt, _FIRST_CASE.get((family, fmt)))))),
                         *(_differential(family, f"{fmt}-{edit}") for edit in _MORE_PROOFS.get((family, fmt), ())),
                         *(_differential(replica, fmt) for replica in _REPLICA_PROOFS.get((family, fmt), ()))))
                 for family, fmt, method in (*_HYBRID, *_NEW_FAMILIES) if not _refused(family, fmt, key))


def _qwen4_exp_rows(key: str) -> tuple[Served, ...]:
    """Qwen3.8-Flash-Next (synth/qwen4_exp.py, text-only): nvidia's MIXED_PRECISION release with FP8 n-gram tables and
    the plain ModelOpt NVFP4 form; on vLLM (0.33 has the model too: serving_tests/vllm/qwen4_exp_cpu.py) also NVFP4
    n-gram tables and the text class."""
    fmt = "nvfp4-modelopt-hf"  # NVFP4 tables where the release loads them (core/targets/engine_config.py)
    nvfp4_ple = source_load_refusal({}, key, ("layers.0.ple.ple_embedding.ngram_embedding.shard_0.weight_scale",)) is None
    draft = "serving_tests/test_draft_differential.py::test_plugin_draft_equals_the_engines_draft_of_the_source"
    multimodal = (_differential("qwen4-exp", fmt), _differential("qwen4-exp-nvfp4", fmt),
                  *((_differential("qwen4-exp-ple-nvfp4", fmt),) if nvfp4_ple else ()),
                  f"{draft}[qwen4-exp-{fmt}-bfloat16]")  # its BF16 MTP draft (MIXED_PRECISION)
    return (Served("qwen4-exp", fmt, key, frozenset({"modelopt_mixed", "modelopt_fp4"}), multimodal),
            *((Served("qwen4-exp-text", fmt, key, frozenset({"modelopt_mixed"}), (_differential("qwen4-exp-text", fmt),)),)
              if not _refused("qwen4-exp-text", fmt, key) else ()))


SERVED: tuple[Served, ...] = tuple(row for key in ENGINE_VERSIONS
                                   for row in (*_rows(key), *_hybrid_rows(key), *_qwen4_exp_rows(key)))


def entries(family: str | None = None, source_format: str | None = None, engine: str | None = None) -> list[Served]:
    """The entries matching every given field; `engine` is an engine name ("vllm") or a release key."""
    return [s for s in SERVED if (family is None or s.family == family)
            and (source_format is None or s.source_format == source_format)
            and (engine is None or engine in (s.engine, s.engine_name))]


def source_block(config: Mapping, hf_quant_config: Mapping | None) -> dict | None:
    """The source's quantisation block a conversion's non-expert layers are served from: config.json's
    `quantization_config`, and hf_quant_config.json when config.json has none (both engines) or a stale one (the
    converter then records `serves_from`: core/record/converted_config.py serving_block)."""
    qc = config.get("quantization_config")
    if isinstance(qc, dict) and not stale_block(qc, hf_quant_config):
        return qc
    return dict(hf_quant_config) if isinstance(hf_quant_config, Mapping) else None


def inner_method(engine: str, block: Mapping | None, model_type: str | None) -> str | None:
    return engine_inner_method(engine, dict(block) if isinstance(block, Mapping) else None, model_type)


def _proven(family: Family | None, fmt: str, engine: str) -> str:
    if family is None:
        return "nothing"
    rows = entries(family.name, engine=engine)
    if not rows:
        return f"no {engine} version for {family.name}"
    return "; ".join(f"{s.source_format} on {s.engine} with {'/'.join(sorted(s.methods))}" for s in rows)


def refusal(config: Mapping, source_format: str, engine: str, block: Mapping | None, *,
            method: str | None = None, tensor_names: Iterable[str] = ()) -> str | None:
    """Why the plugins of `engine` (a name, or an engine-version key) are not proven to serve a conversion of
    this source, or None when some entry proves it: its family, its source format and the method the engine
    builds for its non-expert layers from `block` (source_block; `method`: the one an installed engine answered,
    for doctor; `tensor_names`: the checkpoint's, for core/targets/engine_config.py). Convert, validate and doctor all
    ask this."""
    family = family_of(config)
    archs = config.get("architectures")
    if family is None:
        return (f"its architecture {archs!r} is in no model family dsv4-convert knows (core/sources/families.py FAMILIES), "
                "so no serving test has loaded it through the plugins")
    if why := source_load_refusal(config, engine, tensor_names):
        return f"{_engine_of(engine)} cannot build this source itself: {why}"
    model_type = config.get("model_type") if isinstance(config.get("model_type"), str) else None
    rows = entries(family.name, source_format, engine)
    engine_says = [r for r in REFUSED if r.family == family.name and r.source_format == source_format
                   and engine in (r.engine, _engine_of(r.engine))]
    if not rows and engine_says:
        return (f"{engine_says[0].engine} itself cannot serve a {family.name} {source_format} checkpoint through the "
                f"plugin: {engine_says[0].reason}")
    if not rows:
        return (f"no serving test loads a {family.name} checkpoint in {source_format} through the {engine} plugin "
                f"(proven for {family.name}: {_proven(family, source_format, engine)})")
    method = method or inner_method(_engine_of(engine), block, model_type)
    if any(method in s.methods for s in rows):
        return None
    return (f"{_engine_of(engine)} builds {method!r} for the non-expert layers of this {family.name} {source_format} "
            f"source (from its quantisation block), and the plugin was proven for it only with "
            f"{', '.join(sorted({m for s in rows for m in s.methods}))} ({', '.join(sorted({s.engine for s in rows}))})")
